"""The coordinator's status file ``control/coordinator.json``: which iteration it has released.

Workers read this one known path at iteration gates; the coordinator rewrites it atomically.
"""

from __future__ import annotations

from typing import Any

from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.paths import RunPaths


def status_path(paths: RunPaths):
    return paths.control / "coordinator.json"


def write_coordinator_status(paths: RunPaths, doc: dict[str, Any]) -> None:
    """Replace the coordinator status (``generation``, ``state``, ``released_iteration``, ...)."""
    atomic_write_json(status_path(paths), doc)


def read_coordinator_status(paths: RunPaths) -> dict[str, Any] | None:
    """The coordinator status, or None before the coordinator wrote one."""
    try:
        return read_json(status_path(paths))
    except FileNotFoundError:
        return None
