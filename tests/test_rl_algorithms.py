"""Advantage estimators, policy loss, KL estimators and loss aggregation against verl's formulas.

The references below are verl's ``core_algos`` functions written out in torch on token-level
rewards (an outcome reward on the last response token), as verl runs them; ours work on one
reward per sample and must give the same advantage on every response token.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from slurm_rl.rl.advantages import (ADV_ESTIMATORS, compute_advantages, compute_token_advantages,
                                      estimator_problems, needs_token_advantages, token_level_rewards)
from slurm_rl.rl.losses import LossAggregation, PolicyLossConfig, kl_penalty, policy_diagnostics, policy_loss


class Algo:
    def __init__(self, **kw: object) -> None:
        self.adv_estimator = "grpo"
        self.norm_adv_by_std_in_grpo = True
        self.gamma = 1.0
        self.__dict__.update(kw)


# --- verl's formulas (verl/trainer/ppo/core_algos.py, verl/utils/torch_functional.py) ----------
def masked_mean(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (v * m).sum() / m.sum()


def masked_whiten(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    mean = masked_mean(v, m)
    var = masked_mean((v - mean) ** 2, m)
    var = var * (m.sum() / (m.sum() - 1))
    return (v - mean) * torch.rsqrt(var + 1e-8)


def verl_grpo(tlr: torch.Tensor, mask: torch.Tensor, index: list[int], norm: bool) -> torch.Tensor:
    scores = tlr.sum(-1)
    by = defaultdict(list)
    for i, k in enumerate(index):
        by[k].append(scores[i])
    mean, std = {}, {}
    for k, xs in by.items():
        if len(xs) == 1:
            mean[k], std[k] = torch.tensor(0.0, dtype=tlr.dtype), torch.tensor(1.0, dtype=tlr.dtype)
        else:
            mean[k], std[k] = torch.mean(torch.stack(xs)), torch.std(torch.stack(xs))
    out = scores.clone()
    for i, k in enumerate(index):
        out[i] = (scores[i] - mean[k]) / (std[k] + 1e-6) if norm else scores[i] - mean[k]
    return out.unsqueeze(-1) * mask


def verl_group_means(scores: torch.Tensor, index: list[int]) -> tuple[dict, dict]:
    """verl's id2score and id2mean (0 for a group of one), shared by RLOO and REINFORCE++-baseline."""
    by = defaultdict(list)
    for i, k in enumerate(index):
        by[k].append(scores[i])
    mean = {k: torch.tensor(0.0, dtype=scores.dtype) if len(xs) == 1 else torch.mean(torch.stack(xs))
            for k, xs in by.items()}
    return by, mean


def verl_rloo(tlr: torch.Tensor, mask: torch.Tensor, index: list[int]) -> torch.Tensor:
    scores = tlr.sum(-1)
    by, mean = verl_group_means(scores, index)
    out = scores.clone()
    for i, k in enumerate(index):
        n = len(by[k])
        if n > 1:
            out[i] = scores[i] * n / (n - 1) - mean[k] * n / (n - 1)
    return out.unsqueeze(-1) * mask


def verl_rpp(tlr: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    returns = torch.zeros_like(tlr)
    running = torch.zeros(tlr.shape[0], dtype=tlr.dtype)
    for t in reversed(range(tlr.shape[1])):
        running = tlr[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return masked_whiten(returns, mask) * mask


def verl_rpp_baseline(tlr: torch.Tensor, mask: torch.Tensor, index: list[int]) -> torch.Tensor:
    scores = tlr.sum(-1)
    _, mean = verl_group_means(scores, index)
    out = torch.stack([scores[i] - mean[k] for i, k in enumerate(index)])
    out = out.unsqueeze(-1).tile([1, tlr.shape[1]]) * mask
    return masked_whiten(out, mask) * mask


def outcome_batch(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, torch.Tensor, torch.Tensor]:
    """Groups of 4, 4 (all equal), 3 and 1 samples; response lengths 1..9; rewards on the last token."""
    rng = np.random.default_rng(seed)
    groups = np.array([7] * 4 + [3] * 4 + [11] * 3 + [5])
    rewards = rng.integers(0, 3, len(groups)).astype(np.float64) / 2
    rewards[4:8] = 0.5
    lengths = rng.integers(1, 10, len(groups))
    width = int(lengths.max())
    mask = torch.zeros(len(groups), width, dtype=torch.float64)
    tlr = torch.zeros(len(groups), width, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        tlr[i, n - 1] = rewards[i]
    return rewards, groups, lengths, tlr, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["grpo", "grpo-no-std", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_estimators_equal_verls_formulas(name: str, seed: int) -> None:
    rewards, groups, lengths, tlr, mask = outcome_batch(seed)
    index = groups.tolist()
    if name == "grpo":
        ref, algo = verl_grpo(tlr, mask, index, True), Algo()
    elif name == "grpo-no-std":
        ref, algo = verl_grpo(tlr, mask, index, False), Algo(norm_adv_by_std_in_grpo=False)
        name = "grpo"
    elif name == "rloo":
        ref, algo = verl_rloo(tlr, mask, index), Algo()
    elif name == "reinforce_plus_plus":
        ref, algo = verl_rpp(tlr, mask, 1.0), Algo()
    else:
        ref, algo = verl_rpp_baseline(tlr, mask, index), Algo()
    ours = compute_advantages(name, rewards, groups, lengths, algo)
    per_token = torch.from_numpy(ours).unsqueeze(-1) * mask
    # advantages are O(1): compare on that scale
    assert torch.allclose(per_token, ref, atol=1e-9), (per_token - ref).abs().max()


def test_grpo_uses_the_unbiased_std_and_leaves_equal_groups_at_zero() -> None:
    adv = compute_advantages("grpo", np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5]), np.array([0, 0, 0, 0, 1, 1]),
                             np.ones(6), Algo())
    s = math.sqrt(1 / 3)  # torch.std of [1, 0, 0, 1]
    assert np.allclose(adv[:4], np.array([0.5, -0.5, -0.5, 0.5]) / (s + 1e-6))
    assert np.array_equal(adv[4:], np.zeros(2))


def test_user_estimator_is_called_with_the_batch(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_adv.py").write_text(
        "import numpy as np\n"
        "def centred(rewards, groups, lengths, config):\n"
        "    return rewards - rewards.mean() + 0 * lengths\n"
        "def wrong(rewards, groups, lengths, config):\n"
        "    return rewards[:1]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert estimator_problems(Algo(adv_estimator="my_adv:centred")) == []
    out = compute_advantages("my_adv:centred", np.array([1.0, 3.0]), np.array([0, 0]), np.array([2, 2]), Algo())
    assert out.tolist() == [-1.0, 1.0]
    with pytest.raises(ValueError, match="returned .1,. values.*expected 2"):
        compute_advantages("my_adv:wrong", np.array([1.0, 3.0]), np.array([0, 0]), np.array([2, 2]), Algo())


def test_estimator_problems_name_the_key_and_what_is_allowed() -> None:
    [(key, value, allowed)] = estimator_problems(Algo(adv_estimator="ppo"))
    assert key == "algorithm.adv_estimator" and value == "ppo"
    assert all(n in allowed for n in ADV_ESTIMATORS)
    assert "gae" in allowed and estimator_problems(Algo(adv_estimator="gae")) == []  # PPO: trains a critic
    [(key, value, allowed)] = estimator_problems(Algo(adv_estimator="nosuchmodule_x:f"))
    assert "does not import" in allowed
    assert estimator_problems(Algo(adv_estimator="reinforce_plus_plus", gamma=0.99)) == []


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("gamma", "kl_in_reward"), [(0.9, False), (1.0, True), (0.5, True)])
def test_reinforce_plus_plus_per_token_equals_verls(gamma: float, kl_in_reward: bool, seed: int) -> None:
    """gamma < 1, or a KL penalty on every token in the reward: verl's returns differ token by token;
    ours, built from the same token-level rewards, equal them on every token."""
    rewards, groups, lengths, tlr, mask = outcome_batch(seed)
    kl = None
    if kl_in_reward:
        rng = np.random.default_rng(100 + seed)
        kl = [rng.uniform(-0.5, 1.0, n) for n in lengths]
        for i, k in enumerate(kl):
            tlr[i, :len(k)] -= 0.2 * torch.from_numpy(k)  # verl: token_level_scores - beta * kld
    algo = Algo(adv_estimator="reinforce_plus_plus", gamma=gamma, use_kl_in_reward=kl_in_reward)
    assert needs_token_advantages("reinforce_plus_plus", algo)
    assert not needs_token_advantages("grpo", algo) and not needs_token_advantages("reinforce_plus_plus", Algo())
    ours = compute_token_advantages("reinforce_plus_plus", token_level_rewards(rewards, lengths, kl, 0.2), algo)
    ref = verl_rpp(tlr, mask, gamma)
    assert [len(a) for a in ours] == lengths.tolist()
    for i, a in enumerate(ours):  # advantages are O(1): compare on that scale
        assert np.allclose(a, ref[i, :len(a)].numpy(), atol=1e-9), (i, a, ref[i])
    assert len({round(float(x), 9) for x in ours[int(np.argmax(lengths))]}) > 1  # not one number per sample
    with pytest.raises(ValueError, match="per-token advantages"):
        compute_advantages("reinforce_plus_plus", rewards, groups, lengths, algo)
    with pytest.raises(ValueError, match="one advantage per sample"):
        compute_token_advantages("grpo", token_level_rewards(rewards, lengths), algo)


def verl_vanilla(lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, low: float, high: float,
                 c: float) -> torch.Tensor:
    ratio = torch.exp(torch.clamp(lp - old, -20.0, 20.0))
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - low, 1 + high)
    c1 = torch.maximum(l1, l2)
    l3 = -adv * c
    c2 = torch.min(l3, c1)
    return torch.where(adv < 0, c2, c1)


def test_vanilla_policy_loss_clips_like_verl_with_clip_higher_and_dual_clip() -> None:
    old = torch.zeros(1, 6)
    ratios = torch.tensor([[1.5, 0.5, 1.5, 0.5, 5.0, 1.1]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -2.0, 1.0]])
    lp = torch.log(ratios).requires_grad_()
    cfg = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    loss, clipped = policy_loss("vanilla")(lp, old, adv, cfg)
    # token 0: min(1.5, 1.28) -> clipped high at 1.28; token 1: 0.5 (not clipped); token 2: -1.5;
    # token 3: clipped low at -0.8; token 4: ratio 5 with A < 0 -> dual clip at -A * 3 = 6; token 5: 1.1
    assert loss.detach().tolist()[0] == pytest.approx([-1.28, -0.5, 1.5, 0.8, 6.0, -1.1])
    assert clipped.tolist() == [[True, False, False, True, True, False]]
    ref = verl_vanilla(lp.detach(), old, adv, 0.2, 0.28, 3.0)
    assert torch.allclose(loss.detach(), ref)
    loss.sum().backward()
    g = lp.grad[0]
    assert g[0] == 0 and g[3] == 0 and g[4] == 0  # clipped tokens give no gradient
    assert g[1] == pytest.approx(-0.5) and g[2] == pytest.approx(1.5) and g[5] == pytest.approx(-1.1)
    # verl's metrics of the same loss, per token (its compute_policy_loss takes their masked means)
    diag = policy_diagnostics(lp, old, adv, cfg)
    l1, l2 = -adv * ratios, -adv * torch.clamp(ratios, 0.8, 1.28)
    assert diag["pg_clipfrac"].tolist() == torch.gt(l2, l1).float().tolist() == [[1.0, 0, 0, 1.0, 0, 0]]
    lower = torch.gt(torch.maximum(l1, l2), -adv * 3.0).float() * (adv < 0).float()
    assert diag["pg_clipfrac_lower"].tolist() == lower.tolist() == [[0, 0, 0, 0, 1.0, 0]]
    assert torch.allclose(diag["ppo_kl"], -(lp.detach() - old)) and not diag["ppo_kl"].requires_grad


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "low_var_kl"])
def test_kl_types_against_their_formulas(kind: str) -> None:
    lp = torch.log(torch.tensor([[0.5, 0.2, 0.9]])).requires_grad_()
    ref = torch.log(torch.tensor([[0.25, 0.2, 0.3]]))
    d = (lp - ref).detach()
    expected = {"k1": d, "abs": d.abs(), "k2": 0.5 * d ** 2,
                "low_var_kl": torch.exp(-d) + d - 1}[kind]
    kl = kl_penalty(lp, ref, kind)
    assert torch.allclose(kl.detach(), expected)
    assert kl[0, 1].item() == 0.0
    kl.sum().backward()
    grad = {"k1": torch.ones(3), "abs": torch.sign(d[0]), "k2": d[0], "low_var_kl": 1 - torch.exp(-d[0])}[kind]
    assert torch.allclose(lp.grad[0], grad, atol=1e-6)
    with pytest.raises(ValueError, match="kl_loss_type 'k9'"):
        kl_penalty(lp, ref, "k9")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_is_split_invariant_and_means_what_it_says(mode: str) -> None:
    torch.manual_seed(0)
    loss = torch.randn(6, 5)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    mask = (torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)).float()
    agg = LossAggregation(mode, horizon=8)
    denom = agg.denominator(float(mask.sum()), 6.0)

    def total(chunks: list[slice]) -> float:
        return sum(float((loss[s] * agg.weights(mask[s])).sum()) for s in chunks) / denom

    whole = total([slice(0, 6)])
    assert whole == pytest.approx(total([slice(0, 2), slice(2, 3), slice(3, 6)]), abs=1e-6)
    per_seq_sum = (loss * mask).sum(-1)
    expected = {"token-mean": per_seq_sum.sum() / mask.sum(), "seq-mean-token-sum": per_seq_sum.mean(),
                "seq-mean-token-mean": (per_seq_sum / lengths).mean(),
                "seq-mean-token-sum-norm": per_seq_sum.sum() / (6 * 8)}[mode]
    assert whole == pytest.approx(float(expected), abs=1e-6)


def test_aggregation_refuses_unknown_modes() -> None:
    with pytest.raises(ValueError, match="loss_agg_mode 'mean'"):
        LossAggregation("mean")
    with pytest.raises(ValueError, match="horizon"):
        LossAggregation("seq-mean-token-sum-norm")


def _step_loss(lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, agg: LossAggregation,
               ref: torch.Tensor | None = None, kl_coef: float = 0.0, kl_type: str = "low_var_kl",
               cfg: PolicyLossConfig = PolicyLossConfig()) -> torch.Tensor:
    """The step loss as the trainer forms it: weighted per-token losses over the step's denominator."""
    per_token, _ = policy_loss("vanilla")(lp, old, adv, cfg)
    if kl_coef:
        per_token = per_token + kl_coef * kl_penalty(lp, ref, kl_type)
    denom = agg.denominator(float(mask.sum()), float((mask.sum(-1) > 0).sum()))
    return (per_token * agg.weights(mask)).sum() / denom


def test_on_policy_loss_is_minus_the_mean_advantage_and_its_gradient_the_score() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    loss = _step_loss(lp, lp.detach(), adv, mask, LossAggregation())
    assert loss.item() == pytest.approx(-(2 + 2 - 1) / 3)  # ratio 1 everywhere
    loss.backward()
    # d/dlp of -ratio * A / N at ratio 1 is -A / N on masked tokens
    assert torch.allclose(lp.grad, torch.tensor([[-2 / 3, -2 / 3, 0.0], [1 / 3, 0.0, 0.0]]))


def test_kl_loss_enters_with_its_weight() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.2]]))
    ref = torch.log(torch.tensor([[0.25, 0.2]]))
    kl = kl_penalty(lp, ref, "low_var_kl")
    assert kl[0, 0].item() == pytest.approx(0.5 - math.log(0.5) - 1)
    loss = _step_loss(lp, lp, torch.zeros(1), torch.ones(1, 2), LossAggregation(), ref=ref, kl_coef=0.1)
    assert loss.item() == pytest.approx(0.1 * kl.sum().item() / 2)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_step_gradient_does_not_depend_on_the_micro_batch_split(mode: str) -> None:
    torch.manual_seed(0)
    lp = torch.randn(6, 5)
    old = lp + 0.1 * torch.randn(6, 5)
    ref = lp + 0.1 * torch.randn(6, 5)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    mask = (torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)).float()
    adv = torch.from_numpy(compute_advantages("grpo", np.array([1.0, 0.0, 0.2, 0.9, 0.4, 0.3]),
                                              np.array([0, 0, 0, 1, 1, 1]), lengths.numpy(), Algo())).float()
    agg = LossAggregation(mode)
    denom = agg.denominator(float(mask.sum()), 6.0)

    def grad(chunks: list[slice]) -> torch.Tensor:
        p = lp.clone().requires_grad_()
        for s in chunks:
            per_token, _ = policy_loss("vanilla")(p[s], old[s], adv[s], PolicyLossConfig())
            per_token = per_token + 0.05 * kl_penalty(p[s], ref[s], "low_var_kl")
            ((per_token * agg.weights(mask[s])).sum() / denom).backward()
        return p.grad

    assert torch.allclose(grad([slice(0, 6)]), grad([slice(0, 2), slice(2, 3), slice(3, 6)]), atol=1e-6)


@pytest.mark.parametrize("kind", ["kl", "low_var_kl"])
def test_kl_in_reward_is_verls_penalty_summed_per_response(kind: str) -> None:
    import pyarrow as pa

    from slurm_rl.data.actor_batch import scores

    rewards, groups, lengths, tlr, mask = outcome_batch(4)
    rng = np.random.default_rng(5)
    old = [(-rng.random(n)).tolist() for n in lengths]
    ref = [(-rng.random(n)).tolist() for n in lengths]
    # verl penalises the recomputed old log-probs: the actor's column, not the rollout's
    sampled = [(np.asarray(o) - 0.5).tolist() for o in old]
    table = pa.table({"reward": rewards, "sampled_logprobs": sampled, "old_logprobs": old, "ref_logprobs": ref})
    algo = Algo(use_kl_in_reward=True, kl_penalty=kind)
    algo.kl_ctrl = Algo(type="fixed", kl_coef=0.1)
    # verl's apply_kl_penalty: token_level_rewards = token_level_scores - beta * kl_penalty(old, ref) * mask
    old_t, ref_t = torch.zeros_like(mask), torch.zeros_like(mask)
    for i, n in enumerate(lengths):
        old_t[i, :n], ref_t[i, :n] = torch.tensor(old[i], dtype=torch.float64), torch.tensor(ref[i], dtype=torch.float64)
    penalised = tlr - 0.1 * kl_penalty(old_t, ref_t, kind) * mask
    ours = compute_advantages("grpo", scores(table, algo), groups, lengths, algo)
    assert torch.allclose(torch.from_numpy(ours).unsqueeze(-1) * mask, verl_grpo(penalised, mask, groups.tolist(), True),
                          atol=1e-9)
    assert np.array_equal(scores(table, Algo()), rewards)  # off by default: the reward as it is


def test_old_logprobs_are_the_actors_where_scored_else_the_rollouts() -> None:
    import pyarrow as pa

    from slurm_rl.data.actor_batch import old_logprobs

    sampled, actor = [[-1.0, -2.0], [-3.0]], [[-1.1, -2.1], None]
    t = pa.table({"sampled_logprobs": sampled, "old_logprobs": pa.array(actor, pa.list_(pa.float32()))})
    assert old_logprobs(t).to_pylist() == [pytest.approx([-1.1, -2.1]), [-3.0]]
    none = pa.table({"sampled_logprobs": sampled, "old_logprobs": pa.nulls(2, pa.list_(pa.float32()))})
    assert old_logprobs(none).to_pylist() == sampled


def test_rollout_is_weights_and_mismatch_are_verls_token_level_truncation() -> None:
    from slurm_rl.data.actor_batch import mismatch, rollout_is_weights

    rng = np.random.default_rng(9)
    lengths = [5, 1, 8]
    rollout = [(-rng.random(n) * 3).tolist() for n in lengths]
    actor = [(np.asarray(r) + rng.normal(0, 0.8, len(r))).tolist() for r in rollout]
    got = rollout_is_weights(actor, rollout, cap=2.0)
    for a, r, w in zip(actor, rollout, got):
        # verl: exp(clamp(old_log_prob - rollout_log_prob, -20, 20)).clamp(max=rollout_is_threshold)
        want = torch.exp(torch.clamp(torch.tensor(a) - torch.tensor(r), -20, 20)).clamp(max=2.0)
        assert torch.allclose(torch.tensor(w), want, atol=1e-6)
    assert max(max(w) for w in got) == pytest.approx(2.0)  # some tokens were truncated
    kls, worst = mismatch(actor, rollout)
    d = [np.asarray(a) - np.asarray(r) for a, r in zip(actor, rollout)]
    assert worst == pytest.approx(max(float(np.max(np.abs(x))) for x in d))
    # k3 of KL(rollout || actor) with samples from the rollout: ratio = pi_actor / pi_rollout
    assert kls == pytest.approx([float(np.mean(np.exp(x) - 1 - x)) for x in d])
    assert mismatch(rollout, rollout) == ([0.0, 0.0, 0.0], 0.0)


def test_rollout_is_weights_scale_the_policy_term_of_each_token_only() -> None:
    """The actor's loss (worker.real_compute): the per-token policy loss times the token's weight,
    the KL term unweighted (verl weighs pg_losses only); the weights placed on the response tokens."""
    from types import SimpleNamespace

    from slurm_rl.config import AlgorithmSection
    from slurm_rl.worker.real_compute import RealCompute

    row = {"prompt_ids": [1, 2], "response_ids": [3, 4, 5], "old_logprobs": [-1.0, -2.0, -0.5],
           "ref_logprobs": [-1.2, -1.8, -0.4], "advantage": 0.7, "rollout_is_weights": [0.5, 1.0, 2.0]}
    sample = RealCompute._sample(row)
    assert sample["rollout_is_weights"] == [0.0, 0.5, 1.0, 2.0]  # next-token layout: the prompt's last target first
    plain = RealCompute._sample({**row, "rollout_is_weights": None})
    assert "rollout_is_weights" not in plain
    algo = AlgorithmSection(kl_coef=0.1)
    loss, _ = RealCompute._loss(SimpleNamespace(algorithm=algo, horizon=8))
    batch = {key: torch.tensor([value]) for key, value in sample.items() if key != "input_ids"}
    logprobs = torch.tensor([[0.0, -0.9, -2.2, -0.45]])
    weighted, diagnostics = loss(logprobs, batch)
    unweighted, _ = loss(logprobs, {k: v for k, v in batch.items() if k != "rollout_is_weights"})
    assert sorted(diagnostics) == ["actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"]
    pg, _ = policy_loss("vanilla")(logprobs, batch["old_logprobs"], batch["advantages"],
                                   PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0))
    kl = 0.1 * kl_penalty(logprobs, batch["ref_logprobs"], "low_var_kl")
    assert torch.allclose(unweighted, pg + kl, atol=1e-7)
    assert torch.allclose(weighted, pg * batch["rollout_is_weights"] + kl, atol=1e-7)


def test_overlong_penalties_are_verls_dapo_shaping() -> None:
    from slurm_rl.rewards.overlong import overlong_penalties

    def verl(valid_response_length: int, max_resp_len: int, overlong_buffer_len: int, penalty_factor: float) -> float:
        # verl DAPORewardManager: expected_len = max_resp_len - overlong_buffer_len; exceed_len = ...
        expected_len = max_resp_len - overlong_buffer_len
        exceed_len = valid_response_length - expected_len
        return min(-exceed_len / overlong_buffer_len * penalty_factor, 0)

    lengths = [0, 5, 12, 13, 16, 20]
    assert overlong_penalties(lengths, 20, 8, 1.5) == [verl(n, 20, 8, 1.5) for n in lengths]
    assert overlong_penalties([12, 20], 20, 8, 1.0) == [0.0, -1.0]  # none up to 12 tokens, -factor at the limit


def test_overlong_buffer_keys_are_checked() -> None:
    from slurm_rl.config import ConfigError, config_from_mapping

    base = {"runtime": {"device": "emulated"},
            "cluster": {"num_nodes": 1, "gpus_per_node": 4,
                        "component_placement": {"actor": "0", "rollout": "1-2", "inference": "3"}}}
    ok = config_from_mapping({**base, "reward": {"overlong_buffer": {"enable": True, "len": 64}}})
    assert ok.reward.overlong_buffer.len == 64 and ok.reward.overlong_buffer.penalty_factor == 1.0
    with pytest.raises(ConfigError) as err:
        config_from_mapping({**base, "rollout": {"max_new_tokens": 32},
                             "reward": {"overlong_buffer": {"enable": True, "len": 64, "penalty_factor": -1}}})
    text = str(err.value)
    assert "reward.overlong_buffer.len: got 64; allowed: an int in [1, rollout.max_new_tokens = 32]" in text
    assert "reward.overlong_buffer.penalty_factor: got -1" in text


def test_adaptive_kl_ctrl_is_verls_controller_and_resumes_from_the_metrics() -> None:
    from types import SimpleNamespace

    from slurm_rl.rl.kl_ctrl import adaptive_update, kl_coef_of_iteration

    class VerlAdaptiveKLController:  # verl.trainer.ppo.core_algos.AdaptiveKLController
        def __init__(self, init_kl_coef, target_kl, horizon):
            self.value, self.target, self.horizon = init_kl_coef, target_kl, horizon

        def update(self, current_kl, n_steps):
            proportional_error = np.clip(current_kl / self.target - 1, -0.2, 0.2)
            self.value *= 1 + proportional_error * n_steps / self.horizon

    verl = VerlAdaptiveKLController(0.05, 0.02, 64)
    ctrl = SimpleNamespace(type="adaptive", kl_coef=0.05, target_kl=0.02, horizon=64)
    rows, kls = [], [0.001, 0.019, 0.021, 0.5, 0.0]
    for k, kl in enumerate(kls):
        coef = kl_coef_of_iteration(rows, k, ctrl)
        assert coef == pytest.approx(verl.value, rel=1e-12)
        rows.append({"iteration": k, "samples": 16, "kl_ctrl/kl_coef": coef, "kl_ctrl/current_kl": kl})
        verl.update(kl, 16)
    assert adaptive_update(1.0, 1.0, 10, 0.1, 10) == pytest.approx(1.2)  # the error is clipped at +20%
    fixed = SimpleNamespace(type="fixed", kl_coef=0.05)
    assert kl_coef_of_iteration(rows, 3, fixed) == 0.05
    with pytest.raises(LookupError, match="iteration 6"):
        kl_coef_of_iteration(rows, 7, ctrl)


def test_actor_batch_carries_per_token_advantages_into_the_trainers_layout() -> None:
    """REINFORCE++ with gamma 0.9 and the k1 KL in the reward: the actor batch's ``token_advantages``
    are verl's, built from the batch's own rewards and log-probs (its ``advantage`` their mean); the
    trainer sample holds them at the response's next-token positions. GRPO's batch carries none."""
    from types import SimpleNamespace

    from slurm_rl.data.actor_batch import make_actor_batch
    from slurm_rl.data.emulated import make_fake_inference, make_fake_prompts, make_fake_rollouts
    from slurm_rl.worker.real_compute import RealCompute

    inference = make_fake_inference(make_fake_rollouts(make_fake_prompts(2, 3, (4, 9), seed=0), 4, (1, 12), seed=1))
    algo = Algo(adv_estimator="reinforce_plus_plus", gamma=0.9, use_kl_in_reward=True, kl_penalty="k1",
                kl_ctrl=SimpleNamespace(kl_coef=0.05))
    batch = make_actor_batch(inference, algo).to_pylist()
    responses = [row["response_ids"] for row in batch]
    width = max(map(len, responses))
    mask = torch.zeros(len(batch), width, dtype=torch.float64)
    tlr = torch.zeros(len(batch), width, dtype=torch.float64)
    for i, row in enumerate(batch):
        n = len(row["response_ids"])
        mask[i, :n] = 1
        tlr[i, :n] = -0.05 * (torch.tensor(row["old_logprobs"], dtype=torch.float64)
                              - torch.tensor(row["ref_logprobs"], dtype=torch.float64))  # verl: - beta * kld (k1)
        tlr[i, n - 1] += row["reward"]
    ref = verl_rpp(tlr, mask, 0.9)
    for i, row in enumerate(batch):
        n = len(row["response_ids"])
        assert np.allclose(row["token_advantages"], ref[i, :n].numpy(), atol=1e-6)  # float32 of O(1) values
        assert row["advantage"] == pytest.approx(float(ref[i, :n].mean()), abs=1e-6)
    row = batch[0]
    sample = RealCompute._sample(row)
    start = len(row["prompt_ids"]) - 1
    assert sample["advantages"][start:start + len(row["response_ids"])] == row["token_advantages"]
    assert sum(abs(a) for a in sample["advantages"][:start]) == 0 and len(sample["advantages"]) == len(sample["loss_mask"])
    assert all(r["token_advantages"] is None for r in make_actor_batch(inference, Algo()).to_pylist())
