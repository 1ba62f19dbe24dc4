"""The actor's batch of a mini-batch (every device): advantages from the scored rollouts, the old
log-probs the loss's ratio divides by, and the rollout-mismatch weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slurm_rl.data.schemas import ACTOR_BATCH
from slurm_rl.rl.advantages import (NEEDS_CRITIC, compute_advantages, compute_gae, compute_token_advantages,
                                      needs_token_advantages, token_level_rewards)
from slurm_rl.rl.formulas import LOG_RATIO_CLAMP, kl_estimate


def kl_per_token(old_logprobs: list[list[float]], ref_logprobs: list[list[float]], kind: str) -> list[np.ndarray]:
    """Per sample, the ``kind`` KL estimate of each response token between the policy's log-probs and
    the reference's (verl's ``apply_kl_penalty`` before it scales by the coefficient); empty where
    either is missing."""
    return [kl_estimate(np.asarray(old, np.float64), np.asarray(ref, np.float64), kind) if old and ref
            else np.zeros(0) for old, ref in zip(old_logprobs, ref_logprobs)]


def kl_in_reward(old_logprobs: list[list[float]], ref_logprobs: list[list[float]], kind: str) -> np.ndarray:
    """Per sample, the sum over its response of :func:`kl_per_token`."""
    return np.array([float(np.sum(k)) for k in kl_per_token(old_logprobs, ref_logprobs, kind)], np.float64)


def old_logprobs(inference: pa.Table) -> pa.ChunkedArray:
    """The policy's pre-update log-probs of each sampled token: the actor's where the inference
    ranks computed them (``algorithm.old_logprobs: actor``), else the rollout's."""
    actor = inference.column("old_logprobs")
    if actor.null_count == 0:
        return actor
    if actor.null_count == len(actor):
        return inference.column("sampled_logprobs")
    sampled = inference.column("sampled_logprobs").cast(actor.type)
    return pa.chunked_array([pc.if_else(pc.is_null(actor), sampled, actor)])


def importance_weights(proximal: list[list[float]], behaviour: list[list[float]], level: str = "token",
                       cap: float | None = None, mode: str = "truncate") -> list[np.ndarray]:
    """Per token (fp64), the importance weight of the proximal policy (the actor's pre-update log-probs) against the
    behaviour policy (the rollout's sampled log-probs), the log ratio clamped to [-20, 20] as verl clamps it:

    - ``level`` ``token``: ``w_t = exp(prox_t - behav_t)``; ``sequence``: ``w = exp(sum_t (prox_t - behav_t))`` on
      every token of the response (verl's ``rollout_correction.rollout_is``);
    - ``mode`` ``truncate`` (verl's truncated IS): ``min(w, cap)``; ``mask`` (AReaL's decoupled loss with
      ``behav_imp_weight_cap``): ``w`` where ``w <= cap``, else 0 (the token is left out). ``cap`` None: ``w``."""
    if level not in ("token", "sequence") or mode not in ("truncate", "mask"):
        raise ValueError(f"importance_weights: level {level!r} (token | sequence), mode {mode!r} (truncate | mask)")
    out = []
    for p, b in zip(proximal, behaviour):
        d = np.asarray(p, np.float64) - np.asarray(b, np.float64)
        if level == "sequence":
            d = np.full_like(d, d.sum())
        w = np.exp(np.clip(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        if cap is not None:
            w = np.minimum(w, cap) if mode == "truncate" else np.where(w <= cap, w, 0.0)
        out.append(w)
    return out


def rollout_is_weights(old: list[list[float]], sampled: list[list[float]], cap: float,
                       level: str = "token") -> list[list[float]]:
    """Per token, the truncated importance weight min(pi_actor / pi_rollout, cap) (verl's ``rollout_is`` with
    ``rollout_is_threshold`` = cap, token or sequence ``level``): corrects for the rollout engine sampling from a
    policy numerically different from (or older than) the one the actor trains."""
    return [w.astype(np.float32).tolist() for w in importance_weights(old, sampled, level, cap, "truncate")]


def behaviour_weights(proximal: list[list[float]], behaviour: list[list[float]], cap: float | None) -> list[list[float]]:
    """Per token, AReaL's behaviour importance weight of the decoupled loss: pi_proximal / pi_behaviour, 0 (the
    token left out) where it is above ``cap`` (``behav_imp_weight_cap``; None: never)."""
    return [w.astype(np.float32).tolist() for w in importance_weights(proximal, behaviour, "token", cap, "mask")]


def mismatch(old: list[list[float]], sampled: list[list[float]]) -> tuple[list[float], float]:
    """The rollout/actor mismatch of some responses: per response, the mean k3 estimate of
    KL(rollout || actor) over its tokens; and the largest |log pi_actor - log pi_rollout| of a token."""
    kls, worst = [], 0.0
    for a, r in zip(old, sampled):
        if a and r:
            d = np.asarray(a, np.float64) - np.asarray(r, np.float64)
            kls.append(float(np.mean(kl_estimate(np.asarray(r, np.float64), np.asarray(a, np.float64), "low_var_kl"))))
            worst = max(worst, float(np.max(np.abs(d))))
    return kls, worst


def _kl_coef(algorithm: Any, kl_coef: float | None) -> float:
    return float(algorithm.kl_ctrl.kl_coef if kl_coef is None else kl_coef)


def token_rewards(inference: pa.Table, algorithm: Any, kl_coef: float | None) -> list[np.ndarray]:
    """The token-level rewards verl builds: the reward on the last response token, less the KL
    coefficient times each token's KL under ``algorithm.use_kl_in_reward``."""
    lengths = pc.list_value_length(inference.column("response_ids")).to_numpy(zero_copy_only=False)
    reward = inference.column("reward").to_numpy().astype(np.float64)
    kl, coef = None, 0.0
    if getattr(algorithm, "use_kl_in_reward", False):
        kl = kl_per_token(old_logprobs(inference).to_pylist(), inference.column("ref_logprobs").to_pylist(),
                          algorithm.kl_penalty)
        coef = _kl_coef(algorithm, kl_coef)
    return token_level_rewards(reward, lengths, kl, coef)


def token_advantages(inference: pa.Table, name: str, algorithm: Any, kl_coef: float | None) -> list[np.ndarray]:
    """Per-token advantages (``algorithm.gamma < 1``, or a KL penalty per token in the reward) from
    :func:`token_rewards`."""
    return compute_token_advantages(name, token_rewards(inference, algorithm, kl_coef), algorithm)


def gae_advantages(inference: pa.Table, algorithm: Any, kl_coef: float | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """GAE's per-token (advantages, returns) from :func:`token_rewards` and the critic's ``values``."""
    values = inference.column("values")
    if values.null_count:
        raise ValueError(f"algorithm.adv_estimator 'gae': {values.null_count} of {len(values)} samples have no "
                         "critic values (the inference ranks, or the actor's leader, compute them)")
    return compute_gae(token_rewards(inference, algorithm, kl_coef), [np.asarray(v) for v in values.to_pylist()],
                       float(getattr(algorithm, "gamma", 1.0)), float(getattr(algorithm, "lam", 1.0)))


def scores(inference: pa.Table, algorithm: Any = None, kl_coef: float | None = None) -> np.ndarray:
    """What the estimator sees per sample: the reward, less ``kl_coef`` (default ``kl_ctrl.kl_coef``;
    the iteration's under an adaptive ``kl_ctrl``) times the response's KL (old log-probs against the
    reference's) under ``algorithm.use_kl_in_reward``."""
    reward = inference.column("reward").to_numpy().astype(np.float64)
    if not getattr(algorithm, "use_kl_in_reward", False):
        return reward
    kl = kl_in_reward(old_logprobs(inference).to_pylist(), inference.column("ref_logprobs").to_pylist(),
                      algorithm.kl_penalty)
    return reward - _kl_coef(algorithm, kl_coef) * kl


def make_actor_batch(inference: pa.Table, algorithm: Any = None, kl_coef: float | None = None) -> pa.Table:
    """ACTOR_BATCH of one cut mini-batch (whole groups): ``advantage`` by ``algorithm.adv_estimator``
    (:mod:`slurm_rl.rl.advantages`; GRPO with verl's defaults when ``algorithm`` is None) from
    :func:`scores`, or per token (``token_advantages``; ``advantage`` then holds their mean) where the
    estimator gives them (:func:`~slurm_rl.rl.advantages.needs_token_advantages`; ``gae`` also
    writes the critic's targets, ``returns``); the ``reward`` column keeps the reward itself."""
    name = getattr(algorithm, "adv_estimator", "grpo")
    per_token = pa.nulls(inference.num_rows, pa.list_(pa.float32()))
    returns = pa.nulls(inference.num_rows, pa.list_(pa.float32()))
    if needs_token_advantages(name, algorithm):
        if name in NEEDS_CRITIC:
            tokens, targets = gae_advantages(inference, algorithm, kl_coef)
            returns = pa.array([t.astype(np.float32) for t in targets], pa.list_(pa.float32()))
        else:
            tokens = token_advantages(inference, name, algorithm, kl_coef)
        adv = np.array([float(t.mean()) if len(t) else 0.0 for t in tokens], np.float32)  # for the metrics
        per_token = pa.array([t.astype(np.float32) for t in tokens], pa.list_(pa.float32()))
    else:
        lengths = pc.list_value_length(inference.column("response_ids")).to_numpy(zero_copy_only=False)
        adv = compute_advantages(name, scores(inference, algorithm, kl_coef), inference.column("group_id").to_numpy(),
                                 lengths, algorithm).astype(np.float32)
    old = old_logprobs(inference)
    weights = pa.nulls(inference.num_rows, pa.list_(pa.float32()))
    rollout_is = getattr(algorithm, "rollout_is", "none")
    if rollout_is != "none":  # the policy term of each token weighted (worker.real_compute): verl's rollout_is
        level = "token" if rollout_is == "truncated" else rollout_is
        weights = pa.array(rollout_is_weights(old.to_pylist(), inference.column("sampled_logprobs").to_pylist(),
                                              float(algorithm.rollout_is_cap), level), pa.list_(pa.float32()))
    elif getattr(algorithm, "use_decoupled_loss", False):  # AReaL's decoupled loss: the same place, masked weights
        weights = pa.array(behaviour_weights(old.to_pylist(), inference.column("sampled_logprobs").to_pylist(),
                                             algorithm.behav_imp_weight_cap), pa.list_(pa.float32()))
    return pa.table(
        {
            "sample_id": inference.column("sample_id"),
            "group_id": inference.column("group_id"),
            "prompt_ids": inference.column("prompt_ids"),
            "response_ids": inference.column("response_ids"),
            "old_logprobs": old,
            "ref_logprobs": inference.column("ref_logprobs"),
            "values": inference.column("values"),
            "rollout_is_weights": weights,
            "advantage": pa.array(adv),
            "token_advantages": per_token,
            "returns": returns,
            "reward": inference.column("reward"),
            "weight_version": inference.column("weight_version"),
            "weight_version_last": inference.column("weight_version_last"),
        },
        schema=ACTOR_BATCH,
    )
