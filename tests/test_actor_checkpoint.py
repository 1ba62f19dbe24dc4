"""Checkpoint/resume at another DP size, and the sample-driven LR trajectory through training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from slurm_rl.engines.actor.checkpoint import load_checkpoint, read_meta, save_checkpoint
from slurm_rl.engines.actor.groups import GroupCache, transition_rank_sets
from slurm_rl.engines.actor.local_dist import run_local
from slurm_rl.engines.actor.microbatch import BatchConfig, shard_for_rank
from slurm_rl.engines.actor.optimizer import OptimConfig
from slurm_rl.engines.actor.trainer import ActorTrainer
from test_actor_reshard import MODEL, OPTIM, assert_same_run, make_batch

FIXED = BatchConfig(global_batch_size=8, micro_batch_size=2)
PACKED = BatchConfig(global_batch_size=8, micro_batch_size=1, max_tokens_per_microbatch=24)


def _train(trainer: ActorTrainer, rank: int, steps: range, out: dict[int, Any]) -> None:
    for step in steps:
        if rank in trainer.ranks:
            mine = shard_for_rank(make_batch(step, 8), trainer.dp_rank, trainer.dp_size)
            metrics = trainer.train_step(mine)
            trainer.data_state = {"next_step": step + 1}
            if trainer.dp_rank == 0:
                out[step] = metrics


def _params(trainer: ActorTrainer) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in trainer.named_parameters_for_sync()}


def resume_worker(rank: int, world: int, ckpt: str) -> dict[str, Any]:
    """Reference run, save after a scale event, resume on other ranks/DP/batching."""
    res: dict[str, Any] = {}
    zero = OptimConfig(**{**OPTIM.__dict__, "zero1": True})

    cache = GroupCache(timeout=30.0)
    cache.ensure([[0]])
    ref: dict[int, Any] = {}
    trainer = ActorTrainer(MODEL, OPTIM, FIXED, [0], cache, seed=7)
    _train(trainer, rank, range(5), ref)
    res["ref"] = {"metrics": ref, "params": _params(trainer) if rank == 0 else None}

    # Save at DP=2 (ZeRO-1) after a 1 -> 2 scale event.
    cache = GroupCache(timeout=30.0)
    cache.ensure([[0]])
    trainer = ActorTrainer(MODEL, zero, FIXED, [0], cache, seed=7)
    _train(trainer, rank, range(2), {})
    cache.ensure(transition_rank_sets([0], [0, 1]))
    trainer.reshard([0, 1], epoch=1)
    _train(trainer, rank, range(2, 3), {})
    save_checkpoint(trainer, ckpt)

    # Resume at DP=1 on rank 1 (ZeRO off) and at DP=2 with token packing.
    for name, ranks, batch, optim in (("dp1", [1], FIXED, OPTIM), ("dp2", [0, 1], PACKED, zero)):
        cache = GroupCache(timeout=30.0)
        cache.ensure([ranks])
        got: dict[int, Any] = {}
        if rank in ranks:
            trainer = ActorTrainer(MODEL, optim, batch, ranks, cache, seed=99)
            meta = load_checkpoint(trainer, ckpt)
            assert trainer.data_state == {"next_step": 3} and trainer.step == 3
            assert meta["scheduler"]["consumed_samples"] == 24
            _train(trainer, rank, range(3, 5), got)
            res[name] = {"metrics": got, "params": _params(trainer) if rank == ranks[0] else None}

    # From scratch at DP=2 with token packing: same LR trajectory as the DP=1 fixed run.
    cache = GroupCache(timeout=30.0)
    cache.ensure([[0, 1]])
    packed: dict[int, Any] = {}
    trainer = ActorTrainer(MODEL, OPTIM, PACKED, [0, 1], cache, seed=7)
    _train(trainer, rank, range(5), packed)
    res["packed"] = {"metrics": packed, "params": _params(trainer) if rank == 0 else None}
    return res


def _merge(results: list[dict[str, Any]], name: str) -> dict[str, Any]:
    metrics: dict[int, Any] = {}
    params = None
    for r in results:
        if name in r:
            metrics.update(r[name]["metrics"])
            params = params or r[name]["params"]
    return {"metrics": metrics, "params": params}


@pytest.mark.slow
def test_resume_at_other_dp_size_and_lr_trajectory(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt-step3"
    results = run_local(resume_worker, 2, (str(ckpt),), timeout_s=300)
    ref = _merge(results, "ref")
    ref_losses = [ref["metrics"][k]["loss"] for k in range(5)]

    meta = read_meta(ckpt)
    assert meta["scheduler"]["consumed_samples"] == 24 and meta["step"] == 3
    assert "num_steps" not in json.dumps(meta["scheduler"])
    assert sorted(p.name for p in ckpt.iterdir()) == ["meta.json", "model.safetensors",
                                                      "optimizer.safetensors"]

    for name in ("dp1", "dp2"):
        got = _merge(results, name)
        assert sorted(got["metrics"]) == [3, 4]
        assert_same_run({"losses": [got["metrics"][k]["loss"] for k in (3, 4)],
                         "params": got["params"]},
                        {"losses": ref_losses[3:], "params": ref["params"]})

    # ROLL #442 regression: token packing at DP=2 runs more optimizer micro-steps per step
    # but the LR per step and the schedule position are exactly those of the DP=1 run.
    packed = _merge(results, "packed")
    assert [packed["metrics"][k]["lr"] for k in range(5)] == [
        ref["metrics"][k]["lr"] for k in range(5)]
    assert packed["metrics"][4]["consumed_samples"] == 40
    assert any(packed["metrics"][k]["micro_batches"] != ref["metrics"][k]["micro_batches"]
               for k in range(5))
    assert_same_run({"losses": [packed["metrics"][k]["loss"] for k in range(5)],
                     "params": packed["params"]}, {"losses": ref_losses, "params": ref["params"]})
