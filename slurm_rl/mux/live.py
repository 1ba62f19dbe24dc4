"""The co-execution groups under a cluster directory as they are now, read from files only.

A *cluster directory* holds one group dir per group (``<name>/group.json``, written by
``slurm-rl mux`` / ``sbatch/mux.sh``), the group files the placer wrote (``groups/<name>.yaml``) and
the placer's log (``placements.jsonl``). :func:`read_cluster` gives every group with its state:

- ``running``: its group scheduler's status says running and something shows it alive (the status
  written within ``stale_s``, a member rank's heartbeat within its timeout, or the lease holder's
  process alive on this host);
- ``stale``: the status says running but nothing shows it alive (its GPUs still count as held);
- ``pending``: submitted by a placer (``placements.jsonl``) and not started (no group.json or no
  status yet), unless Slurm says the batch job left the queue (``failed``);
- ``finished`` / ``failed``: the group scheduler said so.

A member is in the rotation unless the group scheduler counted it out, it left
(:func:`group_state.active_members`) or its run's coordinator status is finished/failed/stopped. Each running member gets a :class:`JobProfile` from its run's
``config.yaml`` (the cost model, :func:`predict.job_profile`); where the group recorded complete
phases of the member (its slots' release files), the profile's phase times are scaled to the
measured means (``times`` says which).
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from slurm_rl.control.atomic import read_json
from slurm_rl.control.grants import GroupPaths
from slurm_rl.control.heartbeats import read_heartbeat
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.fsio import read_jsonl
from slurm_rl.mux.group_state import GROUP_JSON, active_members, read_group_json
from slurm_rl.mux.model import GroupModel, JobProfile, Pools, SwitchCosts
from slurm_rl.mux.predict import job_profile

PLACEMENTS_FILE = "placements.jsonl"
GROUP_FILES_DIR = "groups"
STALE_S = 300.0  # a group scheduler status older than this, with no other sign of life: stale
HELD_STATES = ("running", "stale", "pending")  # states whose GPUs count as taken
OUT_RUN_STATES = ("finished", "failed", "stopped")
BYTES_TRAIN_SLOT = 16  # per parameter parked on a train slot (fp32 params, grads, Adam moments)
BYTES_ROLLOUT_SLOT = 2  # per parameter on a rollout slot (bf16 weights)

#: ``queued(job_ids) -> {job id: Slurm state}`` for the ids Slurm still knows (None: unknown).
QueueQuery = Callable[[Sequence[str]], "Mapping[str, str] | None"]


@dataclass(frozen=True)
class LiveMember:
    """A member still in its group's rotation, as the admission model sees it."""

    name: str
    run_dir: Path
    profile: JobProfile | None  # None: no profile (``problem`` says why)
    times: str  # "predicted" or "measured (N rollout / M train phases)"
    done_iterations: int
    rollout_slots: tuple[int, ...]
    train_slots: tuple[int, ...]
    problem: str = ""


@dataclass(frozen=True)
class LiveGroup:
    """One group (or one co-located run the placer submitted) under the cluster directory."""

    name: str
    dir: Path
    state: str  # running / stale / pending / finished / failed
    why: str
    pools: Mapping[str, tuple[int, ...]]
    members: tuple[LiveMember, ...] = ()
    out: Mapping[str, str] = field(default_factory=dict)  # members out of the rotation -> why
    park_s: float = 0.0
    tail_fraction: float = 0.8
    schedule: str = "round_robin"
    host_memory_gb: float | None = None
    gpus_per_node: int = 8
    sbatch_job: str | None = None
    colocated: bool = False  # a single run sharing its slots (not a group: never a target)
    gpus_held: int | None = None  # GPUs of the allocation (default: the pools' slots)

    @property
    def gpus(self) -> int:
        return self.gpus_held if self.gpus_held is not None else sum(len(s) for s in self.pools.values())

    @property
    def holds_gpus(self) -> bool:
        return self.state in HELD_STATES

    @property
    def problems(self) -> list[str]:
        return [f"member {m.name}: {m.problem}" for m in self.members if m.profile is None]

    @property
    def target(self) -> bool:
        """Whether a job may join it now (running, a rotation, every member profiled)."""
        return self.state == "running" and not self.colocated and bool(self.members) and not self.problems

    def model(self, gid: int) -> GroupModel:
        """The admission model's view of this group (a slot is one GPU; host memory per slot)."""
        host = self.host_memory_gb * 1e9 / max(1, self.gpus_per_node) if self.host_memory_gb else math.inf
        members = tuple(m.profile for m in self.members if m.profile is not None)
        return GroupModel(pools=Pools(tuple(self.pools["rollout"]), tuple(self.pools["train"]), 1, host),
                          members=members,
                          rollout_assign={m.name: m.rollout_slots for m in self.members if m.rollout_slots},
                          train_assign={m.name: m.train_slots for m in self.members if m.train_slots},
                          gid=gid, schedule=self.schedule,
                          remaining={m.name: max(1, m.profile.iterations - m.done_iterations)
                                     for m in self.members if m.profile is not None})


# -- reading ----------------------------------------------------------------------------------------

def read_placements(cluster_dir: Path) -> list[dict[str, Any]]:
    """Every complete record of ``cluster_dir/placements.jsonl``, oldest first."""
    return read_jsonl(Path(cluster_dir) / PLACEMENTS_FILE)


def read_cluster(cluster_dir: str | Path, *, now: float | None = None, stale_s: float = STALE_S,
                 queued: QueueQuery | None = None, profiles: bool = True) -> list[LiveGroup]:
    """Every group under ``cluster_dir`` (subdirs holding group.json, and the groups and co-located
    runs a placer submitted that have not started), sorted by name. ``queued``: asks Slurm which
    submitted batch jobs it still knows (default: ``squeue`` where it is on PATH); ``profiles``:
    build the members' JobProfiles of running groups (the admission model's input)."""
    root = Path(cluster_dir)
    now = time.time() if now is None else now
    submitted = _submitted(root)
    out: dict[str, LiveGroup] = {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if (sub / GROUP_JSON).is_file():
            rec = submitted.get(sub.name, {})
            out[sub.name] = read_group(sub, now, stale_s, rec.get("sbatch_job"), profiles)
    query = queued if queued is not None else squeue_states
    waiting = {n: r for n, r in submitted.items() if n not in out or out[n].state == "pending"}
    states = query([r["sbatch_job"] for r in waiting.values() if r.get("sbatch_job")]) if waiting else {}
    for name, rec in waiting.items():
        if rec.get("kind") == "colocated":
            out[name] = _colocated(root, name, rec, states)
        else:
            out[name] = _pending(root, name, rec, states, out.get(name))
    return [out[n] for n in sorted(out)]


def _submitted(root: Path) -> dict[str, dict[str, Any]]:
    """Allocations placers submitted (``new`` groups, ``colocated`` runs), by name: the last record."""
    recs: dict[str, dict[str, Any]] = {}
    for r in read_placements(root):
        act = r.get("action") or {}
        if act.get("submitted") and isinstance(act.get("group"), str):
            recs[act["group"]] = {"kind": r.get("kind"), **act}
    return recs


def _pools(doc: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    return {p: tuple(int(s) for s in doc.get(p, ())) for p in ("rollout", "train")}


def _pending(root: Path, name: str, rec: Mapping[str, Any], states: Mapping[str, str] | None,
             seen: LiveGroup | None) -> LiveGroup:
    job = rec.get("sbatch_job")
    state, why = "pending", f"submitted as Slurm job {job}, not started"
    if states is not None and job and job not in states and seen is None:
        state, why = "failed", f"Slurm job {job} left the queue without starting the group"
    elif states is not None and job in (states or {}):
        why = f"Slurm job {job} is {states[job].lower()}"
    if seen is not None:
        return replace(seen, why=f"{seen.why}; {why}", sbatch_job=job)
    return LiveGroup(name=name, dir=root / name, state=state, why=why, pools=_pools(rec.get("pools") or {}),
                     sbatch_job=job, gpus_held=rec.get("gpus"))


def _colocated(root: Path, name: str, rec: Mapping[str, Any], states: Mapping[str, str] | None) -> LiveGroup:
    """A co-located run the placer submitted: its GPUs are held until its run ends."""
    job = rec.get("sbatch_job")
    run_dir = Path(rec.get("run_dir") or root / name)
    status = _run_state(run_dir)
    if status in OUT_RUN_STATES:
        state, why = ("finished" if status == "finished" else "failed"), f"run {status}"
    elif states is not None and job and job not in states:
        state, why = "failed", f"Slurm job {job} left the queue (run state {status or 'never started'})"
    else:
        state, why = ("running" if status else "pending"), f"Slurm job {job}, run {status or 'not started'}"
    return LiveGroup(name=name, dir=run_dir, state=state, why=why, pools=_pools(rec.get("pools") or {}),
                     sbatch_job=job, colocated=True, gpus_held=rec.get("gpus"))


def read_group(gdir: Path, now: float, stale_s: float = STALE_S, sbatch_job: str | None = None,
               profiles: bool = True) -> LiveGroup:
    """One group from its files: state, pools, members still in the rotation and (``profiles``)
    their admission profiles, measured phase times where the group recorded them."""
    doc = read_group_json(gdir)
    paths = GroupPaths(gdir)
    status = read_coordinator_status(paths)
    names = list(doc.get("members") or doc.get("jobs", {}))
    jobs = doc.get("jobs", {})
    out = dict(status.out or {}) if status is not None else {}
    active = set(active_members(gdir, {**doc, "members": names}))
    for n in names:  # a run that ended or left is out even before the group scheduler noticed
        if n not in active and n not in out:
            out[n] = f"run {_run_state(Path(jobs[n]['run_dir'])) or 'left the group'}"
    if status is None:
        state, why = "pending", "group scheduler not started"
    elif status.state == "finished":
        failed = status.document.get("failed") or {}
        state, why = ("failed", f"jobs failed: {sorted(failed)}") if failed and len(failed) == len(names) \
            else ("finished", "group scheduler finished")
    elif status.failed:
        state, why = "failed", f"group scheduler failed: {status.error}"
    else:
        alive = _alive(paths, doc, status, names, out, now, stale_s)
        state, why = ("running", alive) if alive else (
            "stale", f"group scheduler status {status.state!r} but no sign of life for {stale_s:.0f}s")
    common = dict(name=gdir.name, dir=gdir, state=state, why=why, pools=_pools(doc.get("pools", {})), out=out,
                  park_s=float(doc.get("park_s", 0.0)), tail_fraction=float(doc.get("tail_fraction", 0.8)),
                  schedule=str(doc.get("schedule", "round_robin")), host_memory_gb=doc.get("host_memory_gb"), gpus_per_node=int(doc.get("gpus_per_node", 8)),
                  sbatch_job=sbatch_job)
    members: list[LiveMember] = []
    if state == "running" and profiles:
        members = [_member(paths, n, jobs[n], float(doc.get("park_s", 0.0)), float(doc.get("tail_fraction", 0.8)))
                   for n in names if n not in out]
    elif state in ("running", "stale", "pending"):
        members = [LiveMember(n, Path(jobs[n].get("run_dir", "")), None, "not read", 0,
                              *_slots(jobs[n]), problem="not profiled") for n in names if n not in out]
    return LiveGroup(members=tuple(members), **common)


def _alive(paths: GroupPaths, doc: Mapping[str, Any], status: Any, names: Sequence[str],
           out: Mapping[str, str], now: float, stale_s: float) -> str:
    """Why the group scheduler counts as alive ('' when nothing shows it)."""
    if status.time is not None and now - float(status.time) < stale_s:
        return f"group scheduler status {now - float(status.time):.0f}s old"
    for n in names:
        spec = doc["jobs"][n]
        if n in out or "run_dir" not in spec:
            continue
        timeout = float(spec.get("heartbeat_timeout_s") or 30.0)
        for rank in range(int(spec.get("world_size", 0))):
            try:
                beat = read_heartbeat(RunPaths(Path(spec["run_dir"])), rank)
            except (OSError, ValueError):
                continue
            if beat is not None and now - float(beat.get("time", 0.0)) < timeout:
                return f"job {n} rank {rank} heartbeat {now - float(beat['time']):.0f}s old"
    if status.host == socket.gethostname() and status.pid and _pid_alive(int(status.pid)):
        return f"group scheduler pid {status.pid} alive on this host"
    return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run_state(run_dir: Path) -> str | None:
    try:
        status = read_coordinator_status(RunPaths(run_dir))
    except (OSError, ValueError):
        return None
    return status.state if status is not None else None


def _slots(spec: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    rank_slots = spec.get("rank_slots", {}).values()
    return (tuple(sorted(int(s) for p, s in rank_slots if p == "rollout")),
            tuple(sorted(int(s) for p, s in rank_slots if p == "train")))


def _member(paths: GroupPaths, name: str, spec: Mapping[str, Any], park_s: float, tail: float) -> LiveMember:
    run_dir = Path(spec["run_dir"])
    rollout, train = _slots(spec)
    done = _done_iterations(run_dir)
    try:
        from slurm_rl.config import load_config

        cfg = load_config(run_dir / "config.yaml", ["runtime.device=emulated"])  # its cost model
        prof = profile_of(cfg, name, float(spec.get("slo", 2.0)), park_s, tail, spec.get("max_response_length"))
    except Exception as exc:  # noqa: BLE001 - any unreadable member takes the group out of the candidates
        return LiveMember(name, run_dir, None, "none", done, rollout, train,
                          problem=f"no profile from {run_dir / 'config.yaml'}: {type(exc).__name__}: {exc}")
    prof, times = with_measured_times(prof, measured_phases(paths, name), len(rollout) or prof.rollout_slots)
    return LiveMember(name, run_dir, prof, times, done, rollout, train)


def _done_iterations(run_dir: Path) -> int:
    from slurm_rl.metrics import read_metrics

    try:
        return len(read_metrics(run_dir))
    except OSError:
        return 0


# -- profiles ---------------------------------------------------------------------------------------

def profile_of(cfg: Any, name: str, slo: float, park_s: float = 0.0, tail_fraction: float = 0.8,
               max_response_length: int | None = None) -> JobProfile:
    """The admission model's profile of a run config (its cost model; ``runtime.device`` emulated):
    its SLO, a group's warm switch (twice ``park_s``: park and resume), parked bytes per slot and,
    with ``max_response_length``, the conservative times at that length."""
    switch = SwitchCosts(rollout_warm_s=2 * park_s, train_warm_s=2 * park_s, cold_s=0.0, migrate_s=0.0)
    prof, _ = job_profile(cfg, name, tail_fraction, switch)
    params = float(cfg.emulated.model_params)
    prof = replace(prof, slo=float(slo), rollout_bytes_per_slot=params * BYTES_ROLLOUT_SLOT,
                   train_bytes_per_slot=params * BYTES_TRAIN_SLOT)
    if max_response_length and prof.max_response_len:
        prompt = float(cfg.emulated.prompt_len)
        r = max_response_length / prof.max_response_len
        t = (prompt + max_response_length) / (prompt + prof.max_response_len)
        prof = replace(prof, max_response_s=prof.max_response_s * r, train_max_s=prof.train_max_s * t,
                       max_response_len=int(max_response_length))
    return prof


def measured_phases(paths: GroupPaths, job: str) -> dict[str, list[float]]:
    """Seconds of each complete phase the group recorded for ``job``, by pool: from the first
    slot's start to the last slot's end (the slots' release files; skipped slots not counted)."""
    root = paths.control / "releases" / job
    out: dict[str, list[float]] = {"rollout": [], "train": []}
    try:
        phases = sorted(os.listdir(root))
    except (FileNotFoundError, ValueError):
        return out
    for phase in phases:
        pool, _, it = phase.partition("-")
        if pool not in out or not it.isdigit():
            continue
        starts, ends = [], []
        for name in os.listdir(root / phase):
            try:
                doc = read_json(root / phase / name)
            except (OSError, ValueError):
                continue
            if not doc.get("skipped") and isinstance(doc.get("started_at"), (int, float)) \
                    and isinstance(doc.get("ended_at"), (int, float)):
                starts.append(float(doc["started_at"]))
                ends.append(float(doc["ended_at"]))
        if starts and max(ends) > min(starts):
            out[pool].append(max(ends) - min(starts))
    return out


def with_measured_times(prof: JobProfile, phases: Mapping[str, list[float]], rollout_slots: int
                        ) -> tuple[JobProfile, str]:
    """``prof`` with its rollout and training times scaled to the measured means (each pool
    separately, where measured); the second item says which times the profile holds."""
    r, t = phases.get("rollout") or [], phases.get("train") or []
    if not r and not t:
        return prof, "predicted"
    if r:
        k = (sum(r) / len(r)) / max(1e-9, prof.expected_rollout_s(rollout_slots))
        prof = replace(prof, response_s=tuple(tuple(d * k for d in it) for it in prof.response_s),
                       max_response_s=prof.max_response_s * k)
    if t:
        k = (sum(t) / len(t)) / max(1e-9, prof.expected_train_s())
        prof = replace(prof, train_s=tuple(x * k for x in prof.train_s), train_max_s=prof.train_max_s * k)
    which = ", ".join(x for x in (f"{len(r)} rollout" if r else "", f"{len(t)} train" if t else "") if x)
    return prof, f"measured ({which} phases)"


# -- Slurm ------------------------------------------------------------------------------------------

def squeue_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """{job id: state} of the ``job_ids`` Slurm's queue still holds; None without squeue."""
    import shutil
    import subprocess

    if not job_ids or shutil.which("squeue") is None:
        return None
    try:
        proc = subprocess.run(["squeue", "-h", "-o", "%i %T", "-j", ",".join(job_ids)], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
        return None
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0].split("_")[0]] = parts[1]
    return out
