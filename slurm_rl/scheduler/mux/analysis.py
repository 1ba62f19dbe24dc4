"""Closed-form and one-meta-iteration analysis of a co-execution group (pure, no I/O).

With phase times ``R_j`` (rollout on the group's rollout slots) and ``T_j`` (training):
``T_solo(j) = R_j + T_j``, ``cycle = max_j T_solo(j)``, ``load = max(sum_j R_j, sum_j T_j)`` (the
busiest pool's work per meta-iteration). A group is *saturated* when ``load >= cycle``: a pool then
works back to back and the meta-iteration lasts about ``load``; below that it lasts about
``cycle`` and round-robin keeps both pools as busy as the members allow (RollMux, Theorem 1).

:func:`meta_iteration` simulates the strict round-robin schedule phase by phase (every phase
pays the pool's warm switch when the group has several members) until it repeats, and gives each
member's slowdown: the meta-iteration's length over its ``T_solo`` on its own pools.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

from slurm_rl.scheduler.mux.model import GroupSpec

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


@dataclass(frozen=True)
class MetaIteration:
    """Steady-state round-robin meta-iteration of a group."""

    period_s: float
    slowdown: Mapping[str, float]
    rollout_busy: float  # share of the period the rollout pool computes
    train_busy: float

    def violations(self, slos: Mapping[str, float]) -> dict[str, float]:
        """Members whose slowdown exceeds their SLO -> slowdown."""
        return {j: s for j, s in self.slowdown.items() if s > slos[j] + SLO_EPS}


def member_phases(group: GroupSpec, conservative: bool = True) -> list[PhaseTimes]:
    """Phase times of every member on the group's slots (conservative: max-length responses)."""
    out = []
    for job in group.members:
        slots = len(group.rollout_of(job))
        if conservative:
            r, t = job.conservative_rollout_s(slots), job.train_max_s
        else:
            r, t = job.expected_rollout_s(slots), job.expected_train_s()
        out.append(PhaseTimes(job.name, r, t, job.solo_iteration_s(conservative), job.slo,
                              job.switch.rollout_warm_s, job.switch.train_warm_s))
    return out


def t_solo(p: PhaseTimes) -> float:
    return p.rollout_s + p.train_s


def cycle(phases: list[PhaseTimes]) -> float:
    return max((t_solo(p) for p in phases), default=0.0)


def load(phases: list[PhaseTimes]) -> float:
    return max(sum(p.rollout_s for p in phases), sum(p.train_s for p in phases))


def saturated(group: GroupSpec | list[PhaseTimes], conservative: bool = True) -> bool:
    """``load >= cycle``: a pool is the bottleneck (switch seconds not counted)."""
    phases = member_phases(group, conservative) if isinstance(group, GroupSpec) else group
    return bool(phases) and load(phases) >= cycle(phases)


def meta_iteration(phases: list[PhaseTimes], rounds: int | None = None) -> MetaIteration:
    """Strict round-robin on both pools, phase by phase, from a cold start for ``rounds``
    meta-iterations (default: members + 3); the period is the larger of the last two."""
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


def slowdowns(group: GroupSpec, conservative: bool = True) -> MetaIteration:
    """The one-meta-iteration slowdown estimate of every member of ``group``."""
    return meta_iteration(member_phases(group, conservative))


def parked_bytes(group: GroupSpec) -> dict[tuple[str, int], float]:
    """(pool, slot) -> bytes of parked state that the members pinned there keep in host memory."""
    out: dict[tuple[str, int], float] = {("rollout", s): 0.0 for s in group.pools.rollout}
    out.update({("train", s): 0.0 for s in group.pools.train})
    for job in group.members:
        for s in group.rollout_of(job):
            out[("rollout", s)] += job.rollout_bytes_per_slot
        for s in group.train_of(job):
            out[("train", s)] += job.train_bytes_per_slot
    return out


def residency_problems(group: GroupSpec) -> list[str]:
    """One line per slot whose parked states exceed its host memory (empty: it fits)."""
    cap = group.pools.host_bytes_per_slot
    return [f"{pool} slot {slot}: {b / 1e9:.0f} GB parked > {cap / 1e9:.0f} GB host memory"
            for (pool, slot), b in sorted(parked_bytes(group).items()) if b > cap]
