"""The coordinator lease: one coordinator per run, with a generation number for fencing.

``control/lease.lock`` is held with ``flock`` (via filelock) for the coordinator's lifetime; the
kernel drops it when the process dies, however it dies. ``control/lease`` holds
``{"generation": N, "holder": {"host", "pid", "started_at"}}`` and N grows by one per acquisition.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import filelock

from slurm_rl.control.atomic import atomic_write_json, read_json, write_json_exclusive
from slurm_rl.control.errors import LeaseHeldError, TornFileError
from slurm_rl.control.numbered import lease_generation
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.validate import check_fields


def read_lease(paths: RunPaths) -> dict[str, Any] | None:
    """The lease document, or None if no coordinator ever started."""
    try:
        doc = read_json(paths.lease, fs=paths.fs)
    except FileNotFoundError:
        return None
    check_fields(doc, paths.lease, {"generation": "count", "holder": "object?"})
    return doc


def _holder_text(paths: RunPaths) -> str:
    try:
        doc = read_lease(paths)
    except TornFileError as exc:
        return f"an unknown holder ({exc})"
    holder = (doc or {}).get("holder") or {}
    started = holder.get("started_at")
    since = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
             if isinstance(started, (int, float)) else "?")
    return (f"host {holder.get('host', '?')} pid {holder.get('pid', '?')} "
            f"(generation {(doc or {}).get('generation', '?')}, since {since})")


def _highest_claim(paths: RunPaths) -> int:
    """Highest generation ever claimed (lists ``control/generations``: acquisition only)."""
    try:
        names = os.listdir(paths.generations_dir)
    except FileNotFoundError:
        return 0
    return max((int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit()), default=0)


def _claim_generation(paths: RunPaths, generation: int, holder: dict[str, Any]) -> None:
    """Claim ``generation`` exclusively (hard link: atomic even where flock is only node-local)."""
    paths.generations_dir.mkdir(parents=True, exist_ok=True)
    claim = paths.generation_claim(generation)
    try:
        write_json_exclusive(claim, {"generation": generation, "holder": holder}, fs=paths.fs)
    except FileExistsError:
        try:
            other = read_json(claim, fs=paths.fs).get("holder") or {}
        except (OSError, TornFileError):
            other = {}
        raise LeaseHeldError(f"coordinator generation {generation} was claimed concurrently by host "
                             f"{other.get('host', '?')} pid {other.get('pid', '?')} ({claim}); the lock "
                             f"{paths.lease_lock} is not coherent across nodes here (NFS local_lock?)") from None


class CoordinatorLease:
    """Context manager holding the coordinator lease; ``generation`` is valid while held.

    Acquisition never waits: if another process holds the lock, :class:`LeaseHeldError` names it.
    Each generation is also claimed once, exclusively, as ``control/generations/NNNNNN.json``, so
    two coordinators never share a generation even where ``flock`` is only node-local.
    Release keeps the generation number (the holder becomes null).
    """

    def __init__(self, paths: RunPaths, host: str | None = None) -> None:
        self.paths = paths
        self.host = host or socket.gethostname()
        self.generation: int | None = None
        self._lock = filelock.FileLock(str(paths.lease_lock), timeout=0, mode=0o600)

    def acquire(self) -> int:
        """Take the lease and bump the generation; returns the new generation."""
        self.paths.control.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except filelock.Timeout:
            raise LeaseHeldError(f"coordinator lease {self.paths.lease_lock} is held by {_holder_text(self.paths)}; "
                                 f"refusing to start a second coordinator") from None
        try:
            holder = {"host": self.host, "pid": os.getpid(), "started_at": time.time()}
            generation = max(lease_generation(self.paths), _highest_claim(self.paths)) + 1
            _claim_generation(self.paths, generation, holder)
            atomic_write_json(self.paths.lease, {"generation": generation, "holder": holder}, fs=self.paths.fs)
        except BaseException:
            self._lock.release()
            raise
        self.generation = generation
        return generation

    def release(self) -> None:
        """Give the lease up; the generation stays in ``control/lease``."""
        if self.generation is None:
            return
        try:
            atomic_write_json(self.paths.lease, {"generation": self.generation, "holder": None,
                                                 "released_at": time.time()}, fs=self.paths.fs)
        finally:
            self.generation = None
            self._lock.release()

    @property
    def held(self) -> bool:
        return self.generation is not None

    def __enter__(self) -> "CoordinatorLease":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
