"""Coordinator lease: a second coordinator is refused, a crash hands over generation+1, old epochs are fenced."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

import slurm_rl.control.lease as lease_module
from slurm_rl.control import (CoordinatorLease, Epoch, EpochStore, EpochWatcher, FencedEpochError, LeaseHeldError,
                              RunPaths, read_lease, write_json_exclusive)


def _epoch(n: int, generation: int) -> Epoch:
    return Epoch(epoch=n, generation=generation, created_at=time.time(), reason=f"gen-{generation}", iteration=n,
                 boundary="iteration", placement={"rollout": {"ranks": [0, 1, 2, 3], "dp": 4, "tp": 1, "pp": 1}},
                 previous=n - 1 if n else None)


def _coordinator(run_dir: str, host: str, ready: mp.synchronize.Event) -> None:
    """Take the lease, publish epoch 0, then hold the lease until killed."""
    paths = RunPaths(run_dir)
    with CoordinatorLease(paths, host=host) as lease:
        EpochStore(paths).publish(_epoch(0, lease.generation), lease.generation)
        ready.set()
        time.sleep(600)


def _try_lease(run_dir: str, out: mp.Queue) -> None:
    try:
        with CoordinatorLease(RunPaths(run_dir), host="second-host"):
            out.put("acquired")
    except LeaseHeldError as exc:
        out.put(f"refused: {exc}")


def test_second_coordinator_refused_then_crash_hands_over(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run").ensure()
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    holder = ctx.Process(target=_coordinator, args=(str(paths.run_dir), "node-a", ready), daemon=True)
    holder.start()
    try:
        assert ready.wait(60), "coordinator process did not take the lease within 60s"
        assert read_lease(paths)["generation"] == 1

        second = ctx.Process(target=_try_lease, args=(str(paths.run_dir), out))
        second.start()
        answer = out.get(timeout=60)
        second.join(30)
        assert answer.startswith("refused: ")
        assert "host node-a" in answer and f"pid {holder.pid}" in answer and "generation 1" in answer

        with pytest.raises(LeaseHeldError, match=f"host node-a pid {holder.pid}"):
            CoordinatorLease(paths).acquire()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
    assert holder.exitcode == -signal.SIGKILL

    # the kernel dropped the flock; the crashed holder is still named in the lease file
    assert read_lease(paths)["holder"]["pid"] == holder.pid
    with CoordinatorLease(paths, host="node-b") as lease:
        assert lease.generation == 2
        holder_doc = read_lease(paths)["holder"]
        assert (holder_doc["host"], holder_doc["pid"]) == ("node-b", os.getpid())
        store = EpochStore(paths)
        store.publish(_epoch(1, 2), lease.generation)
        # the old coordinator (generation 1) cannot publish any more
        with pytest.raises(FencedEpochError, match=r"generation 1: .*lease is at generation 2"):
            store.publish(_epoch(2, 1), 1)
        with pytest.raises(FencedEpochError, match="epoch 2 .*generation 1 .*lease generation 2"):
            store.publish(_epoch(2, 1), 2)
    # release keeps the generation; the next coordinator gets 3
    assert read_lease(paths)["generation"] == 2 and read_lease(paths)["holder"] is None
    with CoordinatorLease(paths) as lease:
        assert lease.generation == 3


def test_watcher_fences_an_epoch_of_an_older_generation(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run").ensure()
    store = EpochStore(paths)
    with CoordinatorLease(paths) as first:
        store.publish(_epoch(0, first.generation), first.generation)
    with CoordinatorLease(paths) as second:
        store.publish(_epoch(1, second.generation), second.generation)
    # a stale coordinator that bypasses publish's lease check still cannot move the ranks
    write_json_exclusive(paths.epoch(2), _epoch(2, 1).to_json())

    watcher = EpochWatcher(paths, start_after=-1, rank=5)
    assert watcher.poll().generation == 1
    assert watcher.poll().generation == 2
    with pytest.raises(FencedEpochError, match=r"rank 5: epoch 2 .*000002.json.* generation 1, older than generation 2"):
        watcher.poll()
    assert watcher.current == 1  # the fenced epoch is not applied

    late = EpochWatcher(paths, start_after=1, min_generation=2, rank=6)
    with pytest.raises(FencedEpochError, match="rank 6"):
        late.poll()


def test_generation_is_claimed_once_even_if_the_lock_is_not_coherent(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    paths = RunPaths(tmp_path / "run").ensure()
    with CoordinatorLease(paths, host="node-a") as lease:
        assert lease.generation == 1
    assert paths.generation_claim(1).is_file()

    # another node claimed generation 2 but crashed before writing control/lease: skip past it
    write_json_exclusive(paths.generation_claim(2), {"generation": 2, "holder": {"host": "node-c", "pid": 7}})
    with CoordinatorLease(paths) as lease:
        assert lease.generation == 3

    # two coordinators racing where flock is node-local: both compute generation 4, one loses
    monkeypatch.setattr(lease_module, "_highest_claim", lambda _paths: 0)
    write_json_exclusive(paths.generation_claim(4), {"generation": 4, "holder": {"host": "node-d", "pid": 8}})
    with pytest.raises(LeaseHeldError, match=r"generation 4 was claimed concurrently by host node-d pid 8"):
        CoordinatorLease(paths).acquire()
    assert read_lease(paths)["generation"] == 3  # the loser changed nothing and released the lock
    monkeypatch.undo()
    with CoordinatorLease(paths) as lease:
        assert lease.generation == 5
