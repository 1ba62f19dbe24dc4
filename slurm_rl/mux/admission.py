"""Conservative inter-group placement and admission control (pure, no I/O).

A new job goes, in order of preference, into an existing group as it is (``direct``: no added
GPUs), into an existing group with added rollout slots (``scaled``: the H20 slots' price), or into
a new group of its own solo size (``new``) — the candidate with the least added cost (per hour by
default; ``ClusterSpec.cost_basis="lifetime"``: over the group's expected remaining life;
``"delta"``: per hour, then over the group's life — RollMux's direct packing at Delta = 0) whose
members *all* keep their SLO and whose parked states fit in host memory. The SLO check simulates
the round-robin meta-iteration (:func:`analysis.meta_iteration`) with conservative phase times
(every response at its job's max length); ``ClusterSpec.slo_check="both"`` also requires it with
the expected phase times. The newcomer joins last in the round-robin order, so its estimate also
pays one meta-iteration of waiting for its first turn. A job that no candidate can run within its
SLO or its host memory is ``refused`` with the reason — never admitted to be slowed silently.

Ties on cost go to the preferred kind, then to the candidate whose pools would be busiest
(cost-weighted: the tightest packing), then to the lowest group id.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from slurm_rl.mux.analysis import (SLO_EPS, group_meta, parked_bytes, residency_problems, saturated)
from slurm_rl.mux.model import (GPU_PRICE, POOL_GPU, ColocatedModel, GroupModel, JobProfile, Pools,
                                          slots_cost_per_hour)
from slurm_rl.mux.rotation import SCHEDULES

KINDS = ("direct", "scaled", "new", "colocated", "refused")
SLO_CHECKS = ("conservative", "both")
COST_BASES = ("rate", "lifetime", "delta")


@dataclass(frozen=True)
class ClusterSpec:
    """What placement may use."""

    gpus_per_slot: int = 8
    host_bytes_per_slot: float = 1.0e12
    max_added_rollout_slots: int = 4  # per placement into an existing group
    # ``conservative``: the SLO check with max-length phase times (RollMux); ``both``: it must
    # also hold with the expected (profiled) phase times — max-length times are pessimistic for
    # each phase but not for *ratios*: a job whose responses are far below its max length has a
    # much shorter solo time than its max-length profile says, while the partners' phases delay
    # it by their actual length.
    slo_check: str = "conservative"
    # ``rate``: least added price per hour (RollMux: joining a group as it is adds nothing);
    # ``lifetime``: least added cost until the group's last member is expected to finish (joining
    # a group may keep its nodes longer; a small job in a large group's leftover is not free);
    # ``delta``: RollMux's order — least added price per hour (a group joined as it is adds
    # nothing: Delta = 0, so any admissible direct placement beats scaling and a new group), ties
    # broken by the added cost over the group's expected life (the group it prolongs least).
    cost_basis: str = "rate"
    # rotation schedule of the groups placement opens (``round_robin`` | ``work_conserving``);
    # an existing group is predicted under its own ``GroupModel.schedule``
    schedule: str = "round_robin"
    # RollMux's pinning (round-robin groups): each member rolls out on rollout slots of its own
    # choosing (``GroupModel.rollout_assign``) and members on disjoint slots roll out at once.
    # A newcomer goes ``direct`` onto the least loaded existing rollout slots, ``scaled`` onto
    # rollout slots added for it (its own solo count), or ``new``. False: every member on every
    # rollout slot, one rollout at a time, ``scaled`` adds slots to that shared pool.
    pin_rollout: bool = False

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: got {self.schedule!r}, allowed {SCHEDULES}")
        if self.pin_rollout and self.schedule != "round_robin":
            raise ValueError(f"pin_rollout: only with schedule round_robin, got {self.schedule!r}")
        if self.slo_check not in SLO_CHECKS:
            raise ValueError(f"slo_check: got {self.slo_check!r}, allowed {SLO_CHECKS}")
        if self.cost_basis not in COST_BASES:
            raise ValueError(f"cost_basis: got {self.cost_basis!r}, allowed {COST_BASES}")


@dataclass(frozen=True)
class AdmissionDecision:
    """A placement decision.

    ``group``: the existing group's ``gid`` (``direct``/``scaled``), else None. ``train_slots``:
    the train slots the job sits on (ids in that group; for ``new``: ``0..n-1``).
    ``slowdowns``: the conservative estimate for every member of the resulting group.
    ``rejected``: candidates turned down, by cause (``slo``, ``residency``, ``train_pool``).
    ``options``: per kind considered (``direct``, ``scaled``, ``new``, ``colocated``), the
    cheapest admissible candidate's figures: ``cost_per_h`` (added price per hour), ``cost``
    (added cost over its expected life), ``slowdown`` (the job's, conservative), ``group``.
    ``verdicts``: per existing group, what admission found (:data:`VERDICTS`) and why.
    """

    kind: str
    group: int | None = None
    added_rollout_slots: int = 0
    train_slots: tuple[int, ...] = ()
    delta_cost_per_h: float = 0.0  # added price per hour
    delta_cost: float = 0.0  # added cost over the group's expected remaining life
    slowdowns: Mapping[str, float] = field(default_factory=dict)
    reason: str = ""
    rejected: Mapping[str, int] = field(default_factory=dict)
    options: Mapping[str, Mapping[str, float | int | None]] = field(default_factory=dict)
    verdicts: tuple[Mapping[str, object], ...] = ()
    rollout_slots: tuple[int, ...] = ()  # pinned (``ClusterSpec.pin_rollout``): the rollout slots it sits on


#: What admission found for one existing group: admissible as it is (``direct``) or with added
#: rollout slots (``scaled``); else the constraint that bound: its training pool is smaller than
#: the job's layout (``train_pool``), parked states beyond a node's host memory (``residency``), a
#: member's slowdown beyond its SLO while the group with the job is saturated (``saturation``: the
#: busiest pool's work per meta-iteration exceeds the longest member's solo iteration) or not
#: (``slo_cycle``: the longest member's cycle stretches a shorter one). ``/conservative`` or
#: ``/expected``: which phase times broke it. ``rollout_pool`` (pinned groups): fewer rollout slots
#: than the job's own, though every SLO would hold.
VERDICTS = ("direct", "scaled", "train_pool", "rollout_pool", "residency", "saturation", "slo_cycle")


def _slo_verdict(cand: GroupModel, bad: Sequence[str]) -> str:
    how = "expected" if bad and bad[0].endswith("(expected times)") else "conservative"
    sat = saturated(cand, conservative=how == "conservative")
    return f"{'saturation' if sat else 'slo_cycle'}/{how}"


def _fits_train(group: GroupModel, job: JobProfile) -> tuple[int, ...]:
    """The job's train slots in ``group``: the least loaded (parked bytes), then lowest ids."""
    load = parked_bytes(group)
    order = sorted(group.pools.train, key=lambda s: (load[("train", s)], s))
    return tuple(sorted(order[:job.train_slots]))


def _slowdowns(group: GroupModel, newcomer: JobProfile, conservative: bool) -> dict[str, float]:
    """Every member's slowdown over one meta-iteration; the newcomer's also pays one meta-iteration
    of waiting for its first turn (it joins last in the order), spread over its iterations."""
    m = group_meta(group, conservative)
    out = dict(m.slowdown)
    if len(group.members) > 1:
        out[newcomer.name] *= (newcomer.iterations + 1) / newcomer.iterations
    return out


def check_slo(group: GroupModel, newcomer: JobProfile, how: str) -> tuple[dict[str, float], list[str]]:
    """(conservative slowdowns, problems: SLO violations) of ``group`` with ``newcomer`` in it."""
    slos = {j.name: j.slo for j in group.members}
    slow = _slowdowns(group, newcomer, conservative=True)
    bad = [f"{name} {s:.2f}x > SLO {slos[name]:.2f}x (max-length times)"
           for name, s in slow.items() if s > slos[name] + SLO_EPS]
    if how == "both" and not bad:
        expected = _slowdowns(group, newcomer, conservative=False)
        bad = [f"{name} {s:.2f}x > SLO {slos[name]:.2f}x (expected times)"
               for name, s in expected.items() if s > slos[name] + SLO_EPS]
    return slow, bad


def _packing(group: GroupModel) -> float:
    """Cost-weighted busy share of the group's pools over one conservative meta-iteration."""
    m = group_meta(group, conservative=True)
    pr = len(group.pools.rollout) * GPU_PRICE[POOL_GPU["rollout"]]
    pt = len(group.pools.train) * GPU_PRICE[POOL_GPU["train"]]
    return (m.rollout_busy * pr + m.train_busy * pt) / (pr + pt) if pr + pt else 0.0


def _pinned_rollout(group: GroupModel, job: JobProfile) -> tuple[int, ...]:
    """The ``job.rollout_slots`` least loaded rollout slots of ``group`` (conservative rollout seconds
    of the members sitting on each per meta-iteration), then lowest ids."""
    load = {s: 0.0 for s in group.pools.rollout}
    for m in group.members:
        slots = group.rollout_of(m)
        for s in slots:
            load[s] += m.conservative_rollout_s(len(slots))
    return tuple(sorted(sorted(load, key=lambda s: (load[s], s))[:job.rollout_slots]))


def _with_rollout_slots(group: GroupModel, k: int) -> GroupModel:
    top = max(group.pools.rollout, default=-1)
    pools = replace(group.pools, rollout=group.pools.rollout + tuple(range(top + 1, top + 1 + k)))
    return replace(group, pools=pools)


def _rate(group: GroupModel) -> float:
    return slots_cost_per_hour(len(group.pools.rollout), len(group.pools.train), group.pools.gpus_per_slot)


def _life_cost(group: GroupModel, extra_s: float = 0.0) -> float:
    """Expected cost of keeping ``group`` until its last member's remaining iterations are done
    (expected phase times; ``extra_s`` added, e.g. a newcomer's state loading)."""
    if not group.members:
        return 0.0
    m = group_meta(group, conservative=False)
    life = max(group.remaining.get(j.name, j.iterations) * m.period_of(j.name) for j in group.members)
    return _rate(group) * (life + extra_s) / 3600


def place(job: JobProfile, groups: Sequence[GroupModel], cluster: ClusterSpec = ClusterSpec()) -> AdmissionDecision:
    """Where ``job`` goes (see the module docstring); ``groups`` are the live groups with their
    current members (each member's rollout sits on every rollout slot)."""
    rejected: dict[str, int] = {}
    notes: list[str] = []
    candidates: list[tuple[tuple[float, ...], int, float, int, AdmissionDecision]] = []
    options: dict[str, dict] = {}
    verdicts: list[dict[str, object]] = []

    def add(kind: str, order: int, g: GroupModel, cand: GroupModel, k: int, slow: Mapping[str, float]) -> None:
        rate = _rate(cand) - (_rate(g) if g.members or kind != "new" else 0.0)
        life = _life_cost(cand, job.switch.cold_s) - (_life_cost(g) if kind != "new" else 0.0)
        key = {"lifetime": (life,), "rate": (rate,), "delta": (rate, life)}[cluster.cost_basis]
        gid = g.gid if kind != "new" else None
        candidates.append((key, order, -_packing(cand), g.gid,
                           AdmissionDecision(kind, gid, k, cand.train_of(job), rate, life, slow,
                                             rollout_slots=cand.rollout_of(job) if cluster.pin_rollout else ())))
        best = options.get(kind)
        if best is None or key < best["_key"]:
            options[kind] = {"_key": key, "cost_per_h": round(rate, 3), "cost": round(life, 3),
                             "slowdown": round(slow[job.name], 4), "group": gid}

    for g in groups:
        row: dict[str, object] = {"group": g.gid, "members": len(g.members)}
        verdicts.append(row)
        if len(g.pools.train) < job.train_slots:
            rejected["train_pool"] = rejected.get("train_pool", 0) + 1
            row.update(verdict="train_pool", why=f"{len(g.pools.train)} train slots < {job.train_slots}")
            continue
        pin = cluster.pin_rollout and len(g.pools.rollout) >= job.rollout_slots
        if cluster.pin_rollout:
            g = replace(g, pin_rollout=True)
        cand = g.with_member(job, train=_fits_train(g, job), rollout=_pinned_rollout(g, job) if pin else None)
        problems = residency_problems(cand)
        if problems:
            rejected["residency"] = rejected.get("residency", 0) + 1
            notes.append(f"group {g.gid}: residency: {problems[0]}")
            row.update(verdict="residency", why=problems[0])
            continue
        slow, bad = check_slo(cand, job, cluster.slo_check)
        if not bad and (pin or not cluster.pin_rollout):
            add("direct", 0, g, cand, 0, slow)
            row.update(verdict="direct", slowdown=round(slow[job.name], 3))
            continue
        row.update(verdict=_slo_verdict(cand, bad) if bad else "rollout_pool",
                   why=bad[0] if bad else f"{len(g.pools.rollout)} rollout slots < {job.rollout_slots}")
        ks = range(1, cluster.max_added_rollout_slots + 1)
        if cluster.pin_rollout:  # its own rollout slots, added to the group
            ks = range(job.rollout_slots, job.rollout_slots + 1) if job.rollout_slots <= cluster.max_added_rollout_slots \
                else range(0)
        for k in ks:
            scaled = _with_rollout_slots(cand, k)
            if cluster.pin_rollout:
                top = max(g.pools.rollout, default=-1)
                scaled = _with_rollout_slots(g, k).with_member(
                    job, train=cand.train_of(job), rollout=tuple(range(top + 1, top + 1 + k)))
            slow_k, bad_k = check_slo(scaled, job, cluster.slo_check)
            if not bad_k:
                add("scaled", 1, g, scaled, k, slow_k)
                row.update(verdict="scaled", added=k, direct=row["verdict"])
                break
        else:
            rejected["slo"] = rejected.get("slo", 0) + 1
            notes.append(f"group {g.gid}: SLO: {bad[0]}")
    empty = GroupModel(pools=Pools(tuple(range(job.rollout_slots)), tuple(range(job.train_slots)),
                                  cluster.gpus_per_slot, cluster.host_bytes_per_slot), gid=-1,
                      schedule=cluster.schedule, pin_rollout=cluster.pin_rollout)
    own = empty.with_member(job, rollout=tuple(range(job.rollout_slots)) if cluster.pin_rollout else None)
    problems = residency_problems(own)
    slow, bad = check_slo(own, job, cluster.slo_check)
    if problems:
        reason = f"residency: even alone {problems[0]}"
    elif bad:
        reason = f"SLO: even alone {bad[0]}"
    else:
        add("new", 2, empty, own, 0, slow)
        reason = ""
    opts = {k: {f: v for f, v in o.items() if f != "_key"} for k, o in options.items()}
    if not candidates:
        return AdmissionDecision("refused", reason=reason or "; ".join(notes), rejected=rejected, options=opts,
                                 verdicts=tuple(verdicts))
    best = min(candidates, key=lambda c: c[:4])[4]
    why = (f"least added cost ({best.delta_cost_per_h:.1f}/h, {best.delta_cost:.1f} over the group's "
           f"expected life) of {len(candidates)} candidates")
    return replace(best, reason=why, rejected=rejected, options=opts, verdicts=tuple(verdicts))


@dataclass(frozen=True)
class ColocatedPrediction:
    """``job`` co-located on its own training slots (H800), predicted by the cost model."""

    seconds: float  # expected run time, cold start included
    cost_per_h: float
    cost: float  # over the expected run time
    slowdown: float  # conservative (max-length phase times), vs its solo run
    slowdown_expected: float
    problems: tuple[str, ...]  # SLO violations under the cluster's check (empty: admissible)


def predict_colocated(job: JobProfile, cluster: ClusterSpec = ClusterSpec(),
                      model: ColocatedModel = ColocatedModel()) -> ColocatedPrediction:
    """Cost and slowdowns of ``job`` co-located (:class:`~.model.ColocatedModel`): each iteration's
    rollout on the training slots at the H800 decode speed and lanes, then its training, plus
    both warm switches; slowdowns against its solo iteration (max-length and expected phase times),
    the cold start counted on both sides; the SLO check is on expected times (see below)."""
    cold = job.switch.cold_s
    expected = cold + job.iterations * model.expected_iteration_s(job)
    solo_expected = cold + job.iterations * job.solo_iteration_s()
    worst = cold + job.iterations * model.conservative_iteration_s(job)
    solo_worst = cold + job.iterations * job.solo_iteration_s(conservative=True)
    slow, slow_e = worst / solo_worst, expected / solo_expected
    # Alone on its GPUs a job has no partner whose phase lengths could stretch its own: its
    # co-located and solo times both scale with its own responses, so the check is on expected
    # times. (Max-length profiles inflate rollout and training unevenly, and the rollout runs at
    # another speed co-located: their ratio overstated co-located slowdowns and sent jobs that
    # keep their SLO co-located to groups of their own: 0.976x co-located in tools/bench_mux.py
    # against 0.997x, both at 100 % SLO attainment.) ``slowdown`` still reports the max-length figure.
    problems = []
    if slow_e > job.slo + SLO_EPS:
        problems.append(f"{job.name} {slow_e:.2f}x > SLO {job.slo:.2f}x co-located (expected times)")
    rate = job.train_slots * cluster.gpus_per_slot * GPU_PRICE[POOL_GPU["train"]]
    return ColocatedPrediction(expected, rate, rate * expected / 3600, slow, slow_e, tuple(problems))


def place_hybrid(job: JobProfile, groups: Sequence[GroupModel], cluster: ClusterSpec = ClusterSpec(),
                 colocated: ColocatedModel = ColocatedModel()) -> AdmissionDecision:
    """Hybrid placement: :func:`place`, and where no existing group admits the job (the decision
    would be ``new`` or ``refused``), ``colocated`` — actor and rollout one after the other on its
    own training GPUs — when the cost model predicts that cheaper over the job's life than a new
    disaggregated group of its own, or when a new group is refused, provided its co-located
    slowdown keeps its SLO (expected times: :func:`predict_colocated`). A job neither can run
    within its SLO stays ``refused``.

    Costs are compared over the job's expected life whatever ``cluster.cost_basis`` says: the two
    options differ in duration as well as in price per hour (a co-located job holds fewer,
    pricier GPUs for longer), so a price per hour alone would always pick co-location.

    A joinable lone group versus a co-located job: a new group of one job is joinable by later
    arrivals (``direct`` at no added price is where multiplexing gains), a co-located job is not —
    it keeps its training GPUs busy for both phases (the model's busy share is ~90 % against
    ~35-60 % for a lone group's pools), so a partner could only run in its switch gaps and would
    slow it by nearly its own phase time. The decision here is made on the predicted cost of the
    job itself, without betting on partners that have not arrived: a lone group is opened when it
    is cheaper as it is (or co-location breaks the SLO); it then stays joinable like any group.

    ``options`` of the result carries each option's predicted cost per hour, cost over its life
    and the job's slowdown (``colocated`` included), so a caller can show why.
    """
    d = place(job, groups, cluster)
    if d.kind in ("direct", "scaled"):
        return d
    c = predict_colocated(job, cluster, colocated)
    opts = {**d.options, "colocated": {"cost_per_h": round(c.cost_per_h, 3), "cost": round(c.cost, 3),
                                       "slowdown": round(c.slowdown, 4),
                                       "slowdown_expected": round(c.slowdown_expected, 4), "group": None,
                                       "admissible": not c.problems}}
    if c.problems:
        why = f"co-located: {c.problems[0]}"
        return replace(d, options=opts, reason=f"{d.reason}; {why}" if d.reason else why)
    if d.kind == "refused" or c.cost < d.delta_cost:
        why = (f"co-located: {c.cost:.1f} over its expected life ({c.cost_per_h:.1f}/h for "
               f"{c.seconds / 3600:.2f} h)" + (f" < a new group's {d.delta_cost:.1f}" if d.kind == "new" else
                                               f"; no group admits it ({d.reason})"))
        return AdmissionDecision("colocated", None, 0, tuple(range(job.train_slots)), c.cost_per_h, c.cost,
                                 {job.name: c.slowdown}, why, d.rejected, opts, d.verdicts)
    why = f"{d.reason}; a new group ({d.delta_cost:.1f}) is cheaper than co-located ({c.cost:.1f})"
    return replace(d, options=opts, reason=why)
