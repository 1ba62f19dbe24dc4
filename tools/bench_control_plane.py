#!/usr/bin/env python
"""Benchmark the file control plane: publish -> all-acked latency and idle file-system load per rank.

For each N in --ranks, start N worker processes (this script in ``worker`` mode). Each runs the
real ``EpochWatcher`` (default poll intervals) + ``write_ack`` + ``HeartbeatWriter`` (1 s). The
main process takes the coordinator lease and publishes epochs spaced --spacing-ms apart, timing
``publish`` + ``AckWaiter.wait`` per epoch. Then it publishes an "idle" epoch, leaves the ranks
idle for --idle-s, and publishes an "idle-end" epoch (its latency is the after-idle case).

Idle load is counted two ways: (1) instrumented counters reported by every rank in its ack
(``EpochWatcher.polls``: one ``open`` each; heartbeat writes: 4 syscalls each -- open(tmp),
write, close, rename); (2) ``strace -c`` attached to all threads of one worker during the idle
window, counting file-system syscalls (and all syscalls). Prints one JSON document.

``--slow-fs-ms 0 30`` repeats every N with each file operation of the coordinator and the ranks
delayed by that many ms (``SLURM_RL_FS_FAULTS=delay_ms=...``, the hook of ``slurm_rl.fsio``, as
on a loaded NFS or Lustre) and adds ``slow_fs``: the slowdown of each figure against 0 ms.

    python tools/bench_control_plane.py --ranks 8 32 64 --epochs 30
    python tools/bench_control_plane.py --ranks 8 --epochs 20 --slow-fs-ms 0 20 50 --no-strace
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_rl.control import (AckWaiter, CoordinatorLease, Epoch, EpochStore, EpochWatcher,  # noqa: E402
                              HeartbeatWriter, RunPaths, stale_ranks, write_ack)
from slurm_rl.fsio import FAULTS_ENV, FileSystem  # noqa: E402

FS_SYSCALLS = {"openat", "open", "read", "write", "close", "fsync", "fdatasync", "rename", "renameat", "renameat2",
               "unlink", "unlinkat", "stat", "lstat", "fstat", "newfstatat", "statx", "mkdir", "mkdirat",
               "getdents64", "lseek", "link", "linkat", "access", "faccessat", "faccessat2"}
PATH_SYSCALLS = {"openat", "open", "rename", "renameat", "renameat2", "unlink", "unlinkat", "stat", "lstat",
                 "newfstatat", "statx", "mkdir", "mkdirat", "link", "linkat", "access", "faccessat", "faccessat2"}
SYSCALLS_PER_HEARTBEAT = 4  # open(tmp, O_EXCL), write, close, rename (heartbeats are not fsynced)


def worker(run_dir: str, rank: int, host: str) -> None:
    """One emulated rank: follow epochs, ack each, beat every second; report idle counters in acks."""
    paths = RunPaths(run_dir)
    watcher = EpochWatcher(paths, start_after=-1, rank=rank)
    idle_mark: tuple[float, int, int] | None = None
    with HeartbeatWriter(paths, rank, host) as heartbeat:
        while True:
            epoch = watcher.wait_next(timeout_s=300, what="the next benchmark epoch from the coordinator")
            seen_at = time.time()
            heartbeat.set_epoch(epoch.epoch)
            figures: dict[str, Any] = {}
            if epoch.reason == "idle-end" and idle_mark is not None:
                start, polls, beats = idle_mark
                figures = {"idle_s": time.monotonic() - start, "idle_polls": watcher.polls - polls,
                           "idle_beats": heartbeat.beats - beats}
            write_ack(paths, epoch.epoch, rank, host, seen_at=seen_at, applied_at=time.time(), figures=figures)
            if epoch.reason == "idle":
                idle_mark = (time.monotonic(), watcher.polls, heartbeat.beats)
            if epoch.reason == "stop":
                return


class Coordinator:
    """Publishes benchmark epochs under the lease and times publish -> all acked."""

    def __init__(self, paths: RunPaths, ranks: list[int], hosts: dict[int, str], generation: int) -> None:
        self.paths, self.ranks, self.hosts, self.generation = paths, ranks, hosts, generation
        self.store = EpochStore(paths)
        self.next = 0

    def publish_and_wait(self, reason: str, timeout_s: float) -> tuple[float, dict[int, dict[str, Any]]]:
        n = self.next
        epoch = Epoch(epoch=n, generation=self.generation, created_at=time.time(), reason=reason, iteration=n,
                      boundary="iteration", placement={"rollout": {"ranks": self.ranks, "dp": len(self.ranks),
                                                                   "tp": 1, "pp": 1}},
                      previous=n - 1 if n else None)
        start = time.perf_counter()
        self.store.publish(epoch, self.generation)
        acks = AckWaiter(self.paths, n, self.ranks, self.hosts).wait(timeout_s)
        self.next += 1
        return time.perf_counter() - start, acks


def strace_idle(pid: int, seconds: float, out: Path) -> dict[str, Any] | None:
    """Attach ``strace -c`` to every thread of ``pid`` for ``seconds``; syscall counts per second."""
    if shutil.which("strace") is None:
        return None
    tids = os.listdir(f"/proc/{pid}/task")
    cmd = ["strace", "-c", "-o", str(out)] + [arg for tid in tids for arg in ("-p", tid)]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    counts: dict[str, int] = {}
    for line in out.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            counts[parts[-1]] = int(parts[3])
    fs = {k: v for k, v in counts.items() if k in FS_SYSCALLS}
    return {"seconds": seconds, "threads_traced": len(tids),
            "fs_syscalls_per_s": round(sum(fs.values()) / seconds, 2),
            "path_lookups_per_s": round(sum(v for k, v in counts.items() if k in PATH_SYSCALLS) / seconds, 2),
            "all_syscalls_per_s": round(sum(counts.values()) / seconds, 2),
            "fs_syscalls": fs}


def cpu_seconds(pids: list[int]) -> float:
    """User+system CPU seconds consumed so far by ``pids`` (from /proc; 0 where unreadable)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def run_one(n_ranks: int, args: argparse.Namespace, base: Path, slow_fs_ms: float = 0.0) -> dict[str, Any]:
    name = f"ranks-{n_ranks}" if not slow_fs_ms else f"ranks-{n_ranks}-slow-{slow_fs_ms:g}ms"
    fs = FileSystem(delay_s=slow_fs_ms / 1000.0)
    paths = RunPaths(base / name, fs=fs).ensure()
    ranks = list(range(n_ranks))
    hosts = {r: f"{socket.gethostname()}-{r // 8}" for r in ranks}
    env = {**os.environ, FAULTS_ENV: f"delay_ms={slow_fs_ms:g}"} if slow_fs_ms else dict(os.environ)
    procs = [subprocess.Popen([sys.executable, __file__, "worker", str(paths.run_dir), str(r), hosts[r]], env=env)
             for r in ranks]
    rng = random.Random(n_ranks)
    try:
        with CoordinatorLease(paths) as lease:
            coord = Coordinator(paths, ranks, hosts, lease.generation)
            deadline = time.monotonic() + 300
            while stale_ranks(paths, ranks, timeout_s=60):  # every rank has beaten once
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{n_ranks} ranks: heartbeats missing after 300s: "
                                       f"{sorted(stale_ranks(paths, ranks, 60))}")
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a worker exited early: {[p.returncode for p in procs]}")
                time.sleep(0.1)
            coord.publish_and_wait("warmup", timeout_s=120)
            latencies, detect = [], []
            load_before, cpu_before = os.getloadavg()[0], cpu_seconds([p.pid for p in procs])
            for _ in range(args.epochs):
                time.sleep(rng.uniform(args.spacing_ms[0], args.spacing_ms[1]) / 1000)
                latency, acks = coord.publish_and_wait("switch", timeout_s=60)
                latencies.append(latency)
                created = coord.store.read(coord.next - 1).created_at
                detect.extend(ack["seen_at"] - created for ack in acks.values())
            worker_cpu = cpu_seconds([p.pid for p in procs]) - cpu_before
            load_after = os.getloadavg()[0]
            coord.publish_and_wait("idle", timeout_s=60)
            time.sleep(0.5)  # let the watchers back off to the idle interval
            strace = strace_idle(procs[0].pid, args.idle_s - 1.0, base / f"strace-{n_ranks}.txt") \
                if args.strace else None
            if not args.strace:
                time.sleep(args.idle_s - 1.0)
            time.sleep(0.5)
            idle_end_latency, idle_acks = coord.publish_and_wait("idle-end", timeout_s=60)
            coord.publish_and_wait("stop", timeout_s=60)
    finally:
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    per_rank = [(a["figures"]["idle_polls"] + SYSCALLS_PER_HEARTBEAT * a["figures"]["idle_beats"])
                / a["figures"]["idle_s"] for a in idle_acks.values()]
    polls = [a["figures"]["idle_polls"] / a["figures"]["idle_s"] for a in idle_acks.values()]
    ms = lambda xs, q: round(percentile(xs, q) * 1000, 2)  # noqa: E731
    return {
        "ranks": n_ranks, "epochs": args.epochs, "slow_fs_ms": slow_fs_ms,
        "publish_to_all_acked_ms": {"p50": ms(latencies, 50), "p90": ms(latencies, 90), "p99": ms(latencies, 99),
                                    "max": ms(latencies, 100), "mean": round(statistics.mean(latencies) * 1000, 2)},
        "rank_detection_ms": {"p50": ms(detect, 50), "p99": ms(detect, 99), "max": ms(detect, 100)},
        "worker_cpu_ms_per_rank_per_epoch": round(worker_cpu * 1000 / n_ranks / args.epochs, 3),
        "host_load_avg_1min": [round(load_before, 1), round(load_after, 1)],
        "after_idle_publish_to_all_acked_ms": round(idle_end_latency * 1000, 2),
        "idle_counter": {"ops_per_rank_s_mean": round(statistics.mean(per_rank), 2),
                         "ops_per_rank_s_max": round(max(per_rank), 2),
                         "epoch_polls_per_rank_s_mean": round(statistics.mean(polls), 2),
                         "counted_as": f"1 open per poll + {SYSCALLS_PER_HEARTBEAT} syscalls per heartbeat"},
        "idle_strace_rank0": strace,
    }


def slow_fs_summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per N and delay: publish-to-all-acked and detection figures and their ratio to the 0 ms run."""
    base = {r["ranks"]: r for r in results if not r["slow_fs_ms"]}
    out = []
    for r in results:
        ref = base.get(r["ranks"])
        p50 = r["publish_to_all_acked_ms"]["p50"]
        row = {"ranks": r["ranks"], "slow_fs_ms": r["slow_fs_ms"], "publish_to_all_acked_p50_ms": p50,
               "publish_to_all_acked_p99_ms": r["publish_to_all_acked_ms"]["p99"],
               "rank_detection_p50_ms": r["rank_detection_ms"]["p50"],
               "after_idle_publish_to_all_acked_ms": r["after_idle_publish_to_all_acked_ms"]}
        if ref is not None and ref["publish_to_all_acked_ms"]["p50"] > 0:
            row["slowdown_p50_x"] = round(p50 / ref["publish_to_all_acked_ms"]["p50"], 2)
            row["added_p50_ms"] = round(p50 - ref["publish_to_all_acked_ms"]["p50"], 2)
        out.append(row)
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--spacing-ms", type=float, nargs=2, default=[100.0, 200.0])
    parser.add_argument("--idle-s", type=float, default=6.0)
    parser.add_argument("--no-strace", dest="strace", action="store_false")
    parser.add_argument("--run-dir", type=Path, default=None, help="where to put run dirs (default: a temp dir)")
    parser.add_argument("--slow-fs-ms", type=float, nargs="+", default=[0.0],
                        help="delay every file operation by this many ms (one run per value and N)")
    args = parser.parse_args()
    base = args.run_dir or Path(tempfile.mkdtemp(prefix="bench-control-"))
    results = [run_one(n, args, base, ms) for n in args.ranks for ms in args.slow_fs_ms]
    doc: dict[str, Any] = {"benchmark": "control_plane", "host": socket.gethostname(), "cpus": os.cpu_count(),
                           "run_dir": str(base), "poll_interval_s": EpochWatcher(RunPaths(base)).poll_interval_s,
                           "idle_poll_interval_s": EpochWatcher(RunPaths(base)).idle_poll_interval_s,
                           "results": results}
    if any(args.slow_fs_ms):
        doc["slow_fs"] = slow_fs_summary(results)
    print(json.dumps(doc, indent=2))
    if args.run_dir is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
