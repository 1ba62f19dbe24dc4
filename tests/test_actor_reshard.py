"""In-place DP resharding: scale events leave the training trajectory unchanged."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from slurm_rl.engines.actor.groups import GroupCache, transition_rank_sets
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


def run_schedule(rank: int, schedule: list[list[int]], optim: OptimConfig,
                 batch: BatchConfig, cache: GroupCache) -> dict[str, Any]:
    """Train one step per schedule entry on the listed ranks, resharding between entries.

    Every world rank runs this (uninvolved ranks only take part in group creation).
    """
    cache.ensure([schedule[0]])
    trainer = ActorTrainer(MODEL, optim, batch, schedule[0], cache, seed=7)
    losses: dict[int, float] = {}
    figures = []
    for step, ranks in enumerate(schedule):
        if sorted(ranks) != trainer.ranks:
            cache.ensure(transition_rank_sets(trainer.ranks, ranks))
            if rank in set(ranks) | set(trainer.ranks):
                figures.append(trainer.reshard(ranks, epoch=step))
        if rank in ranks:
            samples = make_batch(step, batch.global_batch_size)
            mine = shard_for_rank(samples, trainer.dp_rank, trainer.dp_size)
            metrics = trainer.train_step(mine)
            if trainer.dp_rank == 0:
                losses[step] = metrics["loss"]
    final = rank == min(schedule[-1])
    return {"losses": losses, "figures": figures, "step": trainer.step,
            "consumed": trainer.consumed_samples, "rng": trainer.generator.get_state(),
            "params": ({n: t.clone() for n, t in trainer.named_parameters_for_sync()}
                       if final else None)}


def run_scenarios(rank: int, world: int, specs: list[tuple[str, list[list[int]], OptimConfig]],
                  batch: BatchConfig) -> dict[str, Any]:
    """Run several schedules one after another in the same world."""
    out = {}
    for name, schedule, optim in specs:
        out[name] = run_schedule(rank, schedule, optim, batch, GroupCache(timeout=30.0))
    return out


def merged(results: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Losses of all steps and the final parameters of a scenario, merged over ranks."""
    losses: dict[int, float] = {}
    params = None
    for res in results:
        losses.update(res[name]["losses"])
        params = params or res[name]["params"]
    return {"losses": [losses[k] for k in sorted(losses)], "params": params}


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
def test_scale_events_match_static_run() -> None:
    """DP 1->2->1 and 2->4->2 (with and without ZeRO-1) reproduce the static DP=1 run."""
    zero = OptimConfig(**{**OPTIM.__dict__, "zero1": True})
    specs = [
        ("static", [[0]] * 5, OPTIM),
        ("1-2-1", [[0], [0, 1], [0, 1], [1], [0]], OPTIM),
        ("2-4-2", [[0, 1], [0, 1, 2, 3], [0, 1, 2, 3], [2, 3], [0, 1]], OPTIM),
        ("1-2-1-zero", [[0], [0, 1], [0, 1], [1], [0]], zero),
        ("2-4-2-zero", [[0, 1], [0, 1, 2, 3], [1, 2, 3, 0], [2, 3], [1, 3]], zero),
    ]
    results = run_local(run_scenarios, 4, (specs, BATCH), timeout_s=300)
    ref = merged(results, "static")
    assert len(ref["losses"]) == 5
    for name, _, _ in specs[1:]:
        assert_same_run(merged(results, name), ref)
    for res in results:
        for name, schedule, _ in specs:
            if res is results[min(schedule[-1])]:
                assert res[name]["step"] == 5 and res[name]["consumed"] == 40
                assert torch.equal(res[name]["rng"], results[0]["static"]["rng"])
    # 2 -> 4 without ZeRO: each joiner receives params + 2 Adam moments = 12 bytes/param.
    numel = MODEL.num_parameters()
    grow = results[2]["2-4-2"]["figures"][0]
    assert grow["bytes_moved"] == 2 * 12 * numel
    assert grow["bytes_received"] == 12 * numel


def test_plan_covers_every_new_holding() -> None:
    """Each new rank receives exactly what it lacks; sharded moves only cross-owner parts."""
    numel = 1001
    arrays = {"params": (numel, False), "m": (numel, True)}
    plan = plan_reshard([0, 1], [0, 1, 2, 3], arrays)
    got = {(t.array, t.dst): 0 for t in plan}
    for t in plan:
        assert t.src in (0, 1) and t.dst != t.src
        got[(t.array, t.dst)] += t.hi - t.lo
    assert got[("params", 2)] == numel and got[("params", 3)] == numel
    assert ("params", 0) not in got
    assert sum(v for (a, _), v in got.items() if a == "m") == plan_bytes(
        [t for t in plan if t.array == "m"]) // 4
    assert plan_reshard([0, 1], [0, 1], arrays) == []


def test_replicated_state_moves_as_one_broadcast() -> None:
    """Joiners get the replicated state from one staying holder; its group is pre-created."""
    from slurm_rl.engines.actor.groups import transition_rank_sets
    from slurm_rl.engines.actor.reshard import broadcast_ranks, broadcast_source

    assert broadcast_source([0, 1], [0, 1, 2, 3]) == 0
    assert broadcast_ranks([0, 1], [0, 1, 2, 3]) == [0, 2, 3]  # rank 1 already has it
    assert broadcast_source([0, 1], [1, 2]) == 1 and broadcast_ranks([0, 1], [1, 2]) == [1, 2]
    assert broadcast_ranks([0, 1], [2, 3]) == [0, 2, 3]  # nobody stays: first old rank sends
    assert broadcast_ranks([0, 1, 2, 3], [0, 1]) == []  # shrinking moves nothing replicated
    assert transition_rank_sets([0, 1], [0, 1, 2, 3]) == [(0, 1, 2, 3), (0, 2, 3)]
    assert transition_rank_sets([0], [0, 1]) == [(0, 1)]
    assert transition_rank_sets([0, 1], [1, 2]) == [(0, 1, 2), (1, 2)]
