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

from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.epochs import lease_generation
from slurm_rl.control.errors import LeaseHeldError, TornFileError
from slurm_rl.control.paths import RunPaths


def read_lease(paths: RunPaths) -> dict[str, Any] | None:
    """The lease document, or None if no coordinator ever started."""
    try:
        return read_json(paths.lease)
    except FileNotFoundError:
        return None


def _holder_text(paths: RunPaths) -> str:
    try:
        doc = read_lease(paths)
    except TornFileError as exc:
        return f"an unknown holder ({exc})"
    holder = (doc or {}).get("holder") or {}
    return (f"host {holder.get('host', '?')} pid {holder.get('pid', '?')} "
            f"(generation {(doc or {}).get('generation', '?')}, started_at {holder.get('started_at', '?')})")


class CoordinatorLease:
    """Context manager holding the coordinator lease; ``generation`` is valid while held.

    Acquisition never waits: if another process holds the lock, :class:`LeaseHeldError` names it.
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
            generation = lease_generation(self.paths) + 1
            atomic_write_json(self.paths.lease, {"generation": generation, "holder": {
                "host": self.host, "pid": os.getpid(), "started_at": time.time()}})
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
                                                 "released_at": time.time()})
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
