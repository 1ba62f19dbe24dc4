"""Tensor-parallel change TP=2 -> TP=1 with megatron-core's resharding over gloo on CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from slurm_rl.engines.actor.local_dist import run_local
from slurm_rl.engines.model_config import ModelConfig

TP_MODEL = ModelConfig(vocab_size=64, hidden_size=128, num_layers=2, num_attention_heads=4,
                       num_query_groups=2, ffn_hidden_size=128)


def tp_worker(rank: int, world: int) -> dict[str, Any]:
    """Build the model at TP=2 over ranks 0-1, swap into TP=1 replicas, compare to TP=1."""
    from slurm_rl.engines.actor.model import build_gpt_model, forward_logits
    from slurm_rl.engines.actor.tp_reshard import swap_weights

    both = dist.new_group([0, 1])
    singles = [dist.new_group([r]) for r in range(world)]
    mine = singles[rank]
    src = build_gpt_model(TP_MODEL, seed=5, tp_group=both)  # this rank's TP=2 shard
    dst = build_gpt_model(TP_MODEL, seed=6, tp_group=mine)  # TP=1, other weights
    ref = build_gpt_model(TP_MODEL, seed=5)  # TP=1 build of the same init
    swap_weights(src, dst, {"dp": mine, "pp": mine}, {"dp": both, "pp": mine}, both)
    ref_params = dict(ref.named_parameters())
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = forward_logits(dst, ids), forward_logits(ref, ids)
    return {
        "sharded": {n: (tuple(p.shape), tuple(ref_params[n].shape))
                    for n, p in src.named_parameters()},
        "param_rel": {n: float((p.detach() - ref_params[n]).norm()
                               / ref_params[n].norm().clamp_min(1e-12))
                      for n, p in dst.named_parameters()},
        "logit_rel": float((got - want).norm() / want.norm()),
    }


@pytest.mark.slow
def test_tp2_to_tp1_weights_and_logits_equal() -> None:
    for out in run_local(tp_worker, 2, timeout_s=300):
        halved = [n for n, (s, full) in out["sharded"].items() if s != full]
        assert "decoder.layers.0.self_attention.linear_qkv.weight" in halved
        assert "decoder.layers.0.mlp.linear_fc1.weight" in halved  # SwiGLU gate/up interleave
        assert out["param_rel"] and max(out["param_rel"].values()) <= 1e-5, out["param_rel"]
        assert out["logit_rel"] <= 1e-5
