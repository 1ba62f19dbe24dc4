"""Epoch acknowledgements: ranks write ``acks/NNNNNN/rank-NNNN.json``; the coordinator waits for all."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.errors import AckTimeout, DeadRankError, TornFileError
from slurm_rl.control.heartbeats import read_heartbeat, stale_ranks
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.validate import check_equal, check_fields

DEFAULT_ACK_POLL_INTERVAL_S = 0.005
DEFAULT_HEARTBEAT_TIMEOUT_S = 30.0
DEFAULT_HEARTBEAT_CHECK_INTERVAL_S = 1.0
ACK_FIELDS = {"host": "str", "seen_at": "number", "applied_at": "number", "figures": "object", "time": "number"}


def write_ack(paths: RunPaths, epoch: int, rank: int, host: str, seen_at: float, applied_at: float,
              figures: Mapping[str, Any] | None = None, *, durable: bool = False) -> None:
    """Record that ``rank`` saw ``epoch`` at ``seen_at`` and applied it at ``applied_at`` (atomic rename).

    ``figures`` carries transition measurements (bytes moved, seconds, ...). Acks are not fsynced
    by default: they are observations the coordinator reads within seconds, on the switch's
    critical path; a storage crash loses at most acks that a restarted coordinator re-awaits.
    """
    doc = {"epoch": epoch, "rank": rank, "host": host, "pid": os.getpid(), "seen_at": seen_at,
           "applied_at": applied_at, "figures": dict(figures or {}), "time": time.time()}
    path = paths.ack(epoch, rank)
    try:
        atomic_write_json(path, doc, durable=durable, fs=paths.fs)
    except FileNotFoundError:  # the coordinator normally creates the directory on publish
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, doc, durable=durable, fs=paths.fs)


def write_reshard(paths: RunPaths, epoch: int, rank: int, host: str, figures: Mapping[str, Any]) -> None:
    """Record what ``rank`` moved when the actor's state moved for ``epoch``
    (``acks/NNNNNN/reshard-NNNN.json``). The move happens after the ack, at the mini-batch
    boundary stamped with that epoch (or the iteration start), so it has a file of its own."""
    doc = {"epoch": epoch, "rank": rank, "host": host, "figures": dict(figures), "time": time.time()}
    path = paths.acks_dir(epoch) / f"reshard-{rank:04d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, doc, durable=False, fs=paths.fs)


def read_reshards(paths: RunPaths, epoch: int) -> list[dict[str, Any]]:
    """Every rank's reshard record of ``epoch`` (lists the directory: for inspection only)."""
    directory = paths.acks_dir(epoch)
    if not directory.is_dir():
        return []
    out = []
    for p in sorted(directory.glob("reshard-*.json")):
        doc = read_json(p, fs=paths.fs)
        check_equal(doc, p, epoch=epoch, rank=int(p.name[8:12]))
        out.append(dict(check_fields(doc, p, {"host": "str", "figures": "object", "time": "number"})))
    return out


def read_ack(paths: RunPaths, epoch: int, rank: int) -> dict[str, Any] | None:
    """The rank's ack of ``epoch``, or None if not written yet. Checks that it names that epoch and rank."""
    path = paths.ack(epoch, rank)
    try:
        doc = read_json(path, fs=paths.fs)
    except FileNotFoundError:
        return None
    check_equal(doc, path, epoch=epoch, rank=rank)
    check_fields(doc, path, ACK_FIELDS)
    return doc


def _describe(ranks: Iterable[int], hosts: Mapping[int, str]) -> str:
    return ", ".join(f"rank {r} (host {hosts.get(r, '?')})" for r in sorted(ranks))


class AckWaiter:
    """Wait until every rank in ``ranks`` has acknowledged ``epoch``.

    Polls open known paths only (no directory listing): in rank order up to the first rank still
    missing, so a typical poll costs one ``open``; full passes over every missing rank run with
    each heartbeat check and before reporting a timeout. Every
    ``heartbeat_check_interval_s`` (and at the start) the heartbeats of missing ranks are read; a
    rank whose heartbeat is older than ``heartbeat_timeout_s`` -- or that never wrote one within
    ``heartbeat_timeout_s`` of the wait starting -- fails the wait at once with ``DeadRankError``.
    """

    def __init__(self, paths: RunPaths, epoch: int, ranks: Iterable[int], hosts: Mapping[int, str] | None = None,
                 poll_interval_s: float = DEFAULT_ACK_POLL_INTERVAL_S,
                 heartbeat_timeout_s: float | None = DEFAULT_HEARTBEAT_TIMEOUT_S,
                 heartbeat_check_interval_s: float = DEFAULT_HEARTBEAT_CHECK_INTERVAL_S) -> None:
        self.paths = paths
        self.epoch = epoch
        self.ranks = sorted(set(ranks))
        self.hosts: Mapping[int, str] = hosts or {}
        self.poll_interval_s = poll_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.heartbeat_check_interval_s = heartbeat_check_interval_s
        self.acks: dict[int, dict[str, Any]] = {}

    def missing(self) -> list[int]:
        """Ranks that have not acknowledged yet (as of the last poll)."""
        return [r for r in self.ranks if r not in self.acks]

    def poll(self, full: bool = True) -> bool:
        """Read the ack of missing ranks once; True when all are in.

        ``full=False`` stops at the first rank still missing: the wait only ends when every ack
        is in, and one pass then collects them all, so the common poll costs one ``open``
        instead of one per missing rank.
        """
        for rank in self.missing():
            doc = read_ack(self.paths, self.epoch, rank)
            if doc is not None:
                self.acks[rank] = doc
            elif not full:
                return False
        return not self.missing()

    def _hosts_of(self, ranks: Iterable[int]) -> dict[int, str]:
        """Hosts of ``ranks``: from the mapping given, else from each rank's heartbeat, else '?'."""
        hosts = {}
        for rank in ranks:
            host = self.hosts.get(rank)
            if host is None:
                try:
                    host = (read_heartbeat(self.paths, rank) or {}).get("host")
                except TornFileError:
                    host = None
            hosts[rank] = str(host) if host is not None else "?"
        return hosts

    def _check_heartbeats(self, waited_s: float) -> None:
        if self.heartbeat_timeout_s is None:
            return
        self.poll(full=True)  # a rank that acked and then stopped beating is not dead for this epoch
        stale = stale_ranks(self.paths, self.missing(), self.heartbeat_timeout_s)
        dead = []
        hosts = self._hosts_of(stale)
        for rank, age in sorted(stale.items()):
            host = hosts[rank]
            if age is not None:
                dead.append(f"rank {rank} (host {host}) last heartbeat {age:.1f}s ago")
            elif waited_s > self.heartbeat_timeout_s:
                dead.append(f"rank {rank} (host {host}) has no heartbeat at {self.paths.heartbeat(rank)}")
        if dead:
            raise DeadRankError(f"epoch {self.epoch} cannot be acknowledged: {len(dead)} rank(s) dead "
                                f"(heartbeat timeout {self.heartbeat_timeout_s:.1f}s): " + "; ".join(dead))

    def wait(self, timeout_s: float) -> dict[int, dict[str, Any]]:
        """Block until all acks are in; returns rank -> ack document.

        Raises ``AckTimeout`` naming the epoch and each missing rank with its host, or
        ``DeadRankError`` as soon as a missing rank's heartbeat is stale.
        """
        start = time.monotonic()
        deadline = start + timeout_s
        next_heartbeat_check = start
        while not self.poll(full=False):
            now = time.monotonic()
            if now >= next_heartbeat_check:
                self._check_heartbeats(now - start)
                next_heartbeat_check = now + self.heartbeat_check_interval_s
            if now >= deadline:
                if self.poll(full=True):
                    break
                missing = self.missing()
                raise AckTimeout(f"epoch {self.epoch} not acknowledged within {timeout_s:.1f}s by {len(missing)} "
                                 f"of {len(self.ranks)} ranks: {_describe(missing, self._hosts_of(missing))}")
            time.sleep(min(self.poll_interval_s, max(deadline - now, 0.0)))
        return dict(self.acks)
