"""Model construction on CPU, log-probs, LR schedule and micro-batching (fast unit tests)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from slurm_rl.engines.actor.local_dist import run_local
from slurm_rl.engines.actor.lr_schedule import LRScheduleConfig, SampleLRScheduler, lr_at
from slurm_rl.engines.actor.microbatch import BatchConfig, collate, split_microbatches
from slurm_rl.engines.model_config import ModelConfig


def model_worker(rank: int, world: int) -> dict[str, Any]:
    from slurm_rl.engines.actor.cpu_shim import apply_cpu_shim
    from slurm_rl.engines.actor.model import build_gpt_model, forward_logits, token_logprobs, token_logprobs_and_entropy

    cfg = ModelConfig(num_query_groups=2)
    a, b = build_gpt_model(cfg, seed=3), build_gpt_model(cfg, seed=3)
    c = build_gpt_model(cfg, seed=4)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    lp = token_logprobs(a, ids, mask)
    lp.sum().backward()
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 64
    tied = build_gpt_model(ModelConfig(tie_word_embeddings=True), seed=1)
    with torch.no_grad():
        lp2, ent = token_logprobs_and_entropy(a, ids, mask)
        reference = torch.distributions.Categorical(logits=forward_logits(a, ids, mask)[:, :-1].float()).entropy()
    return {
        # at the positions that predict a real token (entries predicting padding are meaningless by contract)
        "entropy": torch.allclose(ent[mask[:, 1:].bool()], reference[mask[:, 1:].bool()], atol=1e-5)
        and torch.equal(lp2, lp.detach()) and float(ent.min()) > 0,
        "shim_idempotent": apply_cpu_shim() and apply_cpu_shim(),
        "same_init": all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters())),
        "seed_matters": not torch.equal(a.output_layer.weight, c.output_layer.weight),
        "numel": sum(p.numel() for p in a.parameters()), "expected": cfg.num_parameters(),
        "names": [n for n, _ in a.named_parameters()],
        "qkv": tuple(a.decoder.layers[0].self_attention.linear_qkv.weight.shape),
        "shape": tuple(lp.shape), "all_grads": all(p.grad is not None for p in a.parameters()),
        "causal": torch.allclose(lp[:, :5], token_logprobs(a, changed, mask)[:, :5]),
        "padding": torch.allclose(lp[1, :6], token_logprobs(a, ids[1:2, :7])[0], atol=1e-6),
        "tied_names": [n for n, _ in tied.named_parameters() if "output" in n],
        "attention": _attention_backends_agree(cfg),
        "plain_ops": _plain_ops_agree(cfg),
    }


def _plain_ops_agree(cfg: ModelConfig) -> dict[str, float]:
    """The model with plain RoPE and linears (what ``build_gpt_model`` gives at TP 1) against megatron-core's own
    RoPE function and linear autograd function on the same weights: the largest difference of a log-prob and
    of a gradient, per precision, and how many linears were plain."""
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer import attention

    from slurm_rl.engines.actor import plain_ops
    from slurm_rl.engines.actor.model import build_gpt_model, token_logprobs

    ids = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, 8:] = 0
    out: dict[str, float] = {}
    for precision in ("fp32", "bf16"):
        runs = []
        for plain in (True, False):
            model = build_gpt_model(cfg, seed=6, precision=precision)
            out["plain_linears"] = sum("_forward_impl" in m.__dict__ for m in model.modules())
            out["plain_swiglu"] = sum("forward" in m.__dict__ for m in model.modules())
            if not plain:
                for m in model.modules():
                    m.__dict__.pop("_forward_impl", None)
                    m.__dict__.pop("forward", None)
            attention.apply_rotary_pos_emb = plain_ops.apply_rotary_pos_emb if plain else rope_utils.apply_rotary_pos_emb
            try:
                lp = token_logprobs(model, ids, mask)
                lp[mask[:, 1:].bool()].sum().backward()
            finally:
                attention.apply_rotary_pos_emb = plain_ops.apply_rotary_pos_emb
            runs.append((lp.detach(), torch.cat([p.grad.float().reshape(-1) for p in model.parameters()])))
        (lp_a, g_a), (lp_b, g_b) = runs
        out[f"{precision}_logprob"] = float((lp_a - lp_b)[mask[:, 1:].bool()].abs().max())
        out[f"{precision}_grad"] = float((g_a - g_b).abs().max() / g_b.abs().max())
    return out


def _attention_backends_agree(cfg: ModelConfig) -> dict[str, float]:
    """SDPA against megatron-core's unfused attention on the same weights (GQA: 4 query heads, 2 KV
    groups), rows padded on the right and on the left: the largest difference of a valid position's
    log-prob and of a gradient, per precision."""
    from slurm_rl.engines.actor.model import build_gpt_model, token_logprobs

    ids = torch.randint(0, 64, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 8:] = 0  # right padding
    mask[2, :3] = 0  # left padding: its first queries see only padding keys
    valid = (mask[:, 1:] * mask[:, :-1]).bool()
    out = {}
    for precision in ("fp32", "bf16"):
        lps, grads = [], []
        for attention in ("local", "sdpa"):
            model = build_gpt_model(cfg, seed=5, precision=precision, attention=attention)
            lp = token_logprobs(model, ids, mask)
            (lp * valid).sum().backward()
            lps.append(lp.detach())
            grads.append(torch.cat([p.grad.float().reshape(-1) for p in model.parameters()]))
        out[f"{precision}_logprob"] = float((lps[0] - lps[1])[valid].abs().max())
        out[f"{precision}_finite"] = bool(torch.isfinite(lps[1]).all() and torch.isfinite(grads[1]).all())
        out[f"{precision}_grad"] = float((grads[0] - grads[1]).abs().max() / grads[0].abs().max())
    return out


@pytest.mark.slow
def test_gpt_model_on_cpu() -> None:
    out = run_local(model_worker, 1, timeout_s=200)[0]
    assert out["shim_idempotent"] is True  # CPU-only torch in the test environment
    assert out["same_init"] and out["seed_matters"]
    assert out["numel"] == out["expected"]
    assert "decoder.layers.1.mlp.linear_fc1.weight" in out["names"]
    assert out["qkv"] == ((4 + 2 * 2) * 32, 128)
    assert out["shape"] == (2, 9) and out["all_grads"]
    assert out["causal"] and out["padding"]
    assert out["tied_names"] == []
    assert out["entropy"]  # the entropy bonus's term: Categorical's entropy of the same logits
    att = out["attention"]  # log-probs are O(1): absolute tolerances; gradients relative to the largest one
    assert att["fp32_finite"] and att["bf16_finite"], att
    assert att["fp32_logprob"] < 1e-5 and att["fp32_grad"] < 1e-4, att
    assert att["bf16_logprob"] < 0.05 and att["bf16_grad"] < 0.05, att  # bf16 rounds differently per kernel (seen: 4e-3, 8e-3)
    plain = out["plain_ops"]  # 2 layers x (qkv, proj, fc1, fc2) + the output layer
    assert plain["plain_linears"] == 9 and plain["plain_swiglu"] == 2, plain
    assert plain["fp32_logprob"] < 1e-6 and plain["fp32_grad"] < 1e-6, plain
    assert plain["bf16_logprob"] < 0.05 and plain["bf16_grad"] < 0.05, plain


def test_model_config_validation() -> None:
    assert ModelConfig().head_dim >= 32
    assert ModelConfig.from_dict({"hidden_size": 256}).ffn_size == 704
    with pytest.raises(ValueError, match="head size"):
        ModelConfig(hidden_size=64, num_attention_heads=4)
    with pytest.raises(ValueError, match="model.bogus"):
        ModelConfig.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="num_query_groups"):
        ModelConfig(num_query_groups=3)


def test_lr_schedule_in_samples() -> None:
    cfg = LRScheduleConfig(lr=1.0, min_lr=0.1, lr_warmup_samples=100, lr_decay_samples=1000)
    assert lr_at(cfg, 0) == 0.0 and lr_at(cfg, 50) == 0.5 and lr_at(cfg, 100) == 1.0
    assert math.isclose(lr_at(cfg, 600), 0.55) and lr_at(cfg, 1100) == pytest.approx(0.1)
    assert lr_at(cfg, 5000) == pytest.approx(0.1)
    lin = LRScheduleConfig(lr=1.0, lr_decay_samples=10, lr_decay_style="linear")
    assert lr_at(lin, 5) == 0.5


def test_lr_trajectory_ignores_call_count_roll_442() -> None:
    """Many small optimizer calls (dynamic batching) vs few nominal steps: same decay."""
    cfg = LRScheduleConfig(lr=1.0, lr_warmup_samples=64, lr_decay_samples=2400 * 64)
    nominal = SampleLRScheduler(cfg)
    for _ in range(100):
        nominal.advance(64)
    split = SampleLRScheduler(cfg)
    for _ in range(400):
        split.advance(16)
    assert split.current_lr == nominal.current_lr
    assert split.state_dict()["consumed_samples"] == 6400
    assert set(split.state_dict()) == {"consumed_samples", "config"}
    resumed = SampleLRScheduler(cfg)
    resumed.load_state_dict(split.state_dict())
    assert resumed.lr_for_step(64) == nominal.lr_for_step(64)


def _sample(n: int) -> dict[str, Any]:
    return {"input_ids": list(range(n)), "advantages": [1.0] * (n - 1), "reward": 2.0}


def test_token_packing_and_collate() -> None:
    samples = [_sample(n) for n in (10, 4, 12, 3, 30, 5)]
    packed = split_microbatches(samples, BatchConfig(global_batch_size=6,
                                                     max_tokens_per_microbatch=24))
    assert [[len(s["input_ids"]) for s in mb] for mb in packed] == [[10, 4], [12, 3], [30], [5]]
    for mb in packed:
        assert len(mb) == 1 or len(mb) * max(len(s["input_ids"]) for s in mb) <= 24
    fixed = split_microbatches(samples, BatchConfig(global_batch_size=6, micro_batch_size=4))
    assert [len(mb) for mb in fixed] == [4, 2]
    batch = collate(packed[0])
    assert batch["input_ids"].shape == (2, 10) and batch["loss_mask"].shape == (2, 9)
    assert batch["loss_mask"][1].tolist() == [1, 1, 1] + [0] * 6
    assert batch["attention_mask"][1].sum() == 4 and batch["reward"].tolist() == [2.0, 2.0]
    assert batch["advantages"][1, 3:].abs().sum() == 0
