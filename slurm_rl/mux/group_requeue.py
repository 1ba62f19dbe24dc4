"""Preemption of a co-execution group: every member checkpoints at its gate, the group is
requeued, and each member resumes from its checkpoint.

- :func:`stop_group` (``sbatch/mux.sh`` on USR1: ``--signal=B:USR1@N`` ahead of the time limit,
  ``scancel --signal=USR1 --batch``) leaves the group's stop request and the run's ordinary stop
  request in every member still in the rotation. Each member's coordinator stops at its next
  iteration gate with a checkpoint; a parked member too: the group keeps rotating until every
  member reached its gate, so each stops with both phases of its last iteration complete and the
  grants' ``done`` counters match its checkpoint.
- :func:`decide` then says whether to requeue (some member stopped for the group's stop request).
- In the requeued job, :func:`previous_group` finds the group dir again (``SLURM_JOB_ID``) and
  :func:`resume_group` makes every stopped member ready to resume (the run's
  :func:`~slurm_rl.resume.restart.prepare_resume`); the group scheduler carries on from its last
  grant (rotation order and cursors are in it) under a new lease generation, and the launcher
  starts only the members still in the rotation.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from slurm_rl.control.events import append_event
from slurm_rl.control.grants import GroupPaths
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import read_coordinator_status, write_coordinator_status
from slurm_rl.mux.group_state import group_json_path, read_group_json, removed
from slurm_rl.resume.stop import clear_stop, read_stop, request_stop

EXIT_REQUEUED, EXIT_NOT_REQUEUED, EXIT_FINISHED = 0, 1, 3


def _run_dir(group: dict, job: str) -> Path:
    return Path(group["jobs"][job]["run_dir"])


def member_states(group_dir: Path) -> dict[str, str | None]:
    """Each member's coordinator state (None before its coordinator wrote one)."""
    group = read_group_json(Path(group_dir))
    out = {}
    for job in group["members"]:
        status = read_coordinator_status(RunPaths(_run_dir(group, job)))
        out[job] = None if status is None else ("failed" if status.failed else status.state)
    return out


def stop_group(group_dir: Path, reason: str, at_iteration: int | None = None) -> list[str]:
    """Ask every member still in the rotation to checkpoint at its gate (``at_iteration``: the gate
    of that iteration or a later one; default the next) and stop; the members asked."""
    group_dir = Path(group_dir)
    group = read_group_json(group_dir)
    request_stop(group_dir, reason)
    gone = removed(group_dir)
    asked = [job for job, state in member_states(group_dir).items()
             if job not in gone and state not in ("finished", "failed", "stopped")]
    for job in asked:
        request_stop(_run_dir(group, job), reason, at_iteration=at_iteration)
    append_event(GroupPaths(group_dir), "group_stop", {"reason": reason, "members": asked})
    return asked


@dataclass(frozen=True)
class GroupRequeue:
    requeue: bool
    reason: str
    finished: bool = False


def decide(group_dir: Path) -> GroupRequeue:
    """Requeue when the group was asked to stop and a member (not removed) stopped at its gate."""
    group_dir = Path(group_dir)
    gone = removed(group_dir)
    states = {j: s for j, s in member_states(group_dir).items() if j not in gone}
    stopped = sorted(j for j, s in states.items() if s == "stopped")
    if all(s == "finished" for s in states.values()):
        return GroupRequeue(False, "every member finished", finished=True)
    request = read_stop(group_dir)
    if request is None:
        return GroupRequeue(False, f"no group stop was requested; members: {states}")
    if not stopped:
        return GroupRequeue(False, f"no member stopped at its gate; members: {states}")
    return GroupRequeue(True, f"{request.get('reason')}: members {stopped} stopped at their gates")


def previous_group(group_dir: Path, env: dict[str, str]) -> Path | None:
    """The group dir of this Slurm job's previous incarnation when it was requeued
    (``SLURM_RESTART_COUNT`` > 0): the one recorded for ``SLURM_JOB_ID`` beside ``group_dir``
    (a ``${now:...}`` group.dir resolves anew), else ``group_dir`` itself when it holds a group."""
    from slurm_rl.resume.restart import job_link

    if int(env.get("SLURM_RESTART_COUNT", "0") or 0) <= 0 or not env.get("SLURM_JOB_ID"):
        return None
    link = job_link(Path(group_dir).parent, env["SLURM_JOB_ID"])
    if link.is_symlink() and group_json_path(link.resolve()).is_file():
        return link.resolve()
    return Path(group_dir) if group_json_path(Path(group_dir)).is_file() else None


def resume_group(group_dir: Path, log: Callable[[str], None] = lambda m: None) -> list[str]:
    """Make every stopped member (not removed) ready to resume; the members resumed."""
    from slurm_rl.resume.restart import prepare_resume

    group_dir = Path(group_dir)
    group = read_group_json(group_dir)
    gone = removed(group_dir)
    resumed = []
    for job, state in member_states(group_dir).items():
        if job in gone or state in ("finished", "failed"):
            continue
        prepare_resume(_run_dir(group, job), log=log)
        resumed.append(job)
    clear_stop(group_dir)
    paths = GroupPaths(group_dir)
    status = read_coordinator_status(paths)
    write_coordinator_status(paths, {"state": "resuming", "generation": status.generation if status else 0,
                                     "out": {}, "time": time.time()})
    append_event(paths, "group_resumed", {"members": resumed})
    return resumed


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m slurm_rl.mux.group_requeue stop|requeue GROUP_DIR`` (``sbatch/mux.sh``)."""
    parser = argparse.ArgumentParser(prog="python -m slurm_rl.mux.group_requeue")
    parser.add_argument("what", choices=["stop", "requeue"])
    parser.add_argument("group_dir", type=Path)
    parser.add_argument("--reason", default="USR1 (preemption or time limit)")
    args = parser.parse_args(argv)
    if args.what == "stop":
        asked = stop_group(args.group_dir, args.reason)
        print(f"slurm_rl: asked members {asked} to checkpoint at their gates and stop", flush=True)
        return 0
    from slurm_rl.launch.requeue import requeue_job

    decision = decide(args.group_dir)
    if not decision.requeue:
        print(f"slurm_rl: group not requeued: {decision.reason}", flush=True)
        return EXIT_FINISHED if decision.finished else EXIT_NOT_REQUEUED
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        print(f"slurm_rl: would requeue the group ({decision.reason}) but SLURM_JOB_ID is not set", flush=True)
        return EXIT_NOT_REQUEUED
    print(f"slurm_rl: requeueing job {job_id}: {decision.reason}; it resumes {args.group_dir}", flush=True)
    return EXIT_REQUEUED if requeue_job(job_id, []) else EXIT_NOT_REQUEUED


if __name__ == "__main__":
    sys.exit(main())
