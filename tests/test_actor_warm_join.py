"""Warm joiners: a rank that built its skeleton ahead of time joins with the same state, faster."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from slurm_rl.engines.actor.groups import GroupCache
from slurm_rl.engines.actor.local_dist import run_local
from slurm_rl.engines.actor.microbatch import shard_for_rank
from slurm_rl.engines.actor.optimizer import OptimConfig
from slurm_rl.engines.actor.trainer import ActorTrainer, InactiveActorError
from test_actor_reshard import BATCH, MODEL, OPTIM, make_batch

ZERO = OptimConfig(**{**OPTIM.__dict__, "zero1": True})
REFUSED = ("train_step", "named_parameters_for_sync", "state_dict")


def _refusals(trainer: ActorTrainer) -> list[str]:
    """Names of the calls that raise ``InactiveActorError`` on this rank."""
    calls: dict[str, Callable[[], Any]] = {
        "train_step": lambda: trainer.train_step(make_batch(0, 4)),
        "named_parameters_for_sync": lambda: list(trainer.named_parameters_for_sync()),
        "state_dict": trainer.state_dict,
    }
    refused = []
    for name, call in calls.items():
        try:
            call()
        except InactiveActorError:
            refused.append(name)
    return refused


def _train(trainer: ActorTrainer, rank: int, step: int, losses: dict[int, float]) -> None:
    if rank in trainer.ranks:
        mine = shard_for_rank(make_batch(step, BATCH.global_batch_size), trainer.dp_rank,
                              trainer.dp_size)
        metrics = trainer.train_step(mine)
        trainer.data_state = {"next": step + 1}
        if trainer.dp_rank == 0:
            losses[step] = metrics["loss"]


def join(rank: int, optim: OptimConfig, warm: bool, via_store: bool) -> dict[str, Any]:
    """Train 2 steps on [0], grow to [0, 1] (rank 1 warm or cold), then shrink back to [0]."""
    trainer = ActorTrainer(MODEL, optim, BATCH, [0], GroupCache(timeout=30.0), seed=7)
    trainer.control_via_store = via_store
    out: dict[str, Any] = {}
    if rank == 1 and warm:
        out["warm_s"] = trainer.warm()
        out["warm_again_s"] = trainer.warm()
        out["refused_warm"] = _refusals(trainer)
        out["active_warm"] = trainer.active
    skeleton = id(trainer.model)
    for step in range(2):
        _train(trainer, rank, step, {})
    fig = trainer.reshard([0, 1], epoch=1)
    if rank == 1:
        opt = trainer.optimizer
        assert opt is not None
        out.update(build_s=fig["build_seconds"], kept_skeleton=id(trainer.model) == skeleton,
                   params={n: t.clone() for n, t in trainer.named_parameters_for_sync()},
                   exp_avg=opt.exp_avg.clone(), exp_avg_sq=opt.exp_avg_sq.clone(),
                   step=trainer.step, consumed=trainer.consumed_samples,
                   rng=trainer.generator.get_state(), data_state=dict(trainer.data_state),
                   lr=trainer.scheduler.lr_for_step(BATCH.global_batch_size))
    losses: dict[int, float] = {}
    _train(trainer, rank, 2, losses)
    out["losses"] = losses
    trainer.reshard([0], epoch=2)
    if rank == 1:
        out.update(active_left=trainer.active, refused_left=_refusals(trainer),
                   kept_after_leave=trainer.model is not None, step_left=trainer.step)
    return out


def rejoin(rank: int, warm: bool, schedule: list[list[int]]) -> dict[str, Any]:
    """Train one step per schedule entry; rank 1 leaves and rejoins with ``stay_warm``."""
    trainer = ActorTrainer(MODEL, OPTIM, BATCH, schedule[0], GroupCache(timeout=30.0), seed=7,
                           stay_warm=warm)
    skeleton = id(trainer.model) if trainer.model is not None else None
    losses: dict[int, float] = {}
    builds, kept = [], True
    for step, ranks in enumerate(schedule):
        if sorted(ranks) != trainer.ranks:
            fig = trainer.reshard(ranks, epoch=step)
            if rank == 1 and 1 in ranks:
                builds.append(fig["build_seconds"])
            kept = kept and id(trainer.model) == skeleton
        _train(trainer, rank, step, losses)
    params = ({n: t.clone() for n, t in trainer.named_parameters_for_sync()}
              if rank == 0 else None)
    return {"losses": losses, "builds": builds, "kept": kept, "params": params}


def worker(rank: int, world: int) -> dict[str, Any]:
    """Every scenario, one after another in one 2-rank world."""
    res = {f"join/{z}/{w}": join(rank, ZERO if z else OPTIM, w == "warm", via_store=z)
           for z in (False, True) for w in ("cold", "warm")}
    res["rejoin/static"] = rejoin(rank, False, [[0]] * 5)
    res["rejoin/warm"] = rejoin(rank, True, [[0], [0, 1], [0], [0, 1], [0, 1]])
    return res


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_local(worker, 2, timeout_s=300)


@pytest.mark.parametrize("zero1", [False, True])
def test_warm_joiner_receives_identical_state(results: list[dict[str, Any]],
                                              zero1: bool) -> None:
    """[0] -> [0, 1]: a warm rank 1 ends with exactly the state a cold rank 1 gets, without a
    build; ZeRO-1 runs its control (barrier, metadata) through the store."""
    cold, warm = results[1][f"join/{zero1}/cold"], results[1][f"join/{zero1}/warm"]
    assert warm["params"].keys() == cold["params"].keys()
    for name, tensor in cold["params"].items():
        assert torch.equal(warm["params"][name], tensor), name
    for key in ("exp_avg", "exp_avg_sq", "rng"):
        assert torch.equal(warm[key], cold[key]), key
    assert warm["exp_avg_sq"].abs().sum() > 0  # real moments arrived, not the warm zeros
    for key in ("step", "consumed", "data_state", "lr"):
        assert warm[key] == cold[key], key
    assert (warm["step"], warm["consumed"], warm["data_state"]) == (2, 16, {"next": 2})
    assert warm["kept_skeleton"] and warm["warm_s"] > 0 and warm["warm_again_s"] == 0
    assert warm["build_s"] < 0.05 * cold["build_s"], (warm["build_s"], cold["build_s"])
    assert results[0][f"join/{zero1}/warm"]["losses"] == results[0][f"join/{zero1}/cold"]["losses"]


def test_warm_rank_stays_inactive_until_joined(results: list[dict[str, Any]]) -> None:
    """Warm or left: training and state calls refuse; a warm rank keeps its skeleton when it
    leaves, a cold one frees it (the default)."""
    for zero1 in (False, True):
        warm, cold = results[1][f"join/{zero1}/warm"], results[1][f"join/{zero1}/cold"]
        assert warm["active_warm"] is False and warm["refused_warm"] == list(REFUSED)
        for out in (warm, cold):
            assert out["active_left"] is False and out["refused_left"] == list(REFUSED)
            assert out["step_left"] == 3
        assert warm["kept_after_leave"] and not cold["kept_after_leave"]


def test_leave_and_rejoin_warm_trains_like_static(results: list[dict[str, Any]]) -> None:
    """[0] -> [0, 1] -> [0] -> [0, 1]: rank 1 keeps its buffers, rejoins without a build and the
    run trains the same losses and parameters as DP 1 throughout."""
    static, moved = results[0]["rejoin/static"], results[0]["rejoin/warm"]
    assert len(moved["losses"]) == 5
    for a, b in zip(moved["losses"].values(), static["losses"].values()):
        assert abs(a - b) <= 1e-5 * abs(b), (moved["losses"], static["losses"])
    for name, ref in static["params"].items():
        got = moved["params"][name]
        assert float((got - ref).norm() / ref.norm().clamp_min(1e-12)) <= 1e-5, name
    warm1 = results[1]["rejoin/warm"]
    assert warm1["kept"] and len(warm1["builds"]) == 2
    assert max(warm1["builds"]) < 0.05, warm1["builds"]
