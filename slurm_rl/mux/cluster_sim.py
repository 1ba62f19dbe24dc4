"""A whole trace of RL jobs under four provisioning policies, with one set of models.

* ``solo`` — standard disaggregation: every job gets its own rollout pool (H20) and training pool
  (H800) for its lifetime; it runs through :class:`~.group_sim.GroupSim` alone (so the solo
  reference and the groups share one model: cold start, list-scheduled rollout, training).
* ``colocated`` — every job runs rollout and training one after the other on its training GPUs
  (H800). Decode is memory-bound, so a request decodes on an H800 at ``decode_speed`` times its
  H20 speed (default 1.0: 3.35 TB/s HBM against 4.0 TB/s, made up by far more compute for the
  batched part) with ``lane_factor`` times the concurrent requests (default 0.8: 80 GB of HBM
  against 96 GB). Every iteration pays a warm rollout and a warm training switch (engines
  offload and reload; weights reshard), the first a cold start per node.
* ``mux`` — RollMux: each arriving job is placed by :func:`~.admission.place` (direct / scaled /
  new / refused); each group runs in a :class:`~.group_sim.GroupSim` (the live rotation policy);
  a group's nodes are paid from its creation (added rollout nodes: from their addition) until its
  last member finishes.
* ``hybrid`` — mux, but a job that no existing group admits runs co-located (as above) when the
  cost model predicts that cheaper over its life than a group of its own, or when a new group is
  refused (:func:`~.admission.place_hybrid`); co-located jobs are not joinable.

``mux_wc`` / ``hybrid_wc``: the same with the work-conserving rotation (``ClusterSpec.schedule``;
admission predicts with it); ``mux_no_tail``: mux without long-tail migration.

Metrics: cost (GPU-hours x relative price), useful job-hours (the solo duration of every job the
policy ran — the same figure under every policy), cost per useful job-hour and its inverse
(cost efficiency), SLO attainment (jobs whose slowdown vs solo is within their SLO), busy and
bubble shares per GPU type, placement mix and group sizes (mux).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from slurm_rl.mux.admission import KINDS, ClusterSpec, place, place_hybrid
from slurm_rl.mux.group_sim import GroupResult, GroupSim
from slurm_rl.mux.model import (
    GPU_PRICE,
    ColocatedModel,
    POOL_GPU,
    POOLS,
    GroupModel,
    JobProfile,
    Pools,
    slots_cost_per_hour,
    solo_pools,
)

POLICY_NAMES = ("solo", "colocated", "mux", "hybrid")
#: also accepted by :func:`simulate_cluster`: ablations and the work-conserving rotation
EXTRA_POLICIES = ("mux_no_tail", "mux_wc", "hybrid_wc")


@dataclass(frozen=True)
class JobOutcome:
    name: str
    kind: str
    arrival_s: float
    finish_s: float | None
    solo_s: float
    slo: float
    placement: str = ""  # mux: direct | scaled | new | refused
    group: int | None = None

    @property
    def slowdown(self) -> float | None:
        return None if self.finish_s is None else (self.finish_s - self.arrival_s) / self.solo_s

    @property
    def slo_met(self) -> bool:
        s = self.slowdown
        return s is not None and s <= self.slo + 1e-9


@dataclass(frozen=True)
class PolicyResult:
    """One policy over a trace."""

    policy: str
    jobs: Mapping[str, JobOutcome]
    cost: float  # relative: GPU-hours x price
    gpu_hours: Mapping[str, float]  # by GPU type
    busy_gpu_hours: Mapping[str, float]  # computing
    makespan_s: float
    placement_mix: Mapping[str, int] = field(default_factory=dict)
    group_sizes: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    rejected: Mapping[str, int] = field(default_factory=dict)
    refusals: tuple[str, ...] = ()
    groups: tuple[Mapping[str, Any], ...] = ()  # mux: one row per co-execution group
    extra: Mapping[str, Any] = field(default_factory=dict)
    arrivals: tuple[Mapping[str, Any], ...] = ()  # mux: one row per arrival (:func:`arrival_row`)

    @property
    def served(self) -> list[JobOutcome]:
        return [j for j in self.jobs.values() if j.finish_s is not None]

    @property
    def useful_job_hours(self) -> float:
        """Solo hours of the jobs the policy ran (the same work measure under every policy)."""
        return sum(j.solo_s for j in self.served) / 3600

    @property
    def job_hours_per_cost(self) -> float:
        """Cost efficiency: useful job-hours per unit of cost."""
        return self.useful_job_hours / self.cost if self.cost else 0.0

    @property
    def cost_per_job_hour(self) -> float:
        return self.cost / self.useful_job_hours if self.useful_job_hours else 0.0

    @property
    def slo_attainment(self) -> float:
        """Share of the jobs it ran whose slowdown is within their SLO."""
        served = self.served
        return sum(j.slo_met for j in served) / len(served) if served else 0.0

    def busy_fraction(self, gpu: str) -> float:
        h = self.gpu_hours.get(gpu, 0.0)
        return self.busy_gpu_hours.get(gpu, 0.0) / h if h else 0.0

    def summary(self) -> dict[str, Any]:
        """Plain JSON."""
        slows = sorted(j.slowdown for j in self.served if j.slowdown is not None)
        out: dict[str, Any] = {
            "cost": round(self.cost, 1),
            "gpu_hours": {g: round(h, 1) for g, h in self.gpu_hours.items()},
            "useful_job_hours": round(self.useful_job_hours, 2),
            "cost_per_job_hour": round(self.cost_per_job_hour, 3),
            "job_hours_per_cost": round(self.job_hours_per_cost, 6),
            "jobs_run": len(slows), "jobs_refused": len(self.jobs) - len(slows),
            "slo_attainment": round(self.slo_attainment, 4),
            "slowdown": {"mean": round(statistics.mean(slows), 3) if slows else None,
                         "p50": round(slows[len(slows) // 2], 3) if slows else None,
                         "p95": round(slows[int(0.95 * (len(slows) - 1))], 3) if slows else None,
                         "max": round(slows[-1], 3) if slows else None},
            "busy_fraction": {g: round(self.busy_fraction(g), 4) for g in self.gpu_hours},
            "bubble_fraction": {g: round(1 - self.busy_fraction(g), 4) for g in self.gpu_hours},
            "makespan_h": round(self.makespan_s / 3600, 2),
        }
        misses: dict[str, int] = {}
        for j in self.served:
            if not j.slo_met:
                key = f"{j.kind}/{j.placement}" if j.placement else j.kind
                misses[key] = misses.get(key, 0) + 1
        out["slo_misses_by_kind"] = dict(sorted(misses.items()))
        if self.placement_mix:
            out["placement_mix"] = dict(self.placement_mix)
            out["group_sizes"] = {k: {str(n): c for n, c in sorted(v.items())} for k, v in self.group_sizes.items()}
            out["rejected_candidates"] = dict(self.rejected)
            if self.refusals:
                out["refusals"] = list(self.refusals[:10])
        out.update(self.extra)
        return out


# ---------------------------------------------------------------------- helpers
def _pool_hours(res: GroupResult, gpus_per_slot: int) -> tuple[dict[str, float], dict[str, float]]:
    """(GPU-hours provisioned, GPU-hours busy) by GPU type of one simulated group."""
    prov: dict[str, float] = {}
    busy: dict[str, float] = {}
    for pool in POOLS:
        gpu = POOL_GPU[pool]
        st = res.pools[pool]
        prov[gpu] = prov.get(gpu, 0.0) + st.provisioned_slot_s * gpus_per_slot / 3600
        busy[gpu] = busy.get(gpu, 0.0) + st.busy_slot_s * gpus_per_slot / 3600
    return prov, busy


def _cost(gpu_hours: Mapping[str, float]) -> float:
    return sum(h * GPU_PRICE[g] for g, h in gpu_hours.items())


def _add(into: dict[str, float], more: Mapping[str, float]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0.0) + v


def solo_results(jobs: Sequence[JobProfile], cluster: ClusterSpec = ClusterSpec()) -> dict[str, GroupResult]:
    """Every job alone on its own pools (the slowdown reference of every policy)."""
    out = {}
    for job in jobs:
        sim = GroupSim(solo_pools(job, cluster.gpus_per_slot, cluster.host_bytes_per_slot),
                       tail_fraction=1.0, record=False, start_s=0.0)
        sim.add_job(job, 0.0)
        sim.run_until(None)
        res = sim.result(solo_s={job.name: 0.0})
        out[job.name] = res
    return out


def solo_seconds(solo: Mapping[str, GroupResult]) -> dict[str, float]:
    return {name: r.jobs[name].finish_s or 0.0 for name, r in solo.items()}


# ---------------------------------------------------------------------- policies
def run_solo(jobs: Sequence[JobProfile], solo: Mapping[str, GroupResult],
             cluster: ClusterSpec = ClusterSpec()) -> PolicyResult:
    """Standard disaggregation: each job its own pools for its lifetime."""
    secs = solo_seconds(solo)
    hours: dict[str, float] = {}
    busy: dict[str, float] = {}
    outcomes = {}
    for job in jobs:
        p, b = _pool_hours(solo[job.name], cluster.gpus_per_slot)
        _add(hours, p)
        _add(busy, b)
        outcomes[job.name] = JobOutcome(job.name, job.kind, job.arrival_s, job.arrival_s + secs[job.name],
                                        secs[job.name], job.slo)
    end = max((o.finish_s or 0.0) for o in outcomes.values())
    return PolicyResult("solo", outcomes, _cost(hours), hours, busy, end - min(j.arrival_s for j in jobs))


def colocated_seconds(job: JobProfile, model: ColocatedModel = ColocatedModel()) -> tuple[float, float]:
    """(seconds, busy slot-seconds) of ``job`` with rollout and training on its training slots."""
    t = job.switch.cold_s
    busy = 0.0
    for k in range(job.iterations):
        secs, b = model.iteration_s(job, k)
        t += secs
        busy += b
    return t, busy


def run_colocated(jobs: Sequence[JobProfile], solo_s: Mapping[str, float],
                  cluster: ClusterSpec = ClusterSpec(), model: ColocatedModel = ColocatedModel()) -> PolicyResult:
    """Each job on its training GPUs (H800) for both phases."""
    gpu = POOL_GPU["train"]
    hours = {gpu: 0.0}
    busy = {gpu: 0.0}
    outcomes = {}
    for job in jobs:
        secs, busy_slot_s = colocated_seconds(job, model)
        hours[gpu] += secs * job.train_slots * cluster.gpus_per_slot / 3600
        busy[gpu] += busy_slot_s * cluster.gpus_per_slot / 3600
        outcomes[job.name] = JobOutcome(job.name, job.kind, job.arrival_s, job.arrival_s + secs,
                                        solo_s[job.name], job.slo)
    end = max((o.finish_s or 0.0) for o in outcomes.values())
    return PolicyResult("colocated", outcomes, _cost(hours), hours, busy, end - min(j.arrival_s for j in jobs),
                        extra={"colocated_model": {"decode_speed": model.decode_speed,
                                                   "lane_factor": model.lane_factor}})


def run_gavel_plus(jobs: Sequence[JobProfile], solo: PolicyResult, colocated: PolicyResult,
                   cluster: ClusterSpec = ClusterSpec(), model: ColocatedModel = ColocatedModel()) -> PolicyResult:
    """Gavel+ as read here: heterogeneity-aware placement without phase-level sharing. Each job
    gets GPUs of its own, of the type mix predicted cheapest over its life among those that keep its
    SLO: disaggregated (H20 rollout + H800 training, as ``solo``) or co-located on H800
    (:func:`~.admission.predict_colocated`, expected times); its outcome is that policy's run."""
    from slurm_rl.mux.admission import predict_colocated

    hours: dict[str, float] = {}
    busy: dict[str, float] = {}
    outcomes: dict[str, JobOutcome] = {}
    mix = {"disaggregated": 0, "colocated": 0}
    for job in jobs:
        c = predict_colocated(job, cluster, model)
        solo_cost = slots_cost_per_hour(job.rollout_slots, job.train_slots, cluster.gpus_per_slot) * (
            job.switch.cold_s + job.iterations * job.solo_iteration_s()) / 3600
        kind = "colocated" if not c.problems and c.cost < solo_cost else "disaggregated"
        mix[kind] += 1
        src = colocated if kind == "colocated" else solo
        o = src.jobs[job.name]
        outcomes[job.name] = replace(o, placement=kind)
        # this job's share of the source policy's hours: its own pools for its run time
        secs = (o.finish_s or o.arrival_s) - o.arrival_s
        if kind == "colocated":
            _add(hours, {POOL_GPU["train"]: secs * job.train_slots * cluster.gpus_per_slot / 3600})
        else:
            _add(hours, {POOL_GPU["rollout"]: secs * job.rollout_slots * cluster.gpus_per_slot / 3600,
                         POOL_GPU["train"]: secs * job.train_slots * cluster.gpus_per_slot / 3600})
    end = max((o.finish_s or 0.0) for o in outcomes.values())
    return PolicyResult("gavel_plus", outcomes, _cost(hours), hours, busy, end - min(j.arrival_s for j in jobs),
                        extra={"gavel_plus_mix": mix})


@dataclass
class _Group:
    gid: int
    sim: GroupSim
    created_s: float
    members: list[str] = field(default_factory=list)
    peak: int = 0


def run_mux(jobs: Sequence[JobProfile], solo_s: Mapping[str, float], cluster: ClusterSpec = ClusterSpec(),
            tail_fraction: float = 0.8, tail_slots: int = 1, record: bool = False,
            hybrid: ColocatedModel | None = None, name: str | None = None,
            run_schedule: str | None = None) -> PolicyResult:
    """RollMux: admission into co-execution groups, each run by the rotation policy under
    ``cluster.schedule``. With ``hybrid`` (the co-located model), placement is
    :func:`~.admission.place_hybrid`: a job no group admits runs co-located on its training GPUs
    when that is predicted cheaper than a group of its own (or no group can take it).
    ``run_schedule`` (default ``cluster.schedule``): the schedule the groups actually run, for the
    ablation of admitting with one schedule's predictions and running another."""
    policy = name or ("hybrid" if hybrid is not None else "mux")
    by_name = {j.name: j for j in jobs}
    colocated: dict[str, tuple[float, float]] = {}  # co-located job -> (seconds, busy slot-seconds)
    live: dict[int, _Group] = {}
    closed: list[tuple[_Group, GroupResult]] = []
    decisions: dict[str, Any] = {}
    rejected: dict[str, int] = {}
    refusals: list[str] = []
    arrivals: list[dict[str, Any]] = []
    next_gid = 0

    def close_idle(t: float | None) -> None:
        for gid in list(live):
            g = live[gid]
            g.sim.run_until(t)
            if not g.sim.active:
                closed.append((g, g.sim.result(solo_s=solo_s)))
                del live[gid]

    for job in sorted(jobs, key=lambda j: (j.arrival_s, j.name)):
        t = job.arrival_s
        close_idle(t)
        specs = []
        for g in live.values():
            active = [by_name[n] for n in g.sim.active]
            specs.append(GroupModel(pools=g.sim.pools, members=tuple(active), gid=g.gid,
                                   train_assign={n: g.sim.jobs[n].train_slots for n in g.sim.active},
                                   rollout_assign={n: g.sim.jobs[n].rollout_slots for n in g.sim.active}
                                   if cluster.pin_rollout else {},
                                   remaining={n: by_name[n].iterations - g.sim.jobs[n].it for n in g.sim.active},
                                   schedule=cluster.schedule, pin_rollout=cluster.pin_rollout))
        p = place_hybrid(job, specs, cluster, hybrid) if hybrid is not None else place(job, specs, cluster)
        for k, v in p.rejected.items():
            rejected[k] = rejected.get(k, 0) + v
        decisions[job.name] = p
        arrivals.append(arrival_row(job, t, p, len(specs)))
        if p.kind == "refused":
            refusals.append(f"{job.name}: {p.reason}")
            continue
        if p.kind == "colocated":
            colocated[job.name] = colocated_seconds(job, hybrid or ColocatedModel())
            continue
        if p.kind == "new":
            pools = Pools(tuple(range(job.rollout_slots)), tuple(range(job.train_slots)),
                          cluster.gpus_per_slot, cluster.host_bytes_per_slot)
            g = _Group(next_gid, GroupSim(pools, tail_fraction, tail_slots, record=record, start_s=t,
                                          schedule=run_schedule or cluster.schedule,
                                          pin_rollout=cluster.pin_rollout), t)
            live[g.gid] = g
            next_gid += 1
            decisions[job.name] = p = replace(p, group=g.gid)
        else:
            assert p.group is not None
            g = live[p.group]
            if p.added_rollout_slots:
                top = max(g.sim.pools.rollout)
                g.sim.add_slots("rollout", tuple(range(top + 1, top + 1 + p.added_rollout_slots)), t)
        g.sim.add_job(job, t, rollout=p.rollout_slots or None, train=p.train_slots)
        g.members.append(job.name)
        g.peak = max(g.peak, len(g.sim.active))
    close_idle(None)

    hours: dict[str, float] = {}
    busy: dict[str, float] = {}
    outcomes: dict[str, JobOutcome] = {}
    lifetime: dict[int, int] = {}
    peak: dict[int, int] = {}
    group_rows = []
    for g, res in closed:
        p_h, b_h = _pool_hours(res, cluster.gpus_per_slot)
        _add(hours, p_h)
        _add(busy, b_h)
        lifetime[len(g.members)] = lifetime.get(len(g.members), 0) + 1
        peak[g.peak] = peak.get(g.peak, 0) + 1
        for name in g.members:
            r = res.jobs[name]
            outcomes[name] = JobOutcome(name, by_name[name].kind, by_name[name].arrival_s, r.finish_s,
                                        solo_s[name], by_name[name].slo, decisions[name].kind, g.gid)
        group_rows.append({"gid": g.gid, "members": len(g.members), "peak": g.peak,
                           "rollout_slots": res.pools["rollout"].slots, "train_slots": res.pools["train"].slots,
                           "hours": round(res.makespan_s / 3600, 3),
                           "cost": round(_cost(p_h), 1),
                           "rollout_busy": round(res.pools["rollout"].busy_fraction, 3),
                           "train_busy": round(res.pools["train"].busy_fraction, 3),
                           "cost_by_members": _cost_by_members(g, res, outcomes, _cost(p_h))})
    for name, p in decisions.items():
        if p.kind == "refused":
            j = by_name[name]
            outcomes[name] = JobOutcome(name, j.kind, j.arrival_s, None, solo_s[name], j.slo, "refused")
    gpu = POOL_GPU["train"]
    coloc_hours = {gpu: 0.0}
    coloc_busy = {gpu: 0.0}
    for name, (secs, busy_slot_s) in colocated.items():
        j = by_name[name]
        coloc_hours[gpu] += secs * j.train_slots * cluster.gpus_per_slot / 3600
        coloc_busy[gpu] += busy_slot_s * cluster.gpus_per_slot / 3600
        outcomes[name] = JobOutcome(name, j.kind, j.arrival_s, j.arrival_s + secs, solo_s[name], j.slo, "colocated")
    _add(hours, coloc_hours)
    _add(busy, coloc_busy)
    mix = {k: sum(1 for p in decisions.values() if p.kind == k) for k in KINDS
           if k != "colocated" or hybrid is not None}
    finishes = [o.finish_s for o in outcomes.values() if o.finish_s is not None]
    makespan = max(finishes, default=0.0) - min(j.arrival_s for j in jobs)
    migrated = sum(r.jobs[n].migrated_responses for g, r in closed for n in g.members)
    share: dict[int, float] = {}
    for row in group_rows:
        for k, c in row["cost_by_members"].items():
            share[k] = share.get(k, 0.0) + c
    lone = share.get(1, 0.0)
    shared = sum(v for k, v in share.items() if k >= 2)
    coloc_cost = _cost(coloc_hours)
    total = sum(share.values()) or 1.0
    everything = lone + shared + coloc_cost or 1.0
    hybrid_extra: dict[str, Any] = {}
    if hybrid is not None:
        hybrid_extra = {"colocated_jobs": len(colocated),
                        "cost_share": {"lone_groups": round(lone / everything, 4),
                                       "shared_groups": round(shared / everything, 4),
                                       "colocated_jobs": round(coloc_cost / everything, 4)},
                        "colocated_busy_fraction": round(coloc_busy[gpu] / coloc_hours[gpu], 4)
                        if coloc_hours[gpu] else 0.0,
                        "colocated_model": {"decode_speed": hybrid.decode_speed, "lane_factor": hybrid.lane_factor}}
    return PolicyResult(policy, outcomes, _cost(hours), hours, busy, makespan, mix,
                        {"members_over_lifetime": lifetime, "peak_concurrent_members": peak},
                        rejected, tuple(refusals), tuple(group_rows),
                        extra={"groups": len(closed), "migrated_responses": migrated,
                               "rollout_lane_fraction": round(
                                   sum(r.pools["rollout"].lane_busy_s for _, r in closed) /
                                   max(1e-9, sum(r.pools["rollout"].lane_active_s for _, r in closed)), 4),
                               "cost_share_by_concurrent_jobs": {str(k): round(v / total, 4)
                                                                 for k, v in sorted(share.items())},
                               "tail_fraction": tail_fraction, "tail_slots": tail_slots,
                               "slo_check": cluster.slo_check, "cost_basis": cluster.cost_basis,
                               "schedule": cluster.schedule, **hybrid_extra},
                        arrivals=tuple(arrivals))


#: Binding constraints from the weakest (relaxing it would have admitted the job somewhere) to the strongest.
BINDING_ORDER = ("cost", "rollout_pool", "slo_cycle/expected", "saturation/expected", "slo_cycle/conservative",
                 "saturation/conservative", "residency", "train_pool")


def binding_constraint(p: Any) -> str:
    """What kept an arrival out of the existing groups (``-``: it joined one as it is): for a
    ``scaled`` decision the chosen group's verdict as it was; for ``new`` / ``colocated`` /
    ``refused`` ``cost`` when some group admitted it but another option cost less, ``no group``
    when none was running, else the weakest verdict among the groups (:data:`BINDING_ORDER`): the
    constraint that, relaxed, would have let it into an existing group."""
    if p.kind == "direct":
        return "-"
    if p.kind == "scaled":
        row = next((v for v in p.verdicts if v.get("group") == p.group), {})
        return str(row.get("direct", "?"))
    if not p.verdicts:
        return "no group"
    found = {"cost" if v["verdict"] in ("direct", "scaled") else str(v["verdict"]) for v in p.verdicts}
    return next(b for b in BINDING_ORDER if b in found)


def arrival_row(job: JobProfile, t: float, p: Any, groups: int) -> dict[str, Any]:
    """One arrival: the job, the decision, the groups it saw and each verdict's count, the binding constraint."""
    counts: dict[str, int] = {}
    for v in p.verdicts:
        counts[str(v["verdict"])] = counts.get(str(v["verdict"]), 0) + 1
    return {"job": job.name, "t_h": round(t / 3600, 2), "kind": job.kind, "model_b": job.model_b,
            "slots": f"{job.rollout_slots}+{job.train_slots}", "slo": job.slo, "decision": p.kind,
            "added": p.added_rollout_slots, "groups": groups, "verdicts": counts, "binding": binding_constraint(p)}


def _cost_by_members(g: _Group, res: GroupResult, outcomes: Mapping[str, JobOutcome], cost: float) -> dict[int, float]:
    """The group's cost split by how many of its jobs were admitted and unfinished at the time
    (pro rata of time: the pools' final sizes)."""
    edges = sorted([(outcomes[n].arrival_s, 1) for n in g.members] +
                   [(outcomes[n].finish_s or res.end_s, -1) for n in g.members])
    span = max(1e-9, res.end_s - res.start_s)
    out: dict[int, float] = {}
    n, last = 0, res.start_s
    for t, d in edges:
        if n and t > last:
            out[n] = out.get(n, 0.0) + cost * (t - last) / span
        n, last = n + d, max(last, t)
    return out


def simulate_cluster(jobs: Sequence[JobProfile], policies: Sequence[str] = POLICY_NAMES,
                     cluster: ClusterSpec = ClusterSpec(), tail_fraction: float = 0.8, tail_slots: int = 1,
                     colocated: ColocatedModel = ColocatedModel()) -> dict[str, PolicyResult]:
    """Every policy in ``policies`` on the same trace (``mux_no_tail``: mux without migration)."""
    solo = solo_results(jobs, cluster)
    secs = solo_seconds(solo)
    out: dict[str, PolicyResult] = {}
    for name in policies:
        if name == "solo":
            out[name] = run_solo(jobs, solo, cluster)
        elif name == "colocated":
            out[name] = run_colocated(jobs, secs, cluster, colocated)
        elif name == "mux":
            out[name] = run_mux(jobs, secs, cluster, tail_fraction, tail_slots)
        elif name == "mux_no_tail":
            out[name] = run_mux(jobs, secs, cluster, 1.0, tail_slots, name=name)
        elif name == "hybrid":
            out[name] = run_mux(jobs, secs, cluster, tail_fraction, tail_slots, hybrid=colocated)
        elif name in ("mux_wc", "hybrid_wc"):
            wc = replace(cluster, schedule="work_conserving")
            out[name] = run_mux(jobs, secs, wc, tail_fraction, tail_slots,
                                hybrid=colocated if name == "hybrid_wc" else None, name=name)
        else:
            raise ValueError(f"policy: got {name!r}, allowed {POLICY_NAMES + EXTRA_POLICIES}")
    return out


def efficiency_ratio(a: PolicyResult, b: PolicyResult) -> float:
    """How many times more useful job-hours per cost ``a`` delivers than ``b``."""
    return a.job_hours_per_cost / b.job_hours_per_cost if b.job_hours_per_cost else 0.0
