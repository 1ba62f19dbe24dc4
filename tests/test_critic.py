"""PPO with a critic (``algorithm.adv_estimator: gae``): GAE and the clipped value loss against verl's
formulas, the actor batch's advantages and returns, and the critic engine (megatron-core with a value
head) against its transformers twin, through training, a checkpoint and a DP change."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from slurm_rl.rl.advantages import compute_gae, estimator_problems, needs_critic, needs_token_advantages
from slurm_rl.rl.losses import LossAggregation, value_loss
from test_rl_algorithms import Algo, masked_mean, masked_whiten, outcome_batch


# --- verl's formulas (verl/trainer/ppo/core_algos.py) ------------------------------------------
def verl_gae(tlr: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
    nextvalues, lastgaelam, reversed_ = 0, 0, []
    for t in reversed(range(tlr.shape[-1])):
        delta = tlr[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
        reversed_.append(lastgaelam)
    advantages = torch.stack(reversed_[::-1], dim=1)
    returns = advantages + values
    return masked_whiten(advantages, mask), returns


def verl_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                    cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    vpredclipped = torch.max(torch.min(vpreds, values + cliprange_value), values - cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    clipped = torch.max(vf_losses1, vf_losses2)
    return 0.5 * masked_mean(clipped, mask), masked_mean(torch.gt(vf_losses2, vf_losses1).float(), mask)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95), (0.99, 0.0)])
def test_gae_equals_verls(gamma: float, lam: float, seed: int) -> None:
    """Per token, the whitened advantages and the returns equal verl's, values varying per token."""
    rewards, groups, lengths, tlr, mask = outcome_batch(seed)
    rng = np.random.default_rng(50 + seed)
    values = [rng.normal(0.3, 0.5, n) for n in lengths]
    v = torch.zeros_like(tlr)
    for i, x in enumerate(values):
        v[i, :len(x)] = torch.from_numpy(x)
    ours, returns = compute_gae([tlr[i, :n].numpy() for i, n in enumerate(lengths)], values, gamma, lam)
    ref_adv, ref_ret = verl_gae(tlr, v, mask, gamma, lam)
    for i, n in enumerate(lengths):  # advantages and returns are O(1): compare on that scale
        assert np.allclose(ours[i], ref_adv[i, :n].numpy(), atol=1e-9), (i, ours[i], ref_adv[i])
        assert np.allclose(returns[i], ref_ret[i, :n].numpy(), atol=1e-9), (i, returns[i], ref_ret[i])
    with pytest.raises(ValueError, match="values for a response"):
        compute_gae([np.zeros(3)], [np.zeros(2)], gamma, lam)


def test_gae_is_an_estimator_that_needs_the_critic() -> None:
    algo = Algo(adv_estimator="gae")
    assert estimator_problems(algo) == [] and needs_critic(algo) and needs_token_advantages("gae", algo)
    assert not needs_critic(Algo()) and not needs_critic(Algo(adv_estimator="reinforce_plus_plus"))


def test_actor_batch_carries_gae_advantages_and_returns() -> None:
    """The actor batch of a mini-batch with the critic's values: ``token_advantages`` and ``returns`` are
    verl's GAE of the batch's own rewards and values; without values the batch is refused."""
    from slurm_rl.data.actor_batch import make_actor_batch
    from slurm_rl.data.emulated import make_fake_inference, make_fake_prompts, make_fake_rollouts

    rollouts = make_fake_rollouts(make_fake_prompts(2, 3, (4, 9), seed=0), 4, (1, 12), seed=1)
    algo = Algo(adv_estimator="gae", gamma=0.95, lam=0.9)
    batch = make_actor_batch(make_fake_inference(rollouts, with_values=True), algo).to_pylist()
    width = max(len(r["response_ids"]) for r in batch)
    mask = torch.zeros(len(batch), width, dtype=torch.float64)
    tlr, values = torch.zeros_like(mask), torch.zeros_like(mask)
    for i, row in enumerate(batch):
        n = len(row["response_ids"])
        mask[i, :n], tlr[i, n - 1] = 1, row["reward"]
        values[i, :n] = torch.tensor(row["values"], dtype=torch.float64)
    ref_adv, ref_ret = verl_gae(tlr, values, mask, 0.95, 0.9)
    for i, row in enumerate(batch):
        n = len(row["response_ids"])
        assert np.allclose(row["token_advantages"], ref_adv[i, :n].numpy(), atol=1e-5)  # float32 of O(1) values
        assert np.allclose(row["returns"], ref_ret[i, :n].numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="no critic values"):
        make_actor_batch(make_fake_inference(rollouts), algo)
    assert all(r["returns"] is None for r in make_actor_batch(make_fake_inference(rollouts), Algo()).to_pylist())


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_value_loss_is_verls_clipped_loss_with_its_gradient(mode: str) -> None:
    """Ours per token, aggregated, equals verl's ``compute_value_loss`` (token-mean, as verl's critic
    aggregates by default) and so does its gradient; the clipped term is the larger one exactly where
    the prediction left the clip range away from the return."""
    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(5, 7, generator=g) > 0.25).double()
    mask[:, 0] = 1
    values, returns = torch.randn(5, 7, generator=g, dtype=torch.float64), torch.randn(5, 7, generator=g, dtype=torch.float64)
    pred = (values + torch.randn(5, 7, generator=g, dtype=torch.float64)).requires_grad_(True)
    agg = LossAggregation(mode)
    per_token, flag = value_loss(pred, values, returns, 0.5)
    ours = (per_token * agg.weights(mask)).sum() / agg.denominator(float(mask.sum()), float((mask.sum(-1) > 0).sum()))
    (grad,) = torch.autograd.grad(ours, pred)
    pred_ref = pred.detach().clone().requires_grad_(True)
    if mode == "token-mean":
        ref, clipfrac = verl_value_loss(pred_ref, returns, values, mask, 0.5)
        assert float(masked_mean(flag.double(), mask)) == pytest.approx(float(clipfrac))
    else:  # each sequence's token mean, averaged over sequences
        clipped = torch.max((pred_ref - returns) ** 2, (torch.clamp(pred_ref, values - 0.5, values + 0.5) - returns) ** 2)
        ref = 0.5 * ((clipped * mask).sum(-1) / mask.sum(-1)).mean()
    (grad_ref,) = torch.autograd.grad(ref, pred_ref)
    assert float(ours.detach()) == pytest.approx(float(ref.detach()), abs=1e-12)
    assert torch.allclose(grad, grad_ref, atol=1e-12)
    assert 0 < float(flag.double().mean()) < 1  # both terms occur


@pytest.mark.slow
def test_critic_learns_checkpoints_and_its_twin_gives_its_values(tmp_path) -> None:
    """The megatron-core critic (value head) fits fixed returns step by step; saved and loaded into a fresh
    critic it holds the same weights; the transformers twin the inference ranks score with, given those
    weights, gives its values per position. Its DP changes in place and its resume: test_scheduling_backends
    and test_ppo_runs (whole runs)."""
    from slurm_rl.engines.actor.checkpoint import load_checkpoint, save_checkpoint
    from slurm_rl.engines.actor.critic import CriticTrainer, token_values
    from slurm_rl.engines.actor.groups import GroupCache
    from slurm_rl.engines.actor.microbatch import BatchConfig, collate
    from slurm_rl.engines.actor.model import init_local_process_group
    from slurm_rl.engines.actor.optimizer import OptimConfig
    from slurm_rl.engines.inference import ValueScorer
    from test_actor_reshard import MODEL as model_cfg, make_batch

    init_local_process_group()
    samples = [{**s, "values": [0.0] * (len(s["input_ids"]) - 1), "returns": [1.5] * (len(s["input_ids"]) - 1)}
               for s in make_batch(0, 8)]

    def loss(v: torch.Tensor, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return value_loss(v, b["values"], b["returns"], 10.0)[0]

    def make(seed: int) -> CriticTrainer:
        cache = GroupCache(timeout=30.0)
        cache.ensure([[0]])
        return CriticTrainer(model_cfg, OptimConfig(lr=1e-2), BatchConfig(8, 4), [0], cache, seed=seed)

    critic = make(5)
    losses = [critic.train_step(samples, loss)["loss"] for _ in range(4)]
    assert losses == sorted(losses, reverse=True) and losses[-1] < 0.5 * losses[0], losses
    # a loss's per-token diagnostics come back as their token means over the step (verl's vf_clipfrac): with
    # returns 1 above the values the step starts from and V_old 0.5 below them on even positions (equal on odd
    # ones), clipping 0.1 around V_old makes the clipped term the larger on every even position, never on an odd
    batch = collate(samples)
    with torch.no_grad():
        now = token_values(critic.model, batch, "cpu")
    probe = []
    for i, s in enumerate(samples):
        v = now[i, :len(s["input_ids"]) - 1].tolist()
        probe.append({**s, "returns": [x + 1.0 for x in v], "values": [x - 0.5 if t % 2 == 0 else x for t, x in enumerate(v)]})
    mask = batch["loss_mask"]
    expected = float(mask[:, 0::2].double().sum() / mask.double().sum())

    def clipped_loss(v: torch.Tensor, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        per_token, clipped = value_loss(v, b["values"], b["returns"], 0.1)
        return per_token, {"vf_clipfrac": clipped.to(per_token.dtype)}

    stats = critic.train_step(probe, clipped_loss)
    assert 0.3 < expected < 0.7 and stats["vf_clipfrac"] == pytest.approx(expected, abs=1e-9), (stats, expected)
    save_checkpoint(critic, tmp_path / "critic")
    fresh = make(99)
    load_checkpoint(fresh, tmp_path / "critic")
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(critic.named_parameters_for_sync(),
                                                            fresh.named_parameters_for_sync()))
    ids = collate([{"input_ids": s["input_ids"]} for s in samples[:3]])
    megatron = token_values(fresh.model, ids, "cpu")
    twin = ValueScorer(model_cfg, fresh.full_parameters()).score([s["input_ids"] for s in samples[:3]])
    assert [len(t) for t in twin] == [len(s["input_ids"]) - 1 for s in samples[:3]]
    worst = max(float((megatron[i, :len(t)] - t).abs().max()) for i, t in enumerate(twin))
    assert worst <= 1e-4 * max(1.0, float(megatron.abs().max())), worst  # fp32, values O(1)
