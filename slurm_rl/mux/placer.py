"""``slurm-rl mux place``: put a new RL job into the groups of a cluster directory (Slurm-native, no service).

One placer step, under the exclusive lock ``CLUSTER_DIR/placer.lock``:

1. read the cluster (:func:`~slurm_rl.mux.live.read_cluster`): groups and their states, members
   still in the rotation and their profiles (measured phase times where the group recorded them);
2. :func:`decide`: map the running groups to the admission model's groups and call
   :func:`admission.place` (``place_hybrid`` where it exists). A ``scaled`` choice cannot be carried
   out (a running Slurm allocation does not grow): it is reported and the next choice taken; a
   ``new`` group needs free GPUs (the partition's from ``sinfo``, or ``--max-gpus``, less those of
   every group running or pending under the cluster directory): when it does not fit, the job
   joins a group that admits it, else it is refused with the reason;
3. act: ``direct`` -> :func:`slurm_rl.mux.membership.add_job`; ``new`` -> a group file
   ``groups/<group>.yaml`` and ``sbatch sbatch/mux.sh`` on it; ``colocated`` -> ``sbatch
   sbatch/train.sh`` with every component on the same slots; ``refused`` -> nothing;
4. append the decision (reason, figures, decision time, what was done) as one line to
   ``CLUSTER_DIR/placements.jsonl``; a submitted group counts as pending for the next placer.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import yaml
from filelock import FileLock, Timeout

from slurm_rl.config import Config, ConfigError, ConfigIssue, load_config
from slurm_rl.control.grants import JOB_NAME_CHARS
from slurm_rl.errors import InputError, LaunchError, WaitTimeout
from slurm_rl.fsio import append_bytes, atomic_write_bytes, atomic_write_json
from slurm_rl.job_limits import job_timeout_s
from slurm_rl.mux.group_file import load_group
from slurm_rl.mux.membership import MembershipError, add_job
from slurm_rl.mux.live import (GROUP_FILES_DIR, PLACEMENTS_FILE, LiveGroup, QueueQuery, profile_of, read_cluster,
                               read_placements)
from slurm_rl.mux.slurm_capacity import Capacity, SbatchError, resource_args, sbatch, slurm_capacity
from slurm_rl.mux import admission
from slurm_rl.mux.analysis import SLO_EPS, member_phases, meta_iteration, residency_problems
from slurm_rl.mux.model import GroupModel, JobProfile

__all__ = ["Placement", "PlacerSpec", "decide", "place", "read_cluster", "LOCK_FILE"]

LOCK_FILE = "placer.lock"
HOLDER_FILE = "placer.holder.json"
LOCK_TIMEOUT_S = 60.0
DEFAULT_SLO = 2.0
REPO_ROOT = Path(__file__).resolve().parents[2]
KINDS = ("direct", "new", "colocated", "refused")


class PlacerLockTimeout(WaitTimeout):
    """Another placer held the cluster directory's lock for longer than the timeout."""


@dataclass(frozen=True)
class PlacerSpec:
    """What :func:`decide` may use besides the groups: the cluster's capacity, the admission model's
    settings (a slot is one GPU here), the newcomer's max response length and, for a new group,
    host memory per node (None: unchecked)."""

    capacity: Capacity
    admission: admission.ClusterSpec = field(default_factory=lambda: admission.ClusterSpec(gpus_per_slot=1))
    max_response_length: int | None = None
    host_memory_gb: float | None = None
    colocated: bool = True  # the admission model may choose co-location (place_hybrid)
    # why the job cannot run co-located on N slots (None: it can); None: not checked
    colocated_check: Callable[[int], str | None] | None = None


@dataclass(frozen=True)
class Placement:
    """A placer's decision: its kind, the target group (``new``: the group to create), why, the
    figures behind it, the model's own first choice (``predicted``) and why other choices were not
    carried out (``fallbacks``), the time :func:`decide` took and what was done (``action``)."""

    kind: str
    job: str
    group: str | None
    reason: str
    figures: Mapping[str, Any] = field(default_factory=dict)
    predicted: str = ""
    fallbacks: tuple[str, ...] = ()
    decision_ms: float = 0.0
    action: Mapping[str, Any] = field(default_factory=dict)
    dry_run: bool = False

    @property
    def refused(self) -> bool:
        return self.kind == "refused"

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "kind": self.kind, "group": self.group, "reason": self.reason,
                "predicted": self.predicted, "fallbacks": list(self.fallbacks), "figures": dict(self.figures),
                "decision_ms": round(self.decision_ms, 3), "action": dict(self.action), "dry_run": self.dry_run}


# -- deciding ---------------------------------------------------------------------------------------

def group_problem(cfg: Config) -> str | None:
    """Why the config cannot be a group member (None: it can): a group's pools are disaggregated."""
    comps = {c: set(p.ranks) for c, p in cfg.placement.components.items()}
    rollout = comps.get("rollout", set())
    train = comps.get("actor", set()) | comps.get("inference", set())
    if not rollout or "actor" not in comps:
        return "it has no rollout or no actor component"
    if rollout & train:
        return f"its ranks {sorted(rollout & train)} serve rollout and actor/inference (a group's pools are disaggregated)"
    idle = set(range(cfg.placement.world_size)) - rollout - train
    if idle:
        return f"its ranks {sorted(idle)} are idle"
    if cfg.scheduler.policy != "static":
        return f"scheduler.policy is {cfg.scheduler.policy!r}; a group member needs static (the group decides when it runs)"
    return None


def _admit(job: JobProfile, specs: Sequence[GroupModel], cluster: admission.ClusterSpec, hybrid: bool = True) -> Any:
    """The admission model's choice (``place_hybrid``: a ``colocated`` choice too; else ``place``)."""
    return admission.place_hybrid(job, specs, cluster) if hybrid else admission.place(job, specs, cluster)


def _why_not(job: JobProfile, g: GroupModel, name: str) -> str:
    """One line on why ``g`` does not take ``job`` as it is (conservative times, as admission)."""
    if len(g.pools.train) < job.train_slots:
        return f"group {name}: {len(g.pools.train)} train slots < the job's {job.train_slots}"
    cand = g.with_member(job)
    problems = residency_problems(cand)
    if problems:
        return f"group {name}: residency: {problems[0]}"
    slow = dict(meta_iteration(member_phases(cand, conservative=True), schedule=cand.schedule).slowdown)
    if len(cand.members) > 1:  # the newcomer also waits one meta-iteration for its first turn
        slow[job.name] *= (job.iterations + 1) / job.iterations
    slos = {m.name: m.slo for m in cand.members}
    bad = [f"{n} {v:.2f}x > SLO {slos[n]:.2f}x" for n, v in slow.items() if v > slos[n] + SLO_EPS]
    return f"group {name}: SLO: {', '.join(bad) or 'met only with expected times'} (max-length times)"


def _gpus(kind: str, decision: Any, job: JobProfile) -> int:
    """GPUs an allocation of this kind needs (``new``: the job's own rollout + train slots)."""
    if kind == "colocated":  # actor and rollout one after the other on its training slots
        return len(decision.train_slots) or job.train_slots
    return job.rollout_slots + job.train_slots if kind == "new" else 0


def decide(job_cfg: Config, name: str, slo: float, groups: Sequence[LiveGroup], cluster_spec: PlacerSpec) -> Placement:
    """Where ``name`` (``job_cfg`` read as its cost model's: ``runtime.device`` emulated) goes among
    ``groups`` (see the module docstring); pure apart from the cost model's simulation."""
    t0 = time.perf_counter()
    cap = cluster_spec.capacity
    held = sum(g.gpus for g in groups if g.holds_gpus)
    free = None if cap.total_gpus is None else cap.total_gpus - held
    notes: list[str] = []
    targets: list[LiveGroup] = []
    for g in groups:
        if g.state == "running" and not g.colocated and not g.target:
            notes.append(f"group {g.name} is not a candidate: "
                         + ("; ".join(g.problems) if g.problems else "no member in the rotation"))
        elif g.target:
            targets.append(g)
    park = max((g.park_s for g in targets), default=float(job_cfg.mux.park_s))
    tail = max((g.tail_fraction for g in targets), default=0.8)
    problem = group_problem(job_cfg)
    try:
        job = profile_of(job_cfg, name, slo, park, tail, cluster_spec.max_response_length)
    except ValueError as exc:
        why = f"no profile of the job ({exc})" + (f"; no group can take it: {problem}" if problem else "")
        return _done(t0, Placement("refused", name, None, why))
    fits = [g for g in targets if len(g.pools["rollout"]) >= job.rollout_slots]
    notes += [f"group {g.name}: {len(g.pools['rollout'])} rollout slots < the job's {job.rollout_slots} rollout ranks"
              for g in targets if g not in fits]
    if problem is not None:
        fits = []
        notes.append(f"no group can take it: {problem}")
    specs = [g.model(i) for i, g in enumerate(fits)]
    names = {i: g.name for i, g in enumerate(fits)}
    base = {"capacity_gpus": cap.total_gpus, "capacity_source": cap.source, "held_gpus": held, "free_gpus": free,
            "job": {"rollout_slots": job.rollout_slots, "train_slots": job.train_slots, "slo": slo,
                    "solo_iteration_s": round(job.solo_iteration_s(), 3),
                    "solo_iteration_max_s": round(job.solo_iteration_s(conservative=True), 3)},
            "member_times": {g.name: {m.name: m.times for m in g.members} for g in fits},
            "candidates": [g.name for g in fits]}
    adm = cluster_spec.admission
    excluded_new = problem is not None
    if excluded_new:  # co-located is all that is left
        adm = replace(adm, host_bytes_per_slot=-1.0)
    first = _admit(job, specs, adm, cluster_spec.colocated)
    predicted = _describe(first, names)
    base["predicted"] = _figures(first, names)
    decision, fallbacks = first, []
    hybrid = cluster_spec.colocated
    for _ in range(4):  # each round takes one kind out: scaled, new, colocated
        kind, need = decision.kind, _gpus(decision.kind, decision, job)
        if kind == "scaled":
            fallbacks.append(f"{_describe(decision, names)} predicted, but a running Slurm allocation cannot grow "
                             f"(+{decision.added_rollout_slots} rollout slots): not carried out")
            adm = replace(adm, max_added_rollout_slots=0)
        elif kind == "colocated" and cluster_spec.colocated_check is not None \
                and (why := cluster_spec.colocated_check(need)) is not None:
            fallbacks.append(f"co-located predicted, but the run cannot share its slots: {why.split('; ')[0]}")
            hybrid = False
        elif kind in ("new", "colocated") and (free is None or free < need):
            fallbacks.append(f"capacity: a {'new group' if kind == 'new' else 'co-located run'} needs {need} GPUs, "
                             + (f"{free} of {cap.total_gpus} free ({held} held under the cluster dir; {cap.source})"
                                if free is not None else f"capacity unknown ({cap.source})"))
            if kind == "new":
                adm = replace(adm, host_bytes_per_slot=-1.0)  # a group of its own never fits: new is out
                excluded_new = True
            else:
                hybrid = False
        else:
            break
        decision = _admit(job, specs, adm, hybrid)  # the choice among what is left
    kind = decision.kind
    group = names.get(decision.group) if decision.group is not None else None
    if kind == "refused":  # what refuses it first (capacity, each group's SLO), then what was not carried out
        why = [f for f in fallbacks if f.startswith("capacity")]
        for part in decision.reason.split("; "):  # the job alone misses its SLO or host memory; co-located
            if ("even alone" in part and not excluded_new) or part.startswith("co-located"):
                why.append(part)
        if problem is None:
            why += [_why_not(job, s, names[s.gid]) for s in specs] or ["no running group to join under the cluster dir"]
        why += [*notes, *(f for f in fallbacks if not f.startswith("capacity"))]
        reason = "; ".join(why)
    else:
        reason = decision.reason + (f" (the model's first choice, {predicted}, not carried out)" if fallbacks else "")
    figures = {**base, **_figures(decision, names), "gpus_needed": _gpus(kind, decision, job)}
    if notes:
        figures["notes"] = notes
    return _done(t0, Placement(kind, name, group, reason, figures, predicted, tuple(fallbacks)))


def _done(t0: float, p: Placement) -> Placement:
    return replace(p, decision_ms=(time.perf_counter() - t0) * 1e3)


def _describe(d: Any, names: Mapping[int, str]) -> str:
    where = f" into {names.get(d.group, d.group)}" if d.group is not None else ""
    return f"{d.kind}{where}"


def _figures(d: Any, names: Mapping[int, str]) -> dict[str, Any]:
    return {"kind": d.kind, "group": names.get(d.group) if d.group is not None else None,
            "added_rollout_slots": d.added_rollout_slots, "train_slots": list(d.train_slots),
            "delta_cost_per_h": round(d.delta_cost_per_h, 3), "delta_cost": round(d.delta_cost, 3),
            "slowdowns": {k: round(v, 4) for k, v in d.slowdowns.items()}, "rejected": dict(d.rejected)}


# -- acting -----------------------------------------------------------------------------------------

@contextmanager
def placer_lock(cluster_dir: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold ``cluster_dir/placer.lock``; :class:`PlacerLockTimeout` names the holder it waited for."""
    path = cluster_dir / LOCK_FILE
    holder = cluster_dir / HOLDER_FILE
    try:
        with FileLock(str(path), timeout=timeout_s):
            atomic_write_json(holder, {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()},
                              durable=False)
            yield
    except Timeout:
        try:
            who = holder.read_text().strip()
        except OSError:
            who = "unknown"
        raise PlacerLockTimeout(f"waited {timeout_s:.0f}s for the placer lock {path} (held by {who}: another "
                                "`slurm-rl mux place` on this cluster dir)") from None


def job_name(name: str | None, config: str | Path, taken: set[str]) -> str:
    """``name`` checked (InputError when malformed or taken), or one made from the config's file name."""
    if name is not None:
        if not name or not set(name) <= JOB_NAME_CHARS:
            raise InputError(f"--name: got {name!r}; allowed: lower-case letters, digits, '_' and '-'")
        if name in taken:
            raise InputError(f"--name: got {name!r}; allowed: a name no group under the cluster dir uses "
                             f"(used: {sorted(taken)})")
        return name
    stem = re.sub(r"[^a-z0-9_-]+", "-", Path(config).stem.lower()).strip("-") or "job"
    out, k = stem, 2
    while out in taken:
        out, k = f"{stem}-{k}", k + 1
    return out


def _taken(groups: Sequence[LiveGroup], records: Sequence[Mapping[str, Any]]) -> set[str]:
    held = {g.name for g in groups if g.holds_gpus}
    names = {n for g in groups if g.holds_gpus for n in (*(m.name for m in g.members), *g.out)}
    names |= {r["job"] for r in records if (r.get("action") or {}).get("group") in held and "job" in r}
    return names


def _new_group_name(cluster_dir: Path, groups: Sequence[LiveGroup]) -> str:
    used = {g.name for g in groups}
    k = 1
    while f"group-{k:03d}" in used or (cluster_dir / f"group-{k:03d}").exists() \
            or (cluster_dir / GROUP_FILES_DIR / f"group-{k:03d}.yaml").exists():
        k += 1
    return f"group-{k:03d}"


def _range(slots: Sequence[int]) -> str:
    return f"{slots[0]}-{slots[-1]}" if len(slots) > 1 else str(slots[0])


def write_group_file(cluster_dir: Path, group: str, name: str, config: Path, overrides: Sequence[str], slo: float,
                     cfg: Config, rollout: int, train: int, spec: PlacerSpec) -> tuple[Path, dict[str, Any]]:
    """``groups/<group>.yaml``: the job alone on its own pools (rollout slots first), validated."""
    pools = {"rollout": list(range(rollout)), "train": list(range(rollout, rollout + train))}
    job: dict[str, Any] = {"config": str(config), "slo": slo, "overrides": list(overrides)}
    if spec.max_response_length:
        job["max_response_length"] = spec.max_response_length
    doc = {"group": {"dir": str(cluster_dir / group),
                     "pools": {p: _range(s) for p, s in pools.items()},
                     "tail_fraction": 0.8 if rollout > 1 else 1.0, "tail_slots": 1,
                     "park_s": float(cfg.mux.park_s), "timeout_s": job_timeout_s(cfg.runtime.run_timeout_s, 0.0),
                     "host_memory_gb": spec.host_memory_gb, "gpus_per_node": spec.capacity.gpus_per_node},
           "jobs": {name: job}}
    path = cluster_dir / GROUP_FILES_DIR / f"{group}.yaml"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_bytes(path, yaml.safe_dump(doc, sort_keys=False).encode())
    load_group(path)  # ConfigError: what the group file got wrong
    return path, pools


def _submit_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("SLURM_RL_PYTHON", sys.executable)  # the batch script runs this placer's Python
    return env


def _act_new(cluster_dir: Path, p: Placement, groups: Sequence[LiveGroup], config: Path, overrides: Sequence[str],
             slo: float, cfg: Config, spec: PlacerSpec, sbatch_args: Sequence[str]) -> Placement:
    group = _new_group_name(cluster_dir, groups)
    job = p.figures["job"]
    path, pools = write_group_file(cluster_dir, group, p.job, config, overrides, slo, cfg, job["rollout_slots"],
                                   job["train_slots"], spec)
    slots = job["rollout_slots"] + job["train_slots"]
    (cluster_dir / "logs").mkdir(mode=0o700, exist_ok=True)
    args = [*resource_args(slots, spec.capacity), f"--job-name=slurm-rl-mux-{group}",
            f"--time={int(job_timeout_s(cfg.runtime.run_timeout_s, cfg.runtime.checkpoint_margin_s) // 60) + 1}",
            f"--output={cluster_dir / 'logs' / group}-%j.out", *sbatch_args, str(REPO_ROOT / "sbatch" / "mux.sh"),
            str(path)]
    action = {"group": group, "group_dir": str(cluster_dir / group), "group_file": str(path), "pools": pools,
              "gpus": slots, "sbatch_args": args[:-2]}
    try:
        job_id = sbatch(args, cwd=REPO_ROOT, env=_submit_env())
    except SbatchError as exc:
        raise _Failed(replace(p, group=group, action={**action, "submitted": False, "error": str(exc)}), exc) from exc
    return replace(p, group=group, action={**action, "submitted": True, "sbatch_job": job_id})


def colocated_overrides(cfg: Config, slots: int) -> list[str]:
    """Overrides putting every component of ``cfg`` on slots ``0..slots-1`` (RLinf's ``"actor,rollout: 0-N"``)
    of one node of ``slots`` accelerators: the run's world is those ranks, no idle one."""
    comps = ",".join(c for c in ("actor", "inference", "rollout") if c in cfg.placement.components)
    return [f"cluster.component_placement={{'{comps}': '{_range(list(range(slots)))}'}}",
            "cluster.num_nodes=1", f"cluster.gpus_per_node={slots}"]


def colocated_problem(config: Path, overrides: Sequence[str], cfg: Config, slots: int) -> str | None:
    """Why the run cannot start co-located on ``slots`` slots (its config and its policy's setup check)."""
    from slurm_rl.scheduler.live_state import check_setup

    try:
        check_setup(load_config(config, [*overrides, *colocated_overrides(cfg, slots)]))
    except (ConfigError, ValueError) as exc:
        text = str(exc).replace("\n", "; ")
        return text if len(text) <= 240 else text[:239] + "…"
    return None


def _act_colocated(cluster_dir: Path, p: Placement, config: Path, overrides: Sequence[str], cfg: Config,
                   spec: PlacerSpec, sbatch_args: Sequence[str]) -> Placement:
    run = f"{p.job}-colocated"
    gpus = int(p.figures.get("gpus_needed") or 1)
    run_dir = cluster_dir / run
    extra = [*colocated_overrides(cfg, gpus), f"runtime.run_dir={run_dir}"]
    (cluster_dir / "logs").mkdir(mode=0o700, exist_ok=True)
    args = [*resource_args(gpus, spec.capacity), f"--job-name=slurm-rl-{run}",
            f"--output={cluster_dir / 'logs' / run}-%j.out", *sbatch_args, str(REPO_ROOT / "sbatch" / "train.sh"),
            str(config), *overrides, *extra]
    action = {"group": run, "run_dir": str(run_dir), "gpus": gpus, "pools": {}, "sbatch_args": args}
    try:
        job_id = sbatch(args, cwd=REPO_ROOT, env=_submit_env())
    except SbatchError as exc:
        raise _Failed(replace(p, group=run, action={**action, "submitted": False, "error": str(exc)}), exc) from exc
    return replace(p, group=run, action={**action, "submitted": True, "sbatch_job": job_id})


class _Failed(LaunchError):
    """An action failed after the decision: the placement to log, and the error to raise."""

    def __init__(self, placement: Placement, error: Exception) -> None:
        super().__init__(str(error))
        self.placement, self.error = placement, error


def _log(cluster_dir: Path, p: Placement, config: Path, overrides: Sequence[str], slo: float, total_ms: float) -> None:
    row = {"time": time.time(), **p.to_json(), "config": str(config), "overrides": list(overrides), "slo": slo,
           "total_ms": round(total_ms, 3), "placer": {"host": socket.gethostname(), "pid": os.getpid()}}
    row.pop("dry_run")
    append_bytes(cluster_dir / PLACEMENTS_FILE, (json.dumps(row, default=str) + "\n").encode())


def place(config: str | Path, cluster_dir: str | Path, name: str | None = None, slo: float = DEFAULT_SLO,
          dry_run: bool = False, sbatch_args: Sequence[str] = (), overrides: Sequence[str] = (),
          max_gpus: int | None = None, max_response_length: int | None = None, host_memory_gb: float | None = None,
          lock_timeout_s: float = LOCK_TIMEOUT_S, queued: QueueQuery | None = None,
          capacity: Capacity | None = None, colocated: bool = True) -> Placement:
    """Decide where the job of ``config`` (+ ``overrides``) goes under ``cluster_dir`` and do it
    (see the module docstring); the placement, also logged to ``placements.jsonl``. ``dry_run``:
    decide only (no lock, nothing written). ``ConfigError`` / ``InputError``: bad input, nothing done;
    :class:`SbatchError`: sbatch failed (logged). ``capacity``: instead of ``max_gpus`` or ``sinfo``;
    ``colocated=False``: disaggregated groups only."""
    t0 = time.perf_counter()
    root = Path(cluster_dir).absolute()
    config = Path(config).absolute()
    issues = []
    if slo < 1.0 or not math.isfinite(slo):
        issues.append(ConfigIssue("slo", slo, "a number >= 1 (tolerated slowdown versus running alone)"))
    if max_gpus is not None and max_gpus < 1:
        issues.append(ConfigIssue("max_gpus", max_gpus, "a positive number of GPUs"))
    if max_response_length is not None and max_response_length < 1:
        issues.append(ConfigIssue("max_response_length", max_response_length, "a positive int"))
    if root.exists() and not root.is_dir():
        issues.append(ConfigIssue("cluster", str(root), "a directory (created when absent)"))
    if issues:
        raise ConfigError(issues)
    cfg = load_config(config, list(overrides))  # ConfigError names the key
    model_cfg = cfg if cfg.runtime.device == "emulated" else load_config(config, [*overrides, "runtime.device=emulated"])
    if not dry_run:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (placer_lock(root, lock_timeout_s) if not dry_run else _nothing()):
        groups = read_cluster(root, queued=queued) if root.is_dir() else []
        records = read_placements(root) if root.is_dir() else []
        name = job_name(name, config, _taken(groups, records))
        cap = capacity or cluster_capacity(max_gpus, sbatch_args)
        spec = PlacerSpec(cap, max_response_length=max_response_length, host_memory_gb=host_memory_gb,
                          colocated=colocated, colocated_check=lambda n: colocated_problem(config, overrides, cfg, n))
        p = decide(model_cfg, name, slo, groups, spec)
        if dry_run:
            return replace(p, dry_run=True)
        excluded: list[str] = []
        try:
            while p.kind == "direct":
                try:
                    p = _act_direct(root, p, config, overrides, slo, max_response_length)
                    break
                except (ConfigError, MembershipError) as exc:  # the group refused or ended: the next choice
                    excluded.append(p.group or "")
                    note = f"group {p.group}'s own admission refused: {exc}".replace("\n", "; ")
                    nxt = decide(model_cfg, name, slo, [g for g in groups if g.name not in excluded], spec)
                    p = replace(nxt, fallbacks=(*p.fallbacks, note, *nxt.fallbacks),
                                reason=f"{nxt.reason}; {note}", decision_ms=p.decision_ms + nxt.decision_ms)
            if p.kind == "new":
                p = _act_new(root, p, groups, config, overrides, slo, cfg, spec, sbatch_args)
            elif p.kind == "colocated":
                p = _act_colocated(root, p, config, overrides, cfg, spec, sbatch_args)
        except _Failed as failed:
            _log(root, failed.placement, config, overrides, slo, (time.perf_counter() - t0) * 1e3)
            raise failed.error from None
        _log(root, p, config, overrides, slo, (time.perf_counter() - t0) * 1e3)
        return p


def cluster_capacity(max_gpus: int | None, sbatch_args: Sequence[str] = ()) -> Capacity:
    """``--max-gpus`` where given (nodes' sizes still from sinfo where it answers), else sinfo's."""
    try:
        found = slurm_capacity(sbatch_args)
    except LaunchError as exc:
        if not max_gpus:
            raise InputError(str(exc)) from None
        found = Capacity(None, str(exc))
    if max_gpus:
        return replace(found, total_gpus=max_gpus, source=f"--max-gpus {max_gpus}")
    return found


def _act_direct(root: Path, p: Placement, config: Path, overrides: Sequence[str], slo: float,
                max_response_length: int | None) -> Placement:
    assert p.group is not None
    figures = add_job(root / p.group, p.job, config, overrides, slo=slo, max_response_length=max_response_length)
    return replace(p, action={"group": p.group, "group_dir": str(root / p.group), "joined": True,
                              "record": figures.get("record"), "add_job": figures})


@contextmanager
def _nothing() -> Iterator[None]:
    yield
