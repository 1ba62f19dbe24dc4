"""Invalid DP sizes and ranks that never arrive end in clear errors within the timeout."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch.distributed as dist

from slurm_rl.engines.actor.groups import GroupCache, GroupTimeoutError, transition_rank_sets
from slurm_rl.engines.actor.local_dist import run_local
from slurm_rl.engines.actor.microbatch import BatchConfig, InvalidDPSizeError, valid_dp_sizes
from slurm_rl.engines.actor.trainer import ActorTrainer, ReshardTimeoutError
from test_actor_reshard import MODEL, OPTIM

BATCH = BatchConfig(global_batch_size=8, micro_batch_size=2)
TIMEOUT = 4.0


def failure_worker(rank: int, world: int) -> dict[str, Any]:
    """Rank 2 skips first a group creation, then a reshard; ranks 0-1 report what they saw."""
    out: dict[str, Any] = {}
    cache = GroupCache(timeout=TIMEOUT)
    try:
        ActorTrainer(MODEL, OPTIM, BATCH, [0, 1, 2], cache, seed=1)
    except InvalidDPSizeError as exc:
        out["invalid_init"] = str(exc)
    cache.ensure([[0, 1]])
    trainer = ActorTrainer(MODEL, OPTIM, BATCH, [0, 1], cache, seed=1)
    try:
        trainer.reshard([0, 1, 2], epoch=3)
    except InvalidDPSizeError as exc:
        out["invalid_reshard"] = str(exc)

    dist.barrier()  # rank 2 built no model: let the others catch up before timing anything
    # Epoch 4 moves the actor from [0, 1] to [1, 2]; rank 2 does not create the groups.
    sets = transition_rank_sets([0, 1], [1, 2])
    if rank != 2:
        t0 = time.monotonic()
        try:
            cache.ensure(sets, what="epoch 4 actor reshard")
        except GroupTimeoutError as exc:
            out["group_timeout"] = [str(exc), time.monotonic() - t0]
    dist.barrier()  # rank 2 announces itself only after the others gave up

    # Now every rank creates the groups, but rank 2 never enters the reshard collective.
    cache.ensure(sets, what="epoch 4 actor reshard")
    if rank != 2:
        t0 = time.monotonic()
        try:
            trainer.reshard([1, 2], epoch=4)
        except ReshardTimeoutError as exc:
            out["reshard_timeout"] = [str(exc), time.monotonic() - t0]
    return out


@pytest.mark.slow
def test_invalid_dp_and_missing_rank_fail_clearly() -> None:
    results = run_local(failure_worker, 3, timeout_s=200)
    for rank, out in enumerate(results):
        assert "DP size 3 is invalid" in out["invalid_init"]
        assert "allowed DP sizes: [1, 2, 4]" in out["invalid_init"]
        if rank in (0, 1):
            assert "DP size 3 is invalid" in out["invalid_reshard"]
            message, seconds = out["group_timeout"]
            assert "ranks [2] did not arrive" in message and "epoch 4" in message
            assert seconds < TIMEOUT + 10
            message, seconds = out["reshard_timeout"]
            assert "epoch 4 actor reshard [0, 1]->[1, 2]" in message
            assert seconds < TIMEOUT + 10
    # Group rank 0 runs the monitored barrier and names the missing group rank.
    assert "2" in results[0]["reshard_timeout"][0].split("not all ranks arrived")[1]


def test_valid_dp_sizes() -> None:
    assert valid_dp_sizes(BatchConfig(global_batch_size=8, micro_batch_size=2)) == [1, 2, 4]
    assert valid_dp_sizes(BatchConfig(global_batch_size=12, micro_batch_size=1,
                                      max_tokens_per_microbatch=64)) == [1, 2, 3, 4, 6, 12]
    assert valid_dp_sizes(BatchConfig(global_batch_size=8), max_dp=4) == [1, 2, 4]
