"""The coordinator's status file ``control/coordinator.json``: which iteration it has released.

Workers read this one known path at iteration gates; the coordinator rewrites it atomically.
"""

from __future__ import annotations

from typing import Any

from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.validate import check_fields

STATUS_FIELDS = {"generation": "count", "state": "str"}
STATUS_OPTIONAL = {"released_iteration": "int", "released_epoch": "int?", "checked_at": "number",
                   "error": "str?", "time": "number"}


def status_path(paths: RunPaths):
    return paths.control / "coordinator.json"


def write_coordinator_status(paths: RunPaths, doc: dict[str, Any]) -> None:
    """Replace the coordinator status (``generation``, ``state``, ``released_iteration``, ...)."""
    atomic_write_json(status_path(paths), doc, fs=paths.fs)


def read_coordinator_status(paths: RunPaths) -> dict[str, Any] | None:
    """The coordinator status, or None before the coordinator wrote one."""
    path = status_path(paths)
    try:
        doc = read_json(path, fs=paths.fs)
    except FileNotFoundError:
        return None
    check_fields(doc, path, STATUS_FIELDS, STATUS_OPTIONAL)
    return doc
