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
from slurm_rl.control.atomic import read_json
from slurm_rl.control.grants import JOB_NAME_CHARS, GroupPaths
from slurm_rl.control.numbered import NumberedFiles
from slurm_rl.control.paths import RunPaths
from slurm_rl.errors import InputError
from slurm_rl.control.status import read_coordinator_status, status_path
from slurm_rl.fsio import atomic_write_json
from slurm_rl.mux.group_file import POOLS, GroupJob, GroupSpec, _place, job_json

LOCK_TIMEOUT_S = 60.0
OUT_STATES = ("finished", "failed", "stopped")


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


def records_log(group_dir: Path) -> NumberedFiles[dict[str, Any]]:
    """``control/membership/NNNNNN.json``: numbered, exclusive, unfenced (written under the lock)."""
    paths = GroupPaths(Path(group_dir))
    return NumberedFiles(paths, paths.control / "membership", kind="membership record", number_key="record",
                         holder="mux add/remove", fenced=False)


def read_records(group_dir: Path) -> list[dict[str, Any]]:
    """Every membership record (joins and leaves), in order."""
    log = records_log(group_dir)
    return [log.read(n) for n in log.numbers()]


def _publish_record(group_dir: Path, doc: dict[str, Any]) -> int:
    """The next numbered record, created exclusively (a second writer of the same number fails)."""
    log = records_log(group_dir)
    n = max(log.numbers(), default=-1) + 1
    log.publish(n, {"record": n, "time": time.time(), **doc}, None)
    return n


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


def live_spec(group_dir: Path, group: dict[str, Any], members: Sequence[str]) -> GroupSpec:
    """The group as it runs, as a :class:`GroupSpec` of ``members`` (each from its RUN_DIR's config)."""
    jobs = []
    for name in members:
        doc = group["jobs"][name]
        path = Path(doc["run_dir"]) / "config.yaml"
        slots = {int(r): (ps[0], int(ps[1])) for r, ps in doc["rank_slots"].items()}
        jobs.append(GroupJob(name, path, (), float(doc["slo"]), doc.get("max_response_length"), load_config(path),
                             slots))
    return GroupSpec(source=Path(group_dir) / "group.json", dir=Path(group_dir),
                     pools={p: tuple(group["pools"][p]) for p in POOLS}, jobs=tuple(jobs),
                     tail_fraction=float(group["tail_fraction"]), tail_slots=int(group["tail_slots"]),
                     poll_interval_s=float(group["poll_interval_s"]), timeout_s=float(group["timeout_s"]),
                     park_s=float(group["park_s"]), host_memory_gb=group.get("host_memory_gb"),
                     gpus_per_node=int(group["gpus_per_node"]), schedule=group.get("schedule", "round_robin"))


def candidate(group_dir: Path, name: str, config: str | Path, overrides: Sequence[str] = (),
              slo: float | None = None, max_response_length: int | None = None) -> tuple[GroupSpec, GroupJob]:
    """The running group with ``name`` joined (last in the order), validated; ``ConfigError`` lists
    what is wrong with the request."""
    group = read_json(Path(group_dir) / "group.json")
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
    spec = live_spec(group_dir, group, active_members(group_dir, group))
    return replace(spec, jobs=(*spec.jobs, job)), job


def measured_check(group_dir: Path, job: GroupJob) -> dict[str, Any]:
    """The SLO prediction again with the members' measured phase times where the group recorded
    some (:mod:`slurm_rl.mux.live`: each member's profile scaled to its measured rollout and
    training means; the placer decides on these), the newcomer at its own profile.

    Reported, not a refusal: measured in-group phases include the warm switches and the polls
    around them, which the newcomer's profile does not, so on short phases this view is far more
    pessimistic than the group turns out (seen: 5.8x predicted where the cost model said 1.8x and
    the group ran the job at 1.45x)."""
    from slurm_rl.mux.admission import check_slo
    from slurm_rl.mux.live import profile_of, read_group
    from slurm_rl.mux.placer import group_spec

    group = read_group(Path(group_dir), time.time())
    figures: dict[str, Any] = {"member_times": {m.name: m.times for m in group.members}}
    if group.problems or not any(m.times.startswith("measured") for m in group.members):
        return figures
    newcomer = profile_of(job.cfg, job.name, job.slo, group.park_s, group.tail_fraction, job.max_response_length)
    spec = group_spec(group, 0)
    slow, bad = check_slo(spec.with_member(newcomer), newcomer, "conservative")
    figures["slowdown_max_lengths"] = {n: round(v, 3) for n, v in slow.items()}
    figures["beyond_slo"] = bad
    return figures


def add_job(group_dir: Path, name: str, config: str | Path, overrides: Sequence[str] = (), slo: float | None = None,
            max_response_length: int | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Admit ``name`` into the running group at ``group_dir`` (see the module docstring); the
    admission figures. ``ConfigError``: refused or bad request (nothing created);
    :class:`MembershipError`: the group is not running."""
    from slurm_rl.launch.prepare import prepare_run
    from slurm_rl.mux.group_admission import admit

    group_dir = Path(group_dir).absolute()
    with membership_lock(group_dir):
        state, _ = group_state(group_dir)
        if state not in ("running", None) or not (group_dir / "group.json").exists():
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
        group = read_json(group_dir / "group.json")
        group["jobs"][name] = {**job_json(job), "run_dir": str(run_dir),
                               "heartbeat_timeout_s": job.cfg.runtime.heartbeat_timeout_s}
        group["members"] = [*group["members"], name]
        number = _publish_record(group_dir, {"join": name, "config": str(job.config_path),
                                             "overrides": list(job.overrides), "slo": job.slo, "admission": figures})
        atomic_write_json(group_dir / "group.json", group)
    figures["record"] = number
    return figures


def remove_job(group_dir: Path, name: str, reason: str = "removed from the group") -> int:
    """Record that ``name`` leaves and ask it to stop at its next gate (with a checkpoint); the record's number."""
    from slurm_rl.resume.stop import request_stop

    group_dir = Path(group_dir).absolute()
    with membership_lock(group_dir):
        group = read_json(group_dir / "group.json")
        if name not in group["jobs"]:
            raise MembershipError(f"job {name!r} is not a member of {group_dir} (members: {group['members']})")
        number = _publish_record(group_dir, {"leave": name, "reason": reason})
        request_stop(Path(group["jobs"][name]["run_dir"]), reason)
    return number
