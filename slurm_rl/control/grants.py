"""A co-execution group's control files: grants (like epochs), member states, releases.

The group directory is laid out like a run directory (its ``control/lease`` and generations fence
the group scheduler exactly as they fence a run's coordinator):

- ``control/grants/NNNNNN.json`` — immutable, densely numbered, written once by the lease holder:
  ``{"grant", "generation", "created_at", "events", "pools": {pool: {"slots": {slot: holder|null},
  "turn", "cursor"}}, "done": {job: {pool: iteration}}}``, a holder being
  ``{"job", "iteration", "revoked"}``. A rank polls exactly the next number (one ``open``).
  Published and read through ``control.numbered.NumberedFiles``, as epochs are.
- ``control/members/<job>/rank-RRRR.json`` — a rank's state, rewritten atomically (waiting for a
  grant, running, parked) with what the group scheduler needs (rollout samples finished).
- ``control/releases/<job>/<pool>-IIIIII/slot-SSSS.json`` — written once by the rank on that slot
  after it parked its state for that phase: the slot is free. Figures of the switch ride along.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from slurm_rl.control.atomic import JsonCache, atomic_write_json, read_json, write_json_exclusive
from slurm_rl.control.errors import TornFileError
from slurm_rl.control.numbered import NumberedFiles
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.validate import check_equal, check_fields

JOB_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_-")


class GroupPaths(RunPaths):
    """Paths of a group directory (a :class:`RunPaths` for its lease, generations and events)."""

    @property
    def grants_dir(self) -> Path:
        return self.control / "grants"

    def grant(self, n: int) -> Path:
        return self.grants_dir / f"{n:06d}.json"

    def members_dir(self, job: str) -> Path:
        return self.control / "members" / _job(job)

    def member(self, job: str, rank: int) -> Path:
        return self.members_dir(job) / f"rank-{rank:04d}.json"

    def releases_dir(self, job: str, pool: str, iteration: int) -> Path:
        return self.control / "releases" / _job(job) / f"{pool}-{iteration:06d}"

    def release(self, job: str, pool: str, iteration: int, slot: int) -> Path:
        return self.releases_dir(job, pool, iteration) / f"slot-{slot:04d}.json"

    def job_dir(self, job: str) -> Path:
        """RUN_DIR of member ``job``."""
        return self.run_dir / "jobs" / _job(job)


def _job(job: str) -> str:
    if not job or not set(job) <= JOB_NAME_CHARS:
        raise ValueError(f"job name {job!r}: allowed are lower-case letters, digits, '_' and '-'")
    return job


@dataclass(frozen=True)
class Grant:
    """One published grant: its number, the publisher's generation, and the holdings (JSON)."""

    grant: int
    generation: int
    created_at: float
    pools: Mapping[str, Any]
    done: Mapping[str, Any]
    events: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"grant": self.grant, "generation": self.generation, "created_at": self.created_at,
                "events": list(self.events), "pools": self.pools, "done": self.done}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str) -> "Grant":
        """Validate the structure (types of every field); ``TornFileError`` naming the field."""
        def bad(field: str, value: Any, want: str) -> TornFileError:
            return TornFileError(f"{where}: {field} must be {want}, got {value!r}")

        for key in ("grant", "generation"):
            if not isinstance(doc.get(key), int) or isinstance(doc.get(key), bool) or doc[key] < 0:
                raise bad(key, doc.get(key), "a non-negative int")
        created_at = doc.get("created_at", 0.0)
        if not isinstance(created_at, (int, float)) or isinstance(created_at, bool):
            raise bad("created_at", created_at, "a number")
        events = doc.get("events", [])
        if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
            raise bad("events", events, "a list of strings")
        pools = doc.get("pools")
        if not isinstance(pools, dict):
            raise bad("pools", pools, "a mapping")
        for pool, pg in pools.items():
            if not isinstance(pg, dict) or not isinstance(pg.get("slots"), dict):
                raise bad(f"pools.{pool}.slots", pg, "a mapping of slot -> holder")
            for slot, holder in pg["slots"].items():
                if not str(slot).isdigit():
                    raise bad(f"pools.{pool}.slots", slot, "digit-only slot keys")
                if holder is not None and not (isinstance(holder, dict) and isinstance(holder.get("job"), str)
                                               and isinstance(holder.get("iteration"), int)
                                               and not isinstance(holder.get("iteration"), bool)):
                    raise bad(f"pools.{pool}.slots.{slot}", holder, "null or {job, iteration, revoked}")
        done = doc.get("done")
        if not isinstance(done, dict):
            raise bad("done", done, "a mapping job -> pool -> iteration")
        return cls(grant=doc["grant"], generation=doc["generation"], created_at=float(created_at),
                   pools=pools, done=done, events=tuple(events))


def grant_files(paths: GroupPaths) -> NumberedFiles[Grant]:
    """The grants of a group: ``grants/NNNNNN.json``, decoded as :class:`Grant`."""
    return NumberedFiles(paths, paths.grants_dir, kind="grant", number_key="grant", decode=Grant.from_json,
                         holder="group scheduler")


def read_grant(paths: GroupPaths, n: int) -> Grant:
    """Grant ``n`` (``FileNotFoundError`` when not published)."""
    return grant_files(paths).read(n)


def grant_numbers(paths: GroupPaths) -> list[int]:
    """Published grant numbers, sorted (lists the directory: startup and inspection only)."""
    return grant_files(paths).numbers()


def publish_grant(paths: GroupPaths, grant: Grant, generation: int) -> None:
    """Publish ``grant`` exclusively as lease holder ``generation`` (fencing as for epochs)."""
    grant_files(paths).publish(grant.grant, grant.to_json(), generation)


class GrantWatcher:
    """A rank's view of the grants: polls exactly the next number; refuses older generations."""

    def __init__(self, paths: GroupPaths, poll_interval_s: float, who: str) -> None:
        self.paths, self.poll_interval_s, self.who = paths, poll_interval_s, who
        self.files = grant_files(paths)
        self.latest: Grant | None = None
        self.highest_generation = 0
        self._last_poll = -float("inf")

    def poll(self, force: bool = False) -> Grant | None:
        """Advance over every grant published since the last poll; the latest one (or None)."""
        if not force and time.monotonic() - self._last_poll < self.poll_interval_s:
            return self.latest
        self._last_poll = time.monotonic()
        while True:
            n = 0 if self.latest is None else self.latest.grant + 1
            try:
                grant = self.files.read(n)
            except FileNotFoundError:
                return self.latest
            self.files.check_order(n, grant.generation, self.highest_generation, self.who)
            self.highest_generation = grant.generation
            self.latest = grant


def write_member(paths: GroupPaths, job: str, rank: int, doc: dict[str, Any]) -> None:
    """Rewrite rank ``rank`` of ``job``'s state (atomic, not fsynced: it is rewritten often)."""
    paths.members_dir(job).mkdir(parents=True, exist_ok=True)
    atomic_write_json(paths.member(job, rank), {**doc, "job": job, "rank": rank, "time": time.time()}, durable=False,
                      fs=paths.fs)


def read_members(paths: GroupPaths, job: str, cache: JsonCache | None = None) -> dict[int, dict[str, Any]]:
    """Every rank state of ``job``. Files are replaced atomically, so one that is not a complete
    document of that job and rank is corrupt: ``TornFileError`` naming it and the field.
    ``cache``: a poller's :class:`~slurm_rl.control.atomic.JsonCache` (unchanged files are not
    parsed again; the documents are then shared between reads)."""
    out: dict[int, dict[str, Any]] = {}
    directory = os.fspath(paths.members_dir(job))
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return out
    cache = cache or JsonCache()
    for name in names:
        if name.startswith("rank-") and name.endswith(".json") and name[5:-5].isdigit():
            path, rank = os.path.join(directory, name), int(name[5:-5])

            def check(doc: dict[str, Any], path: str = path, rank: int = rank) -> dict[str, Any]:
                check_equal(doc, path, job=job, rank=rank)
                check_fields(doc, path, {"time": "number"})
                return doc

            try:
                out[rank] = cache.read(path, check, fs=paths.fs)
            except FileNotFoundError:
                continue
    return out


def write_release(paths: GroupPaths, job: str, pool: str, iteration: int, slot: int, doc: dict[str, Any]) -> None:
    """Record that ``job``'s rank on ``slot`` parked after its ``pool`` phase of ``iteration``."""
    paths.releases_dir(job, pool, iteration).mkdir(parents=True, exist_ok=True)
    write_json_exclusive(paths.release(job, pool, iteration, slot),
                         {**doc, "job": job, "pool": pool, "iteration": iteration, "slot": slot}, fs=paths.fs)


def read_releases(paths: GroupPaths, job: str, pool: str, iteration: int) -> dict[int, dict[str, Any]]:
    """The releases of one phase, by slot."""
    d = paths.releases_dir(job, pool, iteration)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return {}
    out = {}
    for name in names:
        if name.startswith("slot-") and name.endswith(".json") and name[5:-5].isdigit():
            doc = read_json(d / name, fs=paths.fs)
            check_equal(doc, d / name, job=job, pool=pool, iteration=iteration, slot=int(name[5:-5]))
            out[int(name[5:-5])] = doc
    return out
