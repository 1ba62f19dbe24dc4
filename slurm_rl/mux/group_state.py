"""A co-execution group's members as its files say now: ``group.json`` (the resolved group, read only
through :func:`read_group_json`), the membership records (joins and leaves) and the group scheduler's
status. The read side of :mod:`slurm_rl.mux.membership` (which writes records under its lock), shared by
the launcher, the group scheduler, requeue, the placer's view of the cluster (:mod:`slurm_rl.mux.live`)
and ``inspect``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurm_rl.control.atomic import read_json
from slurm_rl.control.grants import GroupPaths
from slurm_rl.control.numbered import NumberedFiles
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import read_coordinator_status, status_path

GROUP_JSON = "group.json"
OUT_STATES = ("finished", "failed", "stopped")


def group_json_path(group_dir: Path) -> Path:
    """``GROUP_DIR/group.json``: the resolved group (written by ``slurm-rl mux``, joins by ``mux add``)."""
    return Path(group_dir) / GROUP_JSON


def read_group_json(group_dir: Path) -> dict[str, Any]:
    """The resolved group as written (``group_file.GroupSpec.to_json``, joins included);
    ``FileNotFoundError`` where the group was not prepared."""
    return read_json(group_json_path(group_dir))


def records_log(group_dir: Path) -> NumberedFiles[dict[str, Any]]:
    """``control/membership/NNNNNN.json``: numbered, exclusive, unfenced (written under the lock)."""
    paths = GroupPaths(Path(group_dir))
    return NumberedFiles(paths, paths.control / "membership", kind="membership record", number_key="record",
                         holder="mux add/remove", fenced=False)


def read_records(group_dir: Path) -> list[dict[str, Any]]:
    """Every membership record (joins and leaves), in order."""
    log = records_log(group_dir)
    return [log.read(n) for n in log.numbers()]


def removed(group_dir: Path) -> set[str]:
    """Members that ``slurm-rl mux remove`` took out (their leave records)."""
    return {r["leave"] for r in read_records(group_dir) if "leave" in r}


def job_state(group: dict[str, Any], job: str) -> str | None:
    """``finished`` / ``failed`` / ``stopped`` once the job's coordinator says so, else None."""
    status = read_coordinator_status(RunPaths(Path(group["jobs"][job]["run_dir"])))
    if status is None:
        return None
    return status.state if status.state in OUT_STATES or status.failed else None


def group_state(group_dir: Path) -> tuple[str | None, dict[str, str]]:
    """The group scheduler's state and its ``out`` map (job -> why it left the rotation)."""
    try:
        doc = read_json(status_path(GroupPaths(Path(group_dir))))
    except FileNotFoundError:
        return None, {}
    return doc.get("state"), dict(doc.get("out") or {})


def active_members(group_dir: Path, group: dict[str, Any]) -> list[str]:
    """Members still in the rotation (in the group's order)."""
    _, out = group_state(group_dir)
    gone = removed(group_dir)
    return [j for j in group["members"] if j not in out and j not in gone and job_state(group, j) is None]
