"""Closed-form and one-meta-iteration analysis of a co-execution group (pure, no I/O).

With phase times ``R_j`` (rollout on the group's rollout slots) and ``T_j`` (training):
``T_solo(j) = R_j + T_j``, ``cycle = max_j T_solo(j)``, ``load = max(sum_j R_j, sum_j T_j)`` (the
busiest pool's work per meta-iteration). A group is *saturated* when ``load >= cycle``: a pool then
works back to back and the meta-iteration lasts about ``load``; below that it lasts about
``cycle`` and round-robin keeps both pools as busy as the members allow (RollMux, Theorem 1).

:func:`meta_iteration` simulates the group's schedule phase by phase (every phase pays the pool's
warm switch when the group has several members) until it repeats, and gives each member's
slowdown: its iteration period over its ``T_solo`` on its own pools. Under strict round-robin every
member's period is the meta-iteration; under ``work_conserving`` (a free pool serves the next
*ready* member, see :mod:`slurm_rl.mux.rotation`) a short-cycle member may run several
iterations per iteration of a long-cycle partner, and each member has its own period.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping

from slurm_rl.mux.model import GroupModel

#: Slowdowns within this of the SLO pass (float noise).
SLO_EPS = 1e-9


@dataclass(frozen=True)
class PhaseTimes:
    """One member's phase seconds inside a group, its switch seconds, and its solo reference."""

    name: str
    rollout_s: float
    train_s: float
    solo_s: float  # T_solo on its own pools (the slowdown reference)
    slo: float
    rollout_switch_s: float = 0.0
    train_switch_s: float = 0.0
    rollout_slots: tuple[int, ...] = ()  # the rollout slots it sits on (used by ``pinned``)


@dataclass(frozen=True)
class MetaIteration:
    """Steady-state round-robin meta-iteration of a group."""

    period_s: float  # the longest member period (round-robin: every member's)
    slowdown: Mapping[str, float]
    rollout_busy: float  # share of the period the rollout pool computes
    train_busy: float
    periods: Mapping[str, float] = field(default_factory=dict)  # work_conserving: per member

    def period_of(self, name: str) -> float:
        """Seconds between two iterations of member ``name`` in steady state."""
        return self.periods.get(name, self.period_s)

    def violations(self, slos: Mapping[str, float]) -> dict[str, float]:
        """Members whose slowdown exceeds their SLO -> slowdown."""
        return {j: s for j, s in self.slowdown.items() if s > slos[j] + SLO_EPS}


def member_phases(group: GroupModel, conservative: bool = True) -> list[PhaseTimes]:
    """Phase times of every member on the group's slots (conservative: max-length responses)."""
    out = []
    for job in group.members:
        slots = len(group.rollout_of(job))
        if conservative:
            r, t = job.conservative_rollout_s(slots), job.train_max_s
        else:
            r, t = job.expected_rollout_s(slots), job.expected_train_s()
        out.append(PhaseTimes(job.name, r, t, job.solo_iteration_s(conservative), job.slo,
                              job.switch.rollout_warm_s, job.switch.train_warm_s, group.rollout_of(job)))
    return out


def t_solo(p: PhaseTimes) -> float:
    return p.rollout_s + p.train_s


def cycle(phases: list[PhaseTimes]) -> float:
    return max((t_solo(p) for p in phases), default=0.0)


def load(phases: list[PhaseTimes]) -> float:
    return max(sum(p.rollout_s for p in phases), sum(p.train_s for p in phases))


def saturated(group: GroupModel | list[PhaseTimes], conservative: bool = True) -> bool:
    """``load >= cycle``: a pool is the bottleneck (switch seconds not counted). A group with
    pinned rollout slots: the rollout load is the busiest slot's."""
    phases = member_phases(group, conservative) if isinstance(group, GroupModel) else group
    if not phases:
        return False
    work = load(phases)
    if isinstance(group, GroupModel) and group.pin_rollout:
        per_slot: dict[int, float] = defaultdict(float)
        for p in phases:
            for s in p.rollout_slots:
                per_slot[s] += p.rollout_s
        work = max(max(per_slot.values(), default=0.0), sum(p.train_s for p in phases))
    return work >= cycle(phases)


def group_meta(group: GroupModel, conservative: bool = True) -> MetaIteration:
    """:func:`meta_iteration` of ``group``'s members under its schedule and pinning."""
    return meta_iteration(member_phases(group, conservative), schedule=group.schedule, pinned=group.pin_rollout)


def meta_iteration(phases: list[PhaseTimes], rounds: int | None = None,
                   schedule: str = "round_robin", pinned: bool = False) -> MetaIteration:
    """``round_robin``: strict round-robin on both pools, phase by phase, from a cold start for
    ``rounds`` meta-iterations (default: members + 3); the period is the larger of the last two.
    ``pinned`` (round-robin only): a member's rollout occupies only its ``rollout_slots``, and the
    rollout turn passes once it started, so members on disjoint slots roll out at once (RollMux's
    pinning, ``GroupView.pin_rollout``). ``work_conserving``: see :func:`meta_iteration_work_conserving`."""
    if pinned and schedule != "round_robin":
        raise ValueError(f"pinned rollout slots: only with schedule round_robin, got {schedule!r}")
    if pinned:
        return _meta_iteration_pinned(phases, rounds)
    if schedule == "work_conserving":
        return meta_iteration_work_conserving(phases, rounds)
    if schedule != "round_robin":
        raise ValueError(f"schedule: got {schedule!r}, allowed ('round_robin', 'work_conserving')")
    if not phases:
        return MetaIteration(0.0, {}, 0.0, 0.0)
    n = len(phases)
    rounds = rounds or n + 3
    multi = n > 1
    r_free = t_free = 0.0
    train_end = [0.0] * n
    starts: dict[str, list[float]] = defaultdict(list)
    for _ in range(rounds):
        for j, p in enumerate(phases):
            start = max(r_free, train_end[j])
            starts[p.name].append(start)
            r_end = start + p.rollout_s + (p.rollout_switch_s if multi else 0.0)
            r_free = r_end
            t_start = max(t_free, r_end)
            train_end[j] = t_start + p.train_s + (p.train_switch_s if multi else 0.0)
            t_free = train_end[j]
    slowdown = {}
    period = 0.0
    for p in phases:
        s = starts[p.name]
        per = max(s[-1] - s[-2], s[-2] - s[-3]) if len(s) >= 3 else (s[-1] - s[-2] if len(s) == 2 else t_solo(p))
        period = max(period, per)
        slowdown[p.name] = per / p.solo_s if p.solo_s > 0 else float("inf")
    return MetaIteration(period, slowdown,
                         min(1.0, sum(p.rollout_s for p in phases) / period) if period else 0.0,
                         min(1.0, sum(p.train_s for p in phases) / period) if period else 0.0)


def _meta_iteration_pinned(phases: list[PhaseTimes], rounds: int | None = None) -> MetaIteration:
    """Strict round-robin with rollout slots pinned per member (see :func:`meta_iteration`). Members
    on disjoint slots drift against each other by the difference of their cycles until the slower
    one holds the others back, so this runs ``rounds`` laps (default 8 x members + 16) and takes the
    lap as the slowest member's mean interval over the second half: every member's period in the
    long run (strict round-robin runs each once per lap)."""
    if not phases:
        return MetaIteration(0.0, {}, 0.0, 0.0)
    n = len(phases)
    rounds = rounds or 8 * n + 16
    multi = n > 1
    slot_free: dict[int, float] = defaultdict(float)
    turn_t = t_free = 0.0
    train_end = [0.0] * n
    starts: dict[str, list[float]] = defaultdict(list)
    for _ in range(rounds):
        for j, p in enumerate(phases):
            slots = p.rollout_slots or (-1,)
            start = max(turn_t, train_end[j], max(slot_free[s] for s in slots))
            starts[p.name].append(start)
            r_end = start + p.rollout_s + (p.rollout_switch_s if multi else 0.0)
            for s in slots:
                slot_free[s] = r_end
            turn_t = start
            t_start = max(t_free, r_end)
            train_end[j] = t_start + p.train_s + (p.train_switch_s if multi else 0.0)
            t_free = train_end[j]
    period = 0.0
    for p in phases:
        s = starts[p.name]
        h = len(s) // 2
        period = max(period, (s[-1] - s[h]) / (len(s) - 1 - h) if len(s) - 1 > h else t_solo(p))
    slowdown = {p.name: period / p.solo_s if p.solo_s > 0 else float("inf") for p in phases}
    width = len({s for p in phases for s in (p.rollout_slots or (-1,))})
    r_work = sum(p.rollout_s * len(p.rollout_slots or (-1,)) for p in phases)
    return MetaIteration(period, slowdown, min(1.0, r_work / (period * width)) if period else 0.0,
                         min(1.0, sum(p.train_s for p in phases) / period) if period else 0.0)


def meta_iteration_work_conserving(phases: list[PhaseTimes], rounds: int | None = None) -> MetaIteration:
    """Work-conserving rotation on both pools, event by event from a cold start: a free pool serves
    the first member ready for it in the cyclic order from its cursor (then the cursor moves past
    it), or waits for the first one to become ready. Runs until every member started ``rounds``
    rollouts (default: 2 x members + 4); a member's period is the mean interval between its rollout
    starts over the second half of them (a short-cycle member may run several iterations per
    iteration of a long-cycle one, in a repeating pattern)."""
    if not phases:
        return MetaIteration(0.0, {}, 0.0, 0.0)
    n = len(phases)
    target = rounds or 2 * n + 4
    multi = n > 1
    dur = ([p.rollout_s + (p.rollout_switch_s if multi else 0.0) for p in phases],
           [p.train_s + (p.train_switch_s if multi else 0.0) for p in phases])
    free = [0.0, 0.0]
    cursor = [0, 0]
    need = [0] * n  # 0: waits for rollout, 1: for training
    ready = [0.0] * n
    starts: list[list[float]] = [[] for _ in range(n)]
    # the slowest member gets a turn at least once per lap of each pool: bounded number of steps
    for _ in range(4 * n * (target + 1) + 8):
        if min(len(s) for s in starts) >= target:
            break
        best: tuple[float, int, int] | None = None
        for pool in (0, 1):
            waiting = [j for j in range(n) if need[j] == pool]
            if not waiting:
                continue
            t = max(free[pool], min(ready[j] for j in waiting))
            for step in range(n):
                j = (cursor[pool] + step) % n
                if need[j] == pool and ready[j] <= t:
                    break
            if best is None or t < best[0]:
                best = (t, pool, j)
        assert best is not None
        t, pool, j = best
        if pool == 0:
            starts[j].append(t)
        end = t + dur[pool][j]
        free[pool] = ready[j] = end
        need[j] = 1 - pool
        cursor[pool] = (j + 1) % n
    periods: dict[str, float] = {}
    slowdown = {}
    for p, s in zip(phases, starts):
        m = len(s) // 2
        per = (s[-1] - s[m]) / (len(s) - 1 - m) if len(s) - 1 > m else t_solo(p)
        periods[p.name] = per
        slowdown[p.name] = per / p.solo_s if p.solo_s > 0 else float("inf")
    period = max(periods.values())
    rbusy = sum(p.rollout_s / periods[p.name] for p in phases if periods[p.name] > 0)
    tbusy = sum(p.train_s / periods[p.name] for p in phases if periods[p.name] > 0)
    return MetaIteration(period, slowdown, min(1.0, rbusy), min(1.0, tbusy), periods)


def slowdowns(group: GroupModel, conservative: bool = True, schedule: str | None = None) -> MetaIteration:
    """The one-meta-iteration slowdown estimate of every member of ``group`` (under ``schedule``,
    default: the group's own, with its pinning)."""
    if schedule is None or schedule == group.schedule:
        return group_meta(group, conservative)
    return meta_iteration(member_phases(group, conservative), schedule=schedule)


def parked_bytes(group: GroupModel) -> dict[tuple[str, int], float]:
    """(pool, slot) -> bytes of parked state that the members pinned there keep in host memory."""
    out: dict[tuple[str, int], float] = {("rollout", s): 0.0 for s in group.pools.rollout}
    out.update({("train", s): 0.0 for s in group.pools.train})
    for job in group.members:
        for s in group.rollout_of(job):
            out[("rollout", s)] += job.rollout_bytes_per_slot
        for s in group.train_of(job):
            out[("train", s)] += job.train_bytes_per_slot
    return out


def residency_problems(group: GroupModel) -> list[str]:
    """One line per slot whose parked states exceed its host memory (empty: it fits)."""
    cap = group.pools.host_bytes_per_slot
    return [f"{pool} slot {slot}: {b / 1e9:.0f} GB parked > {cap / 1e9:.0f} GB host memory"
            for (pool, slot), b in sorted(parked_bytes(group).items()) if b > cap]
