"""Per-rank progress documents (``progress/rank-NNNN.json``) that the scheduler reads.

A document is a :class:`RankProgress`: validated when read or written, its known fields typed
attributes, and, for the consumers that read the per-iteration counters by name, the JSON
document itself (a read-only mapping with the field names of the file).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.validate import check_equal, check_fields

PROGRESS_REQUIRED = {"rank": "count", "time": "number"}
PROGRESS_FIELDS = {"host": "str", "state": "str", "iteration": "int?", "epoch": "int?", "roles": "list",
                   "gate": "int?", "checkpointed": "str?", "error": "str?", "phase": "str?", "boundary_at": "number?",
                   "actor_busy": "bool", "actor_minibatches_done": "int"}


@dataclass(frozen=True)
class RankProgress(Mapping[str, Any]):
    """What one rank reported last: its state, iteration, epoch and roles, where it waits
    (``gate``, ``checkpointed``), its startup ``phase``, why it failed (``error``) and its
    per-iteration counters.

    Field names are the file's; absent optional fields are None (``roles``: empty). As a mapping
    it is the document as written (counters such as ``rollout_finished`` by name)."""

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
    document: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str | os.PathLike[str],
                  rank: int | None = None) -> "RankProgress":
        """Validate ``doc`` read from (or written to) ``path``; :class:`TornFileError` names the
        file and the field. ``rank``: what the file name says the rank is."""
        if rank is not None:
            check_equal(doc, path, rank=rank)
        check_fields(doc, path, PROGRESS_REQUIRED, PROGRESS_FIELDS)
        return cls(rank=doc["rank"], time=float(doc["time"]), host=doc.get("host"), state=doc.get("state"),
                   iteration=doc.get("iteration"), epoch=doc.get("epoch"), roles=tuple(doc.get("roles") or ()),
                   gate=doc.get("gate"), checkpointed=doc.get("checkpointed"), error=doc.get("error"),
                   phase=doc.get("phase"), boundary_at=doc.get("boundary_at"), document=MappingProxyType(dict(doc)))

    def to_json(self) -> dict[str, Any]:
        """The document to write (the fields read, unchanged)."""
        return dict(self.document)

    def __getitem__(self, key: str) -> Any:
        return self.document[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.document)

    def __len__(self) -> int:
        return len(self.document)


def write_progress(paths: RunPaths, rank: int, doc: Mapping[str, Any]) -> None:
    """Atomically replace the rank's progress file with ``doc`` plus ``rank`` and ``time``
    (validated as a :class:`RankProgress` first).

    Not fsynced: progress is rewritten often and a lost update is replaced by the next one.
    """
    path = paths.progress(rank)
    record = RankProgress.from_json({**doc, "rank": rank, "time": time.time()}, path)
    atomic_write_json(path, record.to_json(), durable=False, fs=paths.fs)


def read_all_progress(paths: RunPaths, ranks: Iterable[int]) -> dict[int, RankProgress]:
    """Progress of each rank that has written one (one ``open`` per rank; absent ranks are left out).

    ``TornFileError`` naming the file and field for a document that is not a progress report."""
    out: dict[int, RankProgress] = {}
    for rank in ranks:
        path = paths.progress(rank)
        try:
            doc = read_json(path, fs=paths.fs)
        except FileNotFoundError:
            continue
        out[rank] = RankProgress.from_json(doc, path, rank=rank)
    return out
