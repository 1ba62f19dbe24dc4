"""Live joins and leaves of a running co-execution group.

:func:`add_job` asks a running group to take a job: the same admission as a declared group
(:func:`~slurm_rl.mux.group_admission.admit`: SLO by simulation with the jobs' own and
max-length profiles, parked state per node) against the members still in the rotation. An
admitted job gets its RUN_DIR under ``GROUP_DIR/jobs/<name>``, a numbered membership record
(``control/membership/NNNNNN.json``, created exclusively) and its place in ``group.json``; the
group's launcher starts its ranks and the group scheduler puts it into the rotation at the next
meta-iteration (:func:`~slurm_rl.mux.group_sim.with_member`). A refused job raises
:class:`ConfigError` with the reason; nothing is created.

:func:`remove_job` records the leave and asks the job to stop at its next gate with a checkpoint
(the run's ordinary stop request): its ranks exit, which frees the state they parked, and the
group scheduler takes it out of the rotation once its coordinator says ``stopped``.

Both hold ``control/membership.lock``; the group scheduler takes the same lock before it declares
the group finished, so a job never joins a group that is ending.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Sequence

from filelock import FileLock, Timeout

from slurm_rl.config import ConfigError, ConfigIssue, load_config
from slurm_rl.control.grants import JOB_NAME_CHARS, GroupPaths
from slurm_rl.errors import InputError
from slurm_rl.fsio import atomic_write_json
from slurm_rl.launch.prepare import prepare_run
from slurm_rl.mux.group_admission import admit, measured_check
from slurm_rl.mux.group_file import POOLS, GroupJob, GroupSpec, _place, job_json, spec_from_json
from slurm_rl.mux.group_state import active_members, group_json_path, group_state, read_group_json, records_log
from slurm_rl.resume.stop import request_stop

LOCK_TIMEOUT_S = 60.0


class MembershipError(InputError):
    """The group cannot change now (not running, lock held too long, unknown job): exit 2."""


@contextmanager
def membership_lock(group_dir: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold ``GROUP_DIR/control/membership.lock`` (every change of the members, and the group's end)."""
    path = Path(group_dir) / "control" / "membership.lock"
    try:
        with FileLock(str(path), timeout=timeout_s):
            yield
    except Timeout:
        raise MembershipError(f"waited {timeout_s:.0f}s for the membership lock {path} "
                              "(another `slurm-rl mux add/remove/place`, or the group scheduler ending the group)") from None


def _publish_record(group_dir: Path, doc: dict[str, Any]) -> int:
    """The next numbered record, created exclusively (a second writer of the same number fails)."""
    log = records_log(group_dir)
    n = max(log.numbers(), default=-1) + 1
    log.publish(n, {"record": n, "time": time.time(), **doc}, None)
    return n


def candidate(group_dir: Path, name: str, config: str | Path, overrides: Sequence[str] = (),
              slo: float | None = None, max_response_length: int | None = None) -> tuple[GroupSpec, GroupJob]:
    """The running group with ``name`` joined (last in the order), validated; ``ConfigError`` lists
    what is wrong with the request."""
    group = read_group_json(Path(group_dir))
    issues: list[ConfigIssue] = []
    if not name or not set(name) <= JOB_NAME_CHARS:
        issues.append(ConfigIssue("name", name, "a job name of lower-case letters, digits, '_' and '-'"))
    elif name in group["jobs"]:
        issues.append(ConfigIssue("name", name, f"a name not used in this group (used: {sorted(group['jobs'])})"))
    slo = 2.0 if slo is None else slo
    if slo < 1.0:
        issues.append(ConfigIssue("slo", slo, "a number >= 1 (tolerated slowdown versus running alone)"))
    config_path = Path(config).absolute()
    cfg = load_config(config_path, list(overrides))  # ConfigError names its keys
    devices = {d["device"] for d in group["jobs"].values()}
    if devices and cfg.runtime.device not in devices:
        issues.append(ConfigIssue("runtime.device", cfg.runtime.device, f"the group's device ({sorted(devices)[0]})"))
    pools = {p: tuple(group["pools"][p]) for p in POOLS}
    slots = _place(name, cfg, config_path, pools, issues)
    if issues:
        raise ConfigError(issues)
    job = GroupJob(name, config_path, tuple(overrides), float(slo), max_response_length, cfg, slots)
    spec = spec_from_json(group_dir, group, active_members(group_dir, group))
    return replace(spec, jobs=(*spec.jobs, job)), job


def add_job(group_dir: Path, name: str, config: str | Path, overrides: Sequence[str] = (), slo: float | None = None,
            max_response_length: int | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Admit ``name`` into the running group at ``group_dir`` (see the module docstring); the
    admission figures. ``ConfigError``: refused or bad request (nothing created);
    :class:`MembershipError`: the group is not running."""
    group_dir = Path(group_dir).absolute()
    with membership_lock(group_dir):
        state, _ = group_state(group_dir)
        if state not in ("running", None) or not group_json_path(group_dir).exists():
            raise MembershipError(f"group {group_dir} is {state or 'not prepared'}: only a running group takes a job")
        spec, job = candidate(group_dir, name, config, overrides, slo, max_response_length)
        issues, figures = admit(spec, spec.host_memory_gb, spec.gpus_per_node)
        figures["members"] = [j.name for j in spec.jobs]
        if figures.get("slo_checked"):  # reported beside the decision (see measured_check)
            figures["measured"] = measured_check(group_dir, job)
        if issues:
            raise ConfigError(issues)
        if dry_run:
            return figures
        run_dir = GroupPaths(group_dir).job_dir(name)
        extra = [f"runtime.run_dir={run_dir}", f"mux.group_dir={group_dir}", f"mux.job={name}",
                 f"mux.park_s={spec.park_s}"]
        prepare_run(job.config_path, [*job.overrides, *extra])
        group = read_group_json(group_dir)
        group["jobs"][name] = {**job_json(job), "run_dir": str(run_dir),
                               "heartbeat_timeout_s": job.cfg.runtime.heartbeat_timeout_s}
        group["members"] = [*group["members"], name]
        number = _publish_record(group_dir, {"join": name, "config": str(job.config_path),
                                             "overrides": list(job.overrides), "slo": job.slo, "admission": figures})
        atomic_write_json(group_json_path(group_dir), group)
    figures["record"] = number
    return figures


def remove_job(group_dir: Path, name: str, reason: str = "removed from the group") -> int:
    """Record that ``name`` leaves and ask it to stop at its next gate (with a checkpoint); the record's number."""
    group_dir = Path(group_dir).absolute()
    with membership_lock(group_dir):
        group = read_group_json(group_dir)
        if name not in group["jobs"]:
            raise MembershipError(f"job {name!r} is not a member of {group_dir} (members: {group['members']})")
        number = _publish_record(group_dir, {"leave": name, "reason": reason})
        request_stop(Path(group["jobs"][name]["run_dir"]), reason)
    return number
