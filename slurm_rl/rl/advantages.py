"""Advantage estimators by name (``algorithm.adv_estimator``), computed as verl's ``core_algos`` computes them.

Each estimator maps one cut mini-batch of scored samples to one advantage per sample (numpy,
float64). Our rewards are outcome rewards (one per response, on its last token), so with
``gamma = 1`` every estimator here gives each response token the same advantage and one number per
sample is the whole result:

- ``grpo``: ``(r - mean_g) / (std_g + 1e-6)`` per group (``std`` unbiased, as ``torch.std``; a
  group of one sample has mean 0 and std 1); ``norm_adv_by_std_in_grpo: false`` keeps ``r - mean_g``
  (Dr. GRPO).
- ``rloo``: ``n / (n - 1) * (r - mean_g)``, the reward minus the mean of the other samples of its
  group (a group of one keeps its reward).
- ``reinforce_plus_plus``: the discounted return per token (``gamma``), whitened over every response
  token of the batch. With ``gamma = 1`` and no KL in the reward that is one number per sample; with
  ``gamma < 1`` or ``algorithm.use_kl_in_reward`` (a KL penalty on every token) the returns differ
  from token to token: :func:`needs_token_advantages` says so and :func:`compute_token_advantages`
  gives one array per sample (the actor batch's ``token_advantages``).
- ``reinforce_plus_plus_baseline``: ``r - mean_g``, then whitened over every response token of the
  batch.
- ``gae`` (PPO with a critic): per token ``delta_t = r_t + gamma * V_{t+1} - V_t`` (``V`` after the
  last response token is 0), ``A_t = delta_t + gamma * lam * A_{t+1}``; the returns ``A_t + V_t``
  are the critic's targets and the advantages are whitened over every response token of the batch
  (verl's ``compute_gae_advantage_return``). ``V`` are the critic's values of the iteration's start
  (the ``values`` column): :func:`compute_gae` gives one array per sample of each.

Whitening (verl's ``masked_whiten``): ``(x - mean) / sqrt(var + 1e-8)`` with the token-weighted
mean and the unbiased token-weighted variance. verl whitens over the whole iteration batch; here
the batch is the mini-batch the cutter hands to the actor (whole groups, ``train.global_batch_size``
samples), the unit in which advantages can be computed while rollouts stream in.

A user estimator is ``package.module:function`` (as ``reward.fn``), called as
``function(rewards, groups, response_lengths, config)`` with numpy arrays and the ``algorithm``
section, returning one advantage per sample. Estimators register with :func:`register_adv_est`
(verl's name).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["ADV_ESTIMATORS", "AdvantageFn", "adv_estimator", "compute_advantages", "compute_gae",
           "compute_token_advantages", "discounted_returns", "estimator_problems", "needs_critic",
           "needs_token_advantages", "register_adv_est", "token_level_rewards", "whiten"]

AdvantageFn = Callable[[np.ndarray, np.ndarray, np.ndarray, Any], np.ndarray]
"""``(rewards, groups, response_lengths, algorithm config) -> advantages``, one per sample."""

GRPO_EPS = 1e-6
WHITEN_EPS = 1e-8
NEEDS_CRITIC = ("gae",)
"""Estimators that read the critic's values (the run trains a critic on the actor's ranks)."""
FN_FORM = "'package.module:function' (rewards, groups, response_lengths, config) -> advantages"

ADV_ESTIMATORS: dict[str, AdvantageFn] = {}


def register_adv_est(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an estimator under ``name`` (the value of ``algorithm.adv_estimator``)."""

    def add(fn: AdvantageFn) -> AdvantageFn:
        ADV_ESTIMATORS[name] = fn
        return fn

    return add


def _group_stats(rewards: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample: its group's mean (0 for a group of one), unbiased std (1 for a group of one), size."""
    _, inv, counts = np.unique(groups, return_inverse=True, return_counts=True)
    mean = np.bincount(inv, rewards) / counts
    std = np.sqrt(np.bincount(inv, (rewards - mean[inv]) ** 2) / np.maximum(counts - 1, 1))
    alone = counts == 1
    return np.where(alone, 0.0, mean)[inv], np.where(alone, 1.0, std)[inv], counts[inv]


def whiten(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """verl's ``masked_whiten`` of a value per sample repeated over its ``lengths`` response tokens."""
    weights = lengths.astype(np.float64)
    n = weights.sum()
    if n < 2:
        raise ValueError(f"whitening needs at least 2 response tokens in the batch, got {n:.0f}")
    mean = (values * weights).sum() / n
    var = ((values - mean) ** 2 * weights).sum() / n * (n / (n - 1))
    return (values - mean) / np.sqrt(var + WHITEN_EPS)


@register_adv_est("grpo")
def grpo(rewards: np.ndarray, groups: np.ndarray, lengths: np.ndarray, config: Any) -> np.ndarray:
    mean, std, _ = _group_stats(rewards, groups)
    if getattr(config, "norm_adv_by_std_in_grpo", True):
        return (rewards - mean) / (std + GRPO_EPS)
    return rewards - mean


@register_adv_est("rloo")
def rloo(rewards: np.ndarray, groups: np.ndarray, lengths: np.ndarray, config: Any) -> np.ndarray:
    mean, _, n = _group_stats(rewards, groups)
    scale = n / np.maximum(n - 1, 1)
    return np.where(n > 1, rewards * scale - mean * scale, rewards)


@register_adv_est("reinforce_plus_plus")
def reinforce_plus_plus(rewards: np.ndarray, groups: np.ndarray, lengths: np.ndarray, config: Any) -> np.ndarray:
    if needs_token_advantages("reinforce_plus_plus", config):
        raise ValueError(f"reinforce_plus_plus: gamma {getattr(config, 'gamma', 1.0)} or a KL in the reward gives "
                         "per-token advantages: use compute_token_advantages")
    return whiten(rewards.astype(np.float64), lengths)


@register_adv_est("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(rewards: np.ndarray, groups: np.ndarray, lengths: np.ndarray,
                                 config: Any) -> np.ndarray:
    mean, _, _ = _group_stats(rewards, groups)
    return whiten(rewards - mean, lengths)


def adv_estimator(name: str) -> AdvantageFn:
    """The estimator named ``name``: a registered one or ``package.module:function``."""
    if name in ADV_ESTIMATORS:
        return ADV_ESTIMATORS[name]
    from slurm_rl.rewards.loader import import_reward

    return import_reward(name)


def estimator_problems(algorithm: Any) -> list[tuple[str, Any, str]]:
    """What is wrong with ``algorithm.adv_estimator`` and its options, as (key, value, allowed)."""
    name = getattr(algorithm, "adv_estimator", "grpo")
    allowed = f"one of {', '.join([*ADV_ESTIMATORS, *NEEDS_CRITIC])}, or {FN_FORM}"
    if not isinstance(name, str):
        return [("algorithm.adv_estimator", name, allowed)]
    if name not in ADV_ESTIMATORS and name not in NEEDS_CRITIC:
        from slurm_rl.rewards.loader import FN_RE, cwd_on_sys_path

        if not FN_RE.match(name):
            return [("algorithm.adv_estimator", name, allowed)]
        cwd_on_sys_path()
        try:
            adv_estimator(name)
        except Exception as exc:  # noqa: BLE001 - any import failure is the user's to see
            return [("algorithm.adv_estimator", name, f"{FN_FORM}; it does not import: {type(exc).__name__}: {exc}")]
    return []


def compute_advantages(name: str, rewards: np.ndarray, groups: np.ndarray, lengths: np.ndarray,
                       config: Any) -> np.ndarray:
    """Advantages of one mini-batch by the estimator ``name``, checked: one finite number per sample."""
    out = np.asarray(adv_estimator(name)(np.asarray(rewards, np.float64), np.asarray(groups),
                                         np.asarray(lengths), config), dtype=np.float64)
    if out.shape != (len(rewards),) or not np.all(np.isfinite(out)):
        raise ValueError(f"algorithm.adv_estimator {name!r} returned {out.shape} values "
                         f"({'finite' if np.all(np.isfinite(out)) else 'not all finite'}); expected "
                         f"{len(rewards)} finite advantages, one per sample")
    return out


TOKEN_LEVEL = ("reinforce_plus_plus",)
"""Estimators whose advantage may differ between the tokens of a response (from ``gamma`` or a
per-token KL penalty in the reward); the others use the response's summed reward, as verl's do."""


def needs_critic(algorithm: Any) -> bool:
    """Whether ``algorithm``'s estimator reads a critic's values (``gae``: PPO with a critic)."""
    return getattr(algorithm, "adv_estimator", "grpo") in NEEDS_CRITIC


def needs_token_advantages(name: str, algorithm: Any) -> bool:
    """Whether ``name`` under ``algorithm`` gives per-token advantages (else one per sample)."""
    return name in NEEDS_CRITIC or name in TOKEN_LEVEL and (float(getattr(algorithm, "gamma", 1.0)) != 1.0
                                    or bool(getattr(algorithm, "use_kl_in_reward", False)))


def token_level_rewards(rewards: np.ndarray, lengths: np.ndarray, kl: list[np.ndarray] | None = None,
                        kl_coef: float = 0.0) -> list[np.ndarray]:
    """verl's ``token_level_rewards`` per sample: the outcome reward on the last response token, less
    ``kl_coef`` times each token's KL estimate (``kl``, one array per sample) when given."""
    out = []
    for i, n in enumerate(np.asarray(lengths, dtype=np.int64)):
        r = np.zeros(int(n), np.float64)
        if n:
            r[-1] = float(rewards[i])
        if kl is not None:
            r -= kl_coef * np.asarray(kl[i], np.float64)[:n]
        out.append(r)
    return out


def discounted_returns(token_rewards: list[np.ndarray], gamma: float) -> list[np.ndarray]:
    """Per token, ``sum_k>=t gamma**(k-t) r_k`` over the response (verl's REINFORCE++ returns)."""
    out = []
    for r in token_rewards:
        g = np.zeros_like(r)
        running = 0.0
        for t in range(len(r) - 1, -1, -1):
            running = r[t] + gamma * running
            g[t] = running
        out.append(g)
    return out


def whiten_tokens(per_sample: list[np.ndarray]) -> list[np.ndarray]:
    """Per-token values of one mini-batch whitened over every response token of it (verl's
    ``masked_whiten``), one array per sample as given."""
    flat = np.concatenate(per_sample) if per_sample else np.zeros(0)
    whitened = whiten(flat, np.ones(len(flat), np.int64))
    out, start = [], 0
    for a in per_sample:
        out.append(whitened[start:start + len(a)])
        start += len(a)
    return out


def compute_token_advantages(name: str, token_rewards: list[np.ndarray], config: Any) -> list[np.ndarray]:
    """Per-token advantages of one mini-batch by a :data:`TOKEN_LEVEL` estimator: REINFORCE++'s
    discounted returns whitened over every response token of the batch (verl's ``masked_whiten``)."""
    if name not in TOKEN_LEVEL:
        raise ValueError(f"algorithm.adv_estimator {name!r} gives one advantage per sample, not per token")
    out = whiten_tokens(discounted_returns(token_rewards, float(getattr(config, "gamma", 1.0))))
    if not all(np.all(np.isfinite(a)) for a in out):
        raise ValueError(f"algorithm.adv_estimator {name!r} gave advantages that are not all finite")
    return out


def compute_gae(token_rewards: list[np.ndarray], values: list[np.ndarray], gamma: float, lam: float
                ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """verl's ``compute_gae_advantage_return`` per sample of one mini-batch: (advantages whitened over
    every response token of the batch, returns ``A + V`` unwhitened), one array per sample each."""
    raw: list[np.ndarray] = []
    returns: list[np.ndarray] = []
    for r, v in zip(token_rewards, values):
        v = np.asarray(v, np.float64)
        if len(v) != len(r):
            raise ValueError(f"gae: {len(v)} values for a response of {len(r)} tokens")
        adv = np.zeros(len(r), np.float64)
        last, next_value = 0.0, 0.0
        for t in range(len(r) - 1, -1, -1):
            last = r[t] + gamma * next_value - v[t] + gamma * lam * last
            next_value = v[t]
            adv[t] = last
        raw.append(adv)
        returns.append(adv + v)
    out = whiten_tokens(raw)
    if not all(np.all(np.isfinite(a)) for a in out + returns):
        raise ValueError("algorithm.adv_estimator 'gae' gave advantages or returns that are not all finite")
    return out, returns
