"""Per-rank progress documents (``progress/rank-NNNN.json``) that the scheduler reads.

A document is a :class:`RankProgress`: validated when read or written, every field a typed
attribute; the per-iteration counters (rollout finished/running, inference done, actor
mini-batches, ...) are an :class:`IterationCounters` in ``counters``. The file keeps its flat
field names. A writer may only write known fields; a reader ignores fields it does not know
(written by another version).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from slurm_rl.control.atomic import JsonCache, atomic_write_json
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.validate import check_equal, check_fields, check_known

PROGRESS_REQUIRED = {"rank": "count", "time": "number"}
PROGRESS_FIELDS = {"host": "str", "state": "str", "iteration": "int?", "epoch": "int?", "roles": "list",
                   "gate": "int?", "checkpointed": "str?", "error": "str?", "phase": "str?", "boundary_at": "number?"}
COUNTER_FIELDS = {"rollout_finished": "count", "rollout_running": "count", "migrated_out": "count",
                  "inference_done": "count", "actor_received": "count", "actor_ready": "count",
                  "actor_minibatches_done": "count",
                  "actor_busy": "bool", "rollout_len_hist": "histogram", "rollout_longest": "count",
                  "rollout_step_s": "number?", "rollout_decoding": "count", "inference_busy_s": "number",
                  "actor_last_minibatch": "object?"}
KNOWN_FIELDS = frozenset({*PROGRESS_REQUIRED, *PROGRESS_FIELDS, *COUNTER_FIELDS})
MINIBATCH_REQUIRED = {"index": "count", "dp": "count"}
MINIBATCH_FIELDS = {"seconds": "number?", "tokens": "count?", "resharded": "bool"}


@dataclass(frozen=True)
class LastMinibatch:
    """The mini-batch the actor's cutter rank cut last (``actor_last_minibatch``): its index, data
    parallel width, predicted training seconds (None: no prediction), tokens and whether the actor
    was resharded for it."""

    index: int
    dp: int
    seconds: float | None = None
    tokens: int | None = None
    resharded: bool = False

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str | os.PathLike[str]) -> "LastMinibatch":
        check_fields(doc, path, MINIBATCH_REQUIRED, MINIBATCH_FIELDS, within="actor_last_minibatch")
        seconds = doc.get("seconds")
        return cls(index=doc["index"], dp=doc["dp"], seconds=None if seconds is None else float(seconds),
                   tokens=doc.get("tokens"), resharded=doc.get("resharded", False))

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "dp": self.dp, "seconds": self.seconds, "tokens": self.tokens,
                "resharded": self.resharded}


@dataclass(frozen=True)
class IterationCounters:
    """What a rank counted in its current iteration; an absent counter reads as its default.

    ``rollout_len_hist``: finished responses per length bucket; ``rollout_step_s`` and
    ``rollout_decoding``: the decoder's current step time and responses in decode;
    ``actor_received``: samples the actor's cutter rank received (a floor for rollout and
    inference progress); ``actor_ready``: those of them in complete groups (what mini-batches are
    cut from); ``actor_last_minibatch``: on the cutter rank, its last mini-batch."""

    rollout_finished: int = 0
    rollout_running: int = 0
    migrated_out: int = 0
    inference_done: int = 0
    actor_received: int = 0
    actor_ready: int = 0
    actor_minibatches_done: int = 0
    actor_busy: bool = False
    rollout_len_hist: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    rollout_longest: int = 0
    rollout_step_s: float | None = None
    rollout_decoding: int = 0
    inference_busy_s: float = 0.0
    actor_last_minibatch: LastMinibatch | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str | os.PathLike[str]) -> "IterationCounters":
        """The counters in ``doc`` (already checked against :data:`COUNTER_FIELDS`)."""
        values = {name: doc[name] for name in COUNTER_FIELDS if name in doc}
        if "rollout_len_hist" in values:
            values["rollout_len_hist"] = MappingProxyType({int(b): n for b, n in values["rollout_len_hist"].items()})
        if values.get("rollout_step_s") is not None:
            values["rollout_step_s"] = float(values["rollout_step_s"])
        if "inference_busy_s" in values:
            values["inference_busy_s"] = float(values["inference_busy_s"])
        if values.get("actor_last_minibatch") is not None:
            values["actor_last_minibatch"] = LastMinibatch.from_json(values["actor_last_minibatch"], path)
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """Every counter under its file name."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["rollout_len_hist"] = {str(b): n for b, n in self.rollout_len_hist.items()}
        if self.actor_last_minibatch is not None:
            out["actor_last_minibatch"] = self.actor_last_minibatch.to_json()
        return out


@dataclass(frozen=True)
class RankProgress:
    """What one rank reported last: its state, iteration, epoch and roles, where it waits
    (``gate``, ``checkpointed``), its startup ``phase``, why it failed (``error``), when its
    cutter saw a mini-batch boundary (``boundary_at``) and its per-iteration ``counters``.

    Field names are the file's; absent optional fields are None (``roles``: empty; counters: their
    defaults). ``present``: the fields the document had, in order, so that :meth:`to_json` writes
    back what was read."""

    rank: int
    time: float
    host: str | None = None
    state: str | None = None
    iteration: int | None = None
    epoch: int | None = None
    roles: tuple[str, ...] = ()
    gate: int | None = None
    checkpointed: str | None = None
    error: str | None = None
    phase: str | None = None
    boundary_at: float | None = None
    counters: IterationCounters = field(default_factory=IterationCounters)
    present: tuple[str, ...] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str | os.PathLike[str],
                  rank: int | None = None) -> "RankProgress":
        """Validate ``doc`` read from (or written to) ``path``; :class:`TornFileError` names the
        file and the field. ``rank``: what the file name says the rank is. Unknown fields are
        ignored (see :func:`write_progress` for the writer's side)."""
        if rank is not None:
            check_equal(doc, path, rank=rank)
        check_fields(doc, path, PROGRESS_REQUIRED, {**PROGRESS_FIELDS, **COUNTER_FIELDS})
        boundary = doc.get("boundary_at")
        return cls(rank=doc["rank"], time=float(doc["time"]), host=doc.get("host"), state=doc.get("state"),
                   iteration=doc.get("iteration"), epoch=doc.get("epoch"), roles=tuple(doc.get("roles") or ()),
                   gate=doc.get("gate"), checkpointed=doc.get("checkpointed"), error=doc.get("error"),
                   phase=doc.get("phase"), boundary_at=None if boundary is None else float(boundary),
                   counters=IterationCounters.from_json(doc, path),
                   present=tuple(name for name in doc if name in KNOWN_FIELDS))

    def to_json(self) -> dict[str, Any]:
        """The document under the file's names: the fields read (a record built directly: those
        that differ from their defaults, with ``rank`` and ``time``)."""
        values = self._values()
        if self.present is not None:
            return {name: values[name] for name in self.present}
        defaults = RankProgress(rank=self.rank, time=self.time)._values()
        return {name: value for name, value in values.items() if name in PROGRESS_REQUIRED or value != defaults[name]}

    def _values(self) -> dict[str, Any]:
        values = {name: getattr(self, name) for name in (*PROGRESS_REQUIRED, *PROGRESS_FIELDS)}
        values["roles"] = list(self.roles)
        values.update(self.counters.to_json())
        return values


def write_progress(paths: RunPaths, rank: int, doc: Mapping[str, Any]) -> None:
    """Atomically replace the rank's progress file with ``doc`` plus ``rank`` and ``time``
    (validated as a :class:`RankProgress` first; a field it does not know is refused).

    Not fsynced: progress is rewritten often and a lost update is replaced by the next one.
    """
    path = paths.progress(rank)
    full = {**doc, "rank": rank, "time": time.time()}
    check_known(full, path, KNOWN_FIELDS)
    record = RankProgress.from_json(full, path)
    atomic_write_json(path, record.to_json(), durable=False, fs=paths.fs)


def read_all_progress(paths: RunPaths, ranks: Iterable[int]) -> dict[int, RankProgress]:
    """Progress of each rank that has written one (one ``open`` per rank; absent ranks are left out).

    ``TornFileError`` naming the file and field for a document that is not a progress report."""
    return ProgressReader(paths, ranks).read()


class ProgressReader:
    """:func:`read_all_progress` for a reader that polls (the coordinator, 100 times a second by
    default): each rank's path is built once, and a file whose bytes equal those of the previous
    read is not parsed and validated again (a :class:`~slurm_rl.control.atomic.JsonCache`; a
    rank's file changes a few times a second at most)."""

    def __init__(self, paths: RunPaths, ranks: Iterable[int]) -> None:
        self.paths = paths
        self._files = [(rank, paths.progress(rank)) for rank in ranks]
        self._cache = JsonCache()

    def read(self) -> dict[int, RankProgress]:
        out: dict[int, RankProgress] = {}
        for rank, path in self._files:
            try:
                out[rank] = self._cache.read(path, lambda doc: RankProgress.from_json(doc, path, rank=rank),
                                             fs=self.paths.fs)
            except FileNotFoundError:
                continue
        return out
