"""Per-rank liveness files: ``heartbeats/rank-NNNN.json`` rewritten every ``interval_s``.

Each beat also carries the rank's peak resident memory so far (``peak_rss_bytes``, the kernel's
``ru_maxrss``: host memory, shared pages of the interpreter it was forked from included); the last
beat, written when the rank stops, is its peak over the run.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Iterable
from typing import Any

from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.validate import check_equal, check_fields

DEFAULT_HEARTBEAT_INTERVAL_S = 1.0


class HeartbeatWriter:
    """A daemon thread rewriting this rank's heartbeat (atomic, no fsync: liveness needs no durability).

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Write errors (e.g. a shared
    file system hiccup) are kept in ``last_error`` and retried at the next beat.
    """

    def __init__(self, paths: RunPaths, rank: int, host: str, interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S) -> None:
        if interval_s <= 0:
            raise ValueError(f"heartbeat interval must be > 0, got {interval_s}")
        self.paths = paths
        self.rank = rank
        self.host = host
        self.interval_s = interval_s
        self.epoch: int | None = None
        self.beats = 0
        self.last_error: OSError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-rank-{rank}", daemon=True)

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch this rank has applied; it appears in the next beat."""
        self.epoch = epoch

    def beat(self) -> None:
        """Write one heartbeat now."""
        doc: dict[str, Any] = {"rank": self.rank, "host": self.host, "pid": os.getpid(),
                               "time": time.time(), "epoch": self.epoch,
                               "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        atomic_write_json(self.paths.heartbeat(self.rank), doc, durable=False, fs=self.paths.fs)
        self.beats += 1

    def _run(self) -> None:
        while True:
            try:
                self.beat()
                self.last_error = None
            except OSError as exc:
                self.last_error = exc
            if self._stop.wait(self.interval_s):
                return

    def start(self) -> "HeartbeatWriter":
        """Start beating (the first beat is written before this returns)."""
        self.paths.heartbeats_dir.mkdir(parents=True, exist_ok=True)
        self.beat()
        self._stop.clear()
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and wait for it (at most ``timeout_s``), then write a last beat (the rank's
        peak memory over the run)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        try:
            self.beat()
        except OSError as exc:
            self.last_error = exc

    def __enter__(self) -> "HeartbeatWriter":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_heartbeat(paths: RunPaths, rank: int) -> dict[str, Any] | None:
    """The rank's last heartbeat document, or None if it never wrote one.

    ``TornFileError`` naming the file and field if it is not a heartbeat of that rank."""
    path = paths.heartbeat(rank)
    try:
        doc = read_json(path, fs=paths.fs)
    except FileNotFoundError:
        return None
    check_equal(doc, path, rank=rank)
    check_fields(doc, path, {"time": "number"}, {"host": "str", "pid": "int", "epoch": "int?", "peak_rss_bytes": "int?"})
    return doc


def stale_ranks(paths: RunPaths, ranks: Iterable[int], timeout_s: float, now: float | None = None) -> dict[int, float | None]:
    """Ranks whose heartbeat is older than ``timeout_s`` -> age in seconds (None: no heartbeat file).

    Ages compare the writer's wall clock with ``now`` (default: this host's clock), so hosts are
    assumed NTP-synchronised to well under ``timeout_s``. One ``open`` per rank.
    """
    now = time.time() if now is None else now
    stale: dict[int, float | None] = {}
    for rank in ranks:
        doc = read_heartbeat(paths, rank)
        if doc is None:
            stale[rank] = None
            continue
        age = now - doc["time"]
        if age > timeout_s:
            stale[rank] = age
    return stale
