"""The coordinator's status file ``control/coordinator.json``: which iteration it has released.

Workers read this one known path at iteration gates; the coordinator rewrites it atomically. A
document is a :class:`CoordinatorStatus`, validated when read or written (a co-execution group's
scheduler writes the same file in its group directory, with its ``grant`` and ``out``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.validate import check_fields

STATUS_FIELDS = {"generation": "count", "state": "str"}
STATUS_OPTIONAL = {"released_iteration": "int", "released_epoch": "int?", "checked_at": "number",
                   "error": "str?", "time": "number", "stopped_at_iteration": "int?", "stop": "object?",
                   "requeue": "bool", "rank_failure": "bool", "exclude": "list", "host": "str", "pid": "int",
                   "grant": "int", "out": "object"}
CHECKPOINT_REQUEST = {"iteration": "count", "dir": "str"}


@dataclass(frozen=True)
class CheckpointRequest:
    """While ``checkpointing``: every rank writes its part of iteration ``iteration``'s
    checkpoint into the staging directory ``dir``."""

    iteration: int
    dir: str


@dataclass(frozen=True)
class CoordinatorStatus:
    """The coordinator's state (``starting``, ``running``, ``checkpointing``, ``stopped``,
    ``finished``, ``failed``, ``resuming``), the iteration and epoch it released, and why it
    stopped or failed (``stop``, ``error``, ``requeue``, ``exclude``).

    Field names are the file's; absent optional fields are None (``exclude``: empty). The file's
    ``checkpoint`` field is a request while ``checkpointing`` (:attr:`checkpoint_request`) and the
    checkpoint taken once ``stopped`` (:attr:`checkpoint`). A group scheduler's status also has
    ``grant`` (its last grant number) and ``out`` (member -> why it left the rotation)."""

    generation: int
    state: str
    released_iteration: int | None = None
    released_epoch: int | None = None
    checked_at: float | None = None
    error: str | None = None
    time: float | None = None
    stopped_at_iteration: int | None = None
    stop: Mapping[str, Any] | None = None
    requeue: bool | None = None
    rank_failure: bool | None = None
    exclude: tuple[str, ...] = ()
    host: str | None = None
    pid: int | None = None
    checkpoint: str | None = None
    checkpoint_request: CheckpointRequest | None = None
    grant: int | None = None
    out: Mapping[str, str] | None = None
    document: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def failed(self) -> bool:
        """The coordinator recorded a failure (every rank stops)."""
        return self.state == "failed"

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], path: str | os.PathLike[str]) -> "CoordinatorStatus":
        """Validate ``doc`` read from (or written to) ``path``; :class:`TornFileError` names the
        file and the field."""
        check_fields(doc, path, STATUS_FIELDS, STATUS_OPTIONAL)
        ckpt = doc.get("checkpoint")
        if isinstance(ckpt, dict):
            check_fields(ckpt, path, CHECKPOINT_REQUEST, within="checkpoint")
            request: CheckpointRequest | None = CheckpointRequest(int(ckpt["iteration"]), str(ckpt["dir"]))
            ckpt = None
        else:
            check_fields(doc, path, {}, {"checkpoint": "str?"})
            request = None
        return cls(generation=doc["generation"], state=doc["state"], released_iteration=doc.get("released_iteration"),
                   released_epoch=doc.get("released_epoch"), checked_at=doc.get("checked_at"), error=doc.get("error"),
                   time=doc.get("time"), stopped_at_iteration=doc.get("stopped_at_iteration"), stop=doc.get("stop"),
                   requeue=doc.get("requeue"), rank_failure=doc.get("rank_failure"),
                   exclude=tuple(doc.get("exclude") or ()), host=doc.get("host"), pid=doc.get("pid"),
                   checkpoint=ckpt, checkpoint_request=request, grant=doc.get("grant"), out=doc.get("out"),
                   document=dict(doc))

    def to_json(self) -> dict[str, Any]:
        """The document to write (the fields read, unchanged)."""
        return dict(self.document)


def status_path(paths: RunPaths) -> Path:
    return paths.control / "coordinator.json"


def write_coordinator_status(paths: RunPaths, doc: Mapping[str, Any]) -> None:
    """Replace the coordinator status (``generation``, ``state``, ``released_iteration``, ...),
    validated as a :class:`CoordinatorStatus` first."""
    path = status_path(paths)
    atomic_write_json(path, CoordinatorStatus.from_json(doc, path).to_json(), fs=paths.fs)


def read_coordinator_status(paths: RunPaths) -> CoordinatorStatus | None:
    """The coordinator status, or None before the coordinator wrote one; :class:`TornFileError`
    naming the file and field for a document that is not one."""
    path = status_path(paths)
    try:
        doc = read_json(path, fs=paths.fs)
    except FileNotFoundError:
        return None
    return CoordinatorStatus.from_json(doc, path)
