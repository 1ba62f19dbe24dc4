"""Acks, heartbeats and progress: timeouts name epoch, ranks and hosts; dead ranks are noticed early."""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from slurm_rl.control import (AckTimeout, AckWaiter, DeadRankError, HeartbeatWriter, RunPaths, TornFileError,
                              append_event, atomic_write_json, read_ack, read_all_progress, read_events,
                              read_heartbeat, stale_ranks, write_ack, write_progress)

HOSTS = {r: f"n{r // 2}" for r in range(8)}


@pytest.fixture
def paths(tmp_path: Path) -> RunPaths:
    return RunPaths(tmp_path / "run").ensure()


def test_ack_timeout_names_epoch_missing_ranks_and_hosts(paths: RunPaths) -> None:
    for rank in range(8):
        if rank not in (3, 6):
            write_ack(paths, 7, rank, HOSTS[rank], seen_at=1.0, applied_at=2.0, figures={"bytes": rank})
    waiter = AckWaiter(paths, 7, range(8), HOSTS, heartbeat_timeout_s=None)
    start = time.monotonic()
    with pytest.raises(AckTimeout) as info:
        waiter.wait(timeout_s=0.3)
    assert 0.3 <= time.monotonic() - start < 5
    assert str(info.value) == ("epoch 7 not acknowledged within 0.3s by 2 of 8 ranks: "
                               "rank 3 (host n1), rank 6 (host n3)")
    assert isinstance(info.value, TimeoutError)


def test_ack_wait_returns_every_ack_written_later(paths: RunPaths) -> None:
    def late_acks() -> None:
        for rank in range(8):
            time.sleep(0.01)
            write_ack(paths, 3, rank, HOSTS[rank], seen_at=time.time(), applied_at=time.time(),
                      figures={"bytes_moved": 1024 * rank, "seconds": 0.5})

    thread = threading.Thread(target=late_acks)
    thread.start()
    acks = AckWaiter(paths, 3, range(8), HOSTS, heartbeat_timeout_s=None).wait(timeout_s=30)
    thread.join()
    assert sorted(acks) == list(range(8))
    assert acks[5]["figures"] == {"bytes_moved": 5120, "seconds": 0.5}
    assert acks[5]["host"] == "n2" and acks[5]["pid"] == os.getpid()


def test_write_ack_creates_a_missing_directory_and_read_checks_identity(paths: RunPaths) -> None:
    write_ack(paths, 11, 2, "n1", seen_at=1.0, applied_at=1.5)
    assert read_ack(paths, 11, 2)["figures"] == {}
    assert read_ack(paths, 11, 3) is None
    atomic_write_json(paths.ack(11, 4), {"epoch": 10, "rank": 4})
    with pytest.raises(TornFileError, match=r"rank-0004.json: field .epoch. is 10, expected 11"):
        read_ack(paths, 11, 4)


def _beating_rank(run_dir: str, rank: int, ready: mp.synchronize.Event) -> None:
    with HeartbeatWriter(RunPaths(run_dir), rank, HOSTS[rank], interval_s=0.05):
        ready.set()
        time.sleep(600)


def test_dead_rank_fails_the_ack_wait_early(paths: RunPaths) -> None:
    ctx = mp.get_context("fork")  # a real process, started cheaply
    ready = ctx.Event()
    victim = ctx.Process(target=_beating_rank, args=(str(paths.run_dir), 5, ready), daemon=True)
    victim.start()
    try:
        assert ready.wait(60), "rank 5 process did not start beating within 60s"
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(30)
    assert read_heartbeat(paths, 5)["pid"] == victim.pid
    with HeartbeatWriter(paths, 1, HOSTS[1], interval_s=0.05):  # a live rank that never acks
        time.sleep(0.6)  # rank 5's heartbeat is now older than the 0.5s timeout
        waiter = AckWaiter(paths, 4, [1, 5], HOSTS, heartbeat_timeout_s=0.5, heartbeat_check_interval_s=0.05)
        start = time.monotonic()
        with pytest.raises(DeadRankError) as info:
            waiter.wait(timeout_s=30)
    assert time.monotonic() - start < 10, "dead rank noticed only after the 30s ack timeout"
    message = str(info.value)
    assert re.search(r"epoch 4 .*rank 5 \(host n2\) last heartbeat \d+\.\d+s ago", message), message
    assert "rank 1" not in message


def test_rank_without_any_heartbeat_is_dead_after_the_timeout(paths: RunPaths) -> None:
    waiter = AckWaiter(paths, 0, [2], HOSTS, heartbeat_timeout_s=0.2, heartbeat_check_interval_s=0.05)
    with pytest.raises(DeadRankError, match=r"rank 2 \(host n1\) has no heartbeat at .*rank-0002.json"):
        waiter.wait(timeout_s=30)


def test_heartbeat_writer_and_stale_ranks(paths: RunPaths) -> None:
    with HeartbeatWriter(paths, 3, "n9", interval_s=0.02) as writer:
        writer.set_epoch(12)
        deadline = time.monotonic() + 10
        while (read_heartbeat(paths, 3) or {}).get("epoch") != 12:
            assert time.monotonic() < deadline, "rank 3 heartbeat never showed epoch 12"
            time.sleep(0.01)
    doc = read_heartbeat(paths, 3)
    assert doc["rank"] == 3 and doc["host"] == "n9" and doc["pid"] == os.getpid()
    assert writer.beats >= 2 and writer.last_error is None
    # the last beat is written on stop, with the process's peak resident memory (this interpreter's ru_maxrss)
    beats = writer.beats
    writer.stop()
    assert writer.beats == beats + 1
    doc = read_heartbeat(paths, 3)
    assert 10 * 2**20 < doc["peak_rss_bytes"] <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert stale_ranks(paths, [3, 4], timeout_s=5) == {4: None}
    stale = stale_ranks(paths, [3], timeout_s=5, now=doc["time"] + 9)
    assert stale[3] == pytest.approx(9)
    assert sorted(os.listdir(paths.heartbeats_dir)) == ["rank-0003.json"]


def test_progress_round_trip(paths: RunPaths) -> None:
    write_progress(paths, 0, {"roles": ["rollout"], "iteration": 4, "rollout_finished": 128})
    write_progress(paths, 2, {"roles": ["actor"], "iteration": 4, "actor_minibatches_done": 3})
    progress = read_all_progress(paths, range(4))
    assert sorted(progress) == [0, 2]
    assert progress[0].counters.rollout_finished == 128 and progress[0].rank == 0 and progress[0].time > 0
    assert progress[2].counters.actor_minibatches_done == 3 and progress[2].roles == ("actor",)


def test_decision_log_skips_an_unfinished_record(paths: RunPaths) -> None:
    append_event(paths, "decision", {"epoch": 1, "latency_s": 0.01})
    append_event(paths, "switch", {"epoch": 1, "latency_s": 0.2})
    with open(paths.decisions, "ab") as log:
        log.write(b'{"kind": "decision", "epo')  # a crash mid-record
    assert [e["kind"] for e in read_events(paths)] == ["decision", "switch"]
    assert read_events(paths, "switch")[0]["latency_s"] == 0.2


def test_ack_timeout_takes_unknown_hosts_from_heartbeats(paths: RunPaths) -> None:
    atomic_write_json(paths.heartbeat(1), {"rank": 1, "host": "gpu-17", "pid": 1, "time": time.time(), "epoch": 0})
    with pytest.raises(AckTimeout, match=r"by 2 of 2 ranks: rank 0 \(host \?\), rank 1 \(host gpu-17\)$"):
        AckWaiter(paths, 0, [0, 1], {}, heartbeat_timeout_s=None).wait(timeout_s=0.05)


def test_ack_poll_opens_one_path_per_poll_while_waiting(paths: RunPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real_open = os.open
    for rank in (0, 1, 2, 5):
        write_ack(paths, 2, rank, HOSTS[rank], seen_at=1.0, applied_at=1.0)
    waiter = AckWaiter(paths, 2, range(8), HOSTS)

    def counting_open(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        opened.append(os.path.basename(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    assert not waiter.poll(full=False)
    assert opened == ["rank-0000.json", "rank-0001.json", "rank-0002.json", "rank-0003.json"]
    opened.clear()
    for _ in range(10):
        assert not waiter.poll(full=False)
    assert opened == ["rank-0003.json"] * 10
    opened.clear()
    assert not waiter.poll(full=True)
    assert opened == ["rank-0003.json", "rank-0004.json", "rank-0005.json", "rank-0006.json", "rank-0007.json"]
    assert waiter.missing() == [3, 4, 6, 7]
    monkeypatch.undo()
    for rank in (3, 4, 6, 7):
        write_ack(paths, 2, rank, HOSTS[rank], seen_at=1.0, applied_at=1.0)
    assert sorted(waiter.wait(timeout_s=5)) == list(range(8))
