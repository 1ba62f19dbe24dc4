"""In-place DP resharding: scale events leave the training trajectory unchanged."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from slurm_rl.engines.actor.groups import GroupCache
from slurm_rl.engines.actor.local_dist import LocalRankError, run_local
from slurm_rl.engines.actor.microbatch import BatchConfig, InvalidDPSizeError, shard_for_rank
from slurm_rl.engines.actor.optimizer import OptimConfig
from slurm_rl.engines.actor.reshard import plan_bytes, plan_reshard
from slurm_rl.engines.actor.trainer import ActorTrainer, ReshardTimeoutError
from slurm_rl.engines.model_config import ModelConfig

MODEL = ModelConfig(vocab_size=64, hidden_size=64, num_layers=2, num_attention_heads=2,
                    num_query_groups=1, ffn_hidden_size=128)


def make_batch(step: int, size: int, vocab: int = 64) -> list[dict[str, Any]]:
    """Deterministic variable-length samples for one optimizer step."""
    gen = torch.Generator().manual_seed(1000 + step)
    out = []
    for _ in range(size):
        length = int(torch.randint(5, 17, (1,), generator=gen))
        ids = torch.randint(0, vocab, (length,), generator=gen)
        mask = (torch.rand(length - 1, generator=gen) > 0.2).float()
        mask[-1] = 1.0
        out.append({"input_ids": ids, "loss_mask": mask})
    return out


def run_schedule(rank: int, world: int, schedule: list[list[int]], optim: OptimConfig,
                 batch: BatchConfig) -> dict[str, Any]:
    """Train one step per schedule entry on the listed ranks, resharding between entries."""
    cache = GroupCache(timeout=30.0)
    trainer = ActorTrainer(MODEL, optim, batch, schedule[0], cache, seed=7)
    losses, lrs, figures = [], [], []
    for step, ranks in enumerate(schedule):
        if sorted(ranks) != trainer.ranks:
            if rank in set(ranks) | set(trainer.ranks):
                figures.append(trainer.reshard(ranks, epoch=step))
        if rank in ranks:
            samples = make_batch(step, batch.global_batch_size)
            mine = shard_for_rank(samples, trainer.dp_rank, trainer.dp_size)
            metrics = trainer.train_step(mine)
            losses.append(metrics["loss"])
            lrs.append(metrics["lr"])
    params = ({n: t.clone() for n, t in trainer.named_parameters_for_sync()}
              if trainer.active else None)
    return {"losses": losses if rank == schedule[-1][0] else None, "lrs": lrs,
            "params": params if rank == min(schedule[-1]) else None, "figures": figures,
            "step": trainer.step, "consumed": trainer.consumed_samples,
            "rng": trainer.generator.get_state()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def assert_same_run(got: dict[str, Any], ref: dict[str, Any]) -> None:
    assert len(got["losses"]) == len(ref["losses"])
    for a, b in zip(got["losses"], ref["losses"]):
        assert abs(a - b) <= 1e-5 * abs(b), (got["losses"], ref["losses"])
    assert got["params"].keys() == ref["params"].keys()
    for name in ref["params"]:
        assert _rel(got["params"][name], ref["params"][name]) <= 1e-5, name


OPTIM = OptimConfig(lr=3e-3, lr_warmup_samples=8, lr_decay_samples=40, min_lr=3e-4,
                    weight_decay=0.01, clip_grad=1.0)
BATCH = BatchConfig(global_batch_size=8, micro_batch_size=2)


@pytest.mark.slow
@pytest.mark.parametrize("zero1", [False, True])
def test_scale_1_2_1_matches_static(zero1: bool) -> None:
    optim = OptimConfig(**{**OPTIM.__dict__, "zero1": zero1})
    static = run_local(run_schedule, 1, ([[0]] * 5, optim, BATCH))[0]
    scaled = run_local(run_schedule, 2, ([[0], [0, 1], [0, 1], [1], [0]], optim, BATCH))
    final = scaled[0]
    final["losses"] = scaled[0]["losses"]
    assert_same_run({"losses": [*scaled[0]["losses"]], "params": scaled[0]["params"]}, static)
    assert scaled[0]["step"] == 5 and scaled[0]["consumed"] == 40
    assert torch.equal(scaled[0]["rng"], static["rng"])
    moved = [f["bytes_moved"] for f in scaled[1]["figures"]]
    assert moved[0] > 0
