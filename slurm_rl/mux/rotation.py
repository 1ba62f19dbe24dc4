"""Round-robin rotation of a co-execution group's pools among its jobs (pure, no I/O).

A group has two pools, ``rollout`` and ``train``, each a set of slots (GPUs). Every member job
alternates phases: ``rollout`` of iteration ``k`` on the rollout pool, then ``train`` of ``k``
(inference + actor) on the train pool, then ``rollout`` of ``k+1`` (on-policy). Each pool is
handed out in the members' cyclic order under one of two schedules (``GroupView.schedule``):

* ``round_robin`` (default, RollMux): strict — a free pool waits for the job whose turn is next,
  even while another member is ready. Every member runs exactly one iteration per lap, so its
  period is the group's meta-iteration (``max(cycle, load)`` in steady state).
* ``work_conserving``: a free pool whose next job is not ready (not waiting for it) serves the
  next *ready* job in the cyclic order from the cursor; the cursor then moves past the job served.
  A pool idles only while no member is ready for it, so this schedule cannot deadlock, and a
  short-cycle member may run several iterations while a long-cycle partner computes (no lock-step
  to the slowest member). Bounded slowdown still holds: once a job is ready for a pool, every
  grant of that pool goes to the first ready job between the cursor and it, and the cursor moves
  past that job, so it is served after at most the remainder of the running phase and one phase
  of each of the other ``n - 2`` members — at most ``n - 1`` phases of others, the same bound as
  strict round-robin (where it also waits for one phase of each other member per lap). The price:
  a member may now wait for a partner's *extra* phase that strict round-robin would not have run
  (at most one per pool per iteration), so a long-cycle member with a tight SLO can be slowed more
  than under round-robin; admission predicts with the schedule in force
  (:func:`slurm_rl.mux.analysis.meta_iteration`).

A pool's *turn* is the (job, iteration) phase that owns it: it receives every slot of the pool
that is free and that the job's ranks sit on. A turn ends when the job has released every one of
its slots for that iteration (the phase is done), or — rollout pool, long-tail migration — once
``tail_fraction`` of the job's responses are finished: then all but ``tail_slots`` of its slots
are revoked (its ranks there hand their unfinished requests to the tail and park) and the turn
passes, so the next job's rollout starts on each slot as soon as it is released. The tail moves
only once it fits: no more responses left than the kept slots run at once (``slot_capacity``),
otherwise a few slots would decode a queue serially and stretch the job's phase.

Slots move only through a release: a revoked slot stays with its holder until the holder's rank
wrote that it parked. A job that finished or failed leaves the rotation and its slots are freed.

:func:`decide` maps (last grant, observations) to the next grant, or ``None`` when nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

POOLS = ("rollout", "train")
SCHEDULES = ("round_robin", "work_conserving")
NONE_DONE = -1  # ``done`` value of a job that completed no phase on a pool yet


@dataclass(frozen=True)
class Holding:
    """Slot (or turn) owner: ``job``'s phase of ``iteration``; ``revoked``: must release (tail)."""

    job: str
    iteration: int
    revoked: bool = False


@dataclass(frozen=True)
class PoolGrant:
    """One pool's part of a grant."""

    slots: Mapping[int, Holding | None]  # every slot of the pool -> its holder (None: free)
    turn: Holding | None = None  # the phase that owns the pool now
    cursor: int = 0  # index into the members' order of the job whose turn is next


@dataclass(frozen=True)
class GroupGrant:
    """Who holds what: the content of one grant file (minus its number and generation)."""

    pools: Mapping[str, PoolGrant]
    done: Mapping[str, Mapping[str, int]]  # job -> pool -> last iteration whose phase completed
    started: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # job -> pool -> last turn given

    def holder(self, pool: str, slot: int) -> Holding | None:
        return self.pools[pool].slots.get(slot)


@dataclass(frozen=True)
class JobView:
    """What the group scheduler observes about one member job."""

    slots: Mapping[str, tuple[int, ...]]  # pool -> the slots its ranks sit on (fixed for the job)
    iterations: int  # iterations the job runs
    waiting: Mapping[str, int] = field(default_factory=dict)  # pool -> iteration some rank waits to be granted
    released: Mapping[tuple[str, int], frozenset[int]] = field(default_factory=dict)  # (pool, it) -> parked slots
    rollout_fraction: float = 0.0  # finished share of its current rollout phase
    out: bool = False  # finished or failed: out of the rotation
    rollout_left: int = 0  # responses of its current rollout phase not finished yet
    slot_capacity: int = 0  # responses one rollout slot runs at once (0: no limit)


@dataclass(frozen=True)
class GroupView:
    """The observations one decision is made on."""

    members: tuple[str, ...]  # the cyclic order of both pools (admission order, see group_sim.with_member)
    jobs: Mapping[str, JobView]
    tail_fraction: float = 1.0  # 1.0 (or more): no long-tail migration
    tail_slots: int = 1
    schedule: str = "round_robin"  # or "work_conserving" (see the module docstring)
    # RollMux's pinning: the rollout turn passes as soon as its job holds every rollout slot it sits
    # on, when those are not the whole pool, so members pinned to disjoint rollout slots roll out at
    # once (round-robin order kept); False: one rollout phase owns the pool at a time (until its tail)
    pin_rollout: bool = False

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule: got {self.schedule!r}, allowed {SCHEDULES}")


def initial_grant(pools: Mapping[str, tuple[int, ...]], members: tuple[str, ...]) -> GroupGrant:
    """Every slot free, no turn, every job before its first phase."""
    return GroupGrant(
        pools={p: PoolGrant(slots={s: None for s in sorted(pools[p])}) for p in POOLS},
        done={j: {p: NONE_DONE for p in POOLS} for j in members},
        started={j: {p: NONE_DONE for p in POOLS} for j in members},
    )


def next_iteration(grant: GroupGrant, job: str, pool: str) -> int:
    """The iteration whose phase on ``pool`` the job runs next (on-policy order)."""
    done = grant.done[job]
    return done["train"] + 1 if pool == "rollout" else done["rollout"]


def eligible(grant: GroupGrant, view: GroupView, job: str, pool: str) -> int | None:
    """The iteration the job may take ``pool`` for now (its ranks wait for it), else None."""
    jv = view.jobs[job]
    if jv.out:
        return None
    k = next_iteration(grant, job, pool)
    if k >= jv.iterations or k <= max(grant.done[job][pool], grant.started.get(job, {}).get(pool, NONE_DONE)):
        return None  # nothing left, the phase before it (other pool) is not complete, or it had its turn
    return k if jv.waiting.get(pool) == k else None


def _released(view: GroupView, h: Holding, pool: str, slot: int) -> bool:
    jv = view.jobs[h.job]
    return jv.out or slot in jv.released.get((pool, h.iteration), frozenset())


def _phase_complete(view: GroupView, job: str, pool: str, k: int) -> bool:
    jv = view.jobs[job]
    return set(jv.slots[pool]) <= set(jv.released.get((pool, k), frozenset()))


def decide(grant: GroupGrant, view: GroupView) -> tuple[GroupGrant, list[str]] | None:
    """The next grant and what changed (one line per event), or None when nothing changes."""
    events: list[str] = []
    done = {j: dict(d) for j, d in grant.done.items()}
    started = {j: dict(grant.started.get(j, {p: NONE_DONE for p in POOLS})) for j in grant.done}
    pools: dict[str, PoolGrant] = {}
    for pool in POOLS:
        pg = grant.pools[pool]
        slots = dict(pg.slots)
        turn, cursor = pg.turn, pg.cursor
        # 1. releases free slots; a phase whose job released every slot is complete
        for slot, h in pg.slots.items():
            if h is not None and _released(view, h, pool, slot):
                slots[slot] = None
        holders = {(h.job, h.iteration) for h in pg.slots.values() if h is not None}
        if turn is not None:
            holders.add((turn.job, turn.iteration))
        # a phase that started and is not complete, though its job holds no slot of it any more (its last
        # slot was freed before a rank that was never granted one released it as skipped)
        holders |= {(j, s[pool]) for j, s in started.items() if s.get(pool, NONE_DONE) > done[j][pool]}
        for job, k in sorted(holders):
            if not view.jobs[job].out and done[job][pool] < k and _phase_complete(view, job, pool, k):
                done[job][pool] = k
                events.append(f"{job}: {pool} of iteration {k} complete")
        # 2. the turn ends: job out, phase complete, or (rollout) its tail is reached
        if turn is not None:
            jv = view.jobs[turn.job]
            if jv.out:
                events.append(f"{pool}: {turn.job} left the rotation")
                turn = None
            elif done[turn.job][pool] >= turn.iteration:
                turn = None
            elif (pool == "rollout" and view.tail_fraction < 1.0 and jv.rollout_fraction >= view.tail_fraction
                  and (jv.slot_capacity <= 0 or jv.rollout_left <= jv.slot_capacity * max(1, view.tail_slots))
                  and any(j != turn.job and not view.jobs[j].out for j in view.members)):
                mine = sorted(s for s, h in slots.items() if h is not None and h.job == turn.job and not h.revoked)
                keep = mine[:max(1, view.tail_slots)]
                revoke = [s for s in mine if s not in keep]
                for s in revoke:
                    slots[s] = replace(slots[s], revoked=True)  # type: ignore[arg-type]
                events.append(f"{pool}: {turn.job} iteration {turn.iteration} reached its tail "
                              f"({jv.rollout_fraction:.0%} finished): keeps slots {keep}, revoked {revoke}")
                turn = None
            elif (pool == "rollout" and view.pin_rollout and set(jv.slots[pool]) < set(slots)
                  and all(slots.get(s) == turn for s in jv.slots[pool])
                  and any(j != turn.job and not view.jobs[j].out for j in view.members)):
                events.append(f"{pool}: {turn.job} iteration {turn.iteration} holds its pinned slots "
                              f"{sorted(jv.slots[pool])}: the turn passes")
                turn = None
        # 3. a free pool goes to the job whose turn is next, once it is eligible (round_robin: strict
        # order); work_conserving: to the first eligible job in the cyclic order from the cursor
        if turn is None:
            order = [j for j in view.members if not view.jobs[j].out]
            if order:
                n = len(view.members)
                now = GroupGrant(pools=grant.pools, done=done, started=started)
                for step in range(n):
                    job = view.members[(cursor + step) % n]
                    if view.jobs[job].out:
                        continue
                    k = eligible(now, view, job, pool)
                    if k is not None or view.schedule == "round_robin":
                        cursor = (cursor + step) % n
                        break
                else:
                    k = None  # work_conserving: nobody is ready; the cursor stays
                if k is not None:
                    turn = Holding(job, k)
                    started[job][pool] = k
                    cursor = (cursor + 1) % n
                    events.append(f"{pool}: turn of {job} iteration {k}")
        # 4. the turn takes every free slot its job sits on
        if turn is not None:
            for s in view.jobs[turn.job].slots[pool]:
                if s in slots and slots[s] is None:
                    slots[s] = turn
        pools[pool] = PoolGrant(slots=slots, turn=turn, cursor=cursor)
    new = GroupGrant(pools=pools, done=done, started=started)
    if new == grant:
        return None
    return new, events


def _holding_json(h: Holding | None) -> dict | None:
    return None if h is None else {"job": h.job, "iteration": h.iteration, "revoked": h.revoked}


def _holding(doc: Mapping | None) -> Holding | None:
    return None if doc is None else Holding(str(doc["job"]), int(doc["iteration"]), bool(doc.get("revoked", False)))


def grant_to_json(grant: GroupGrant) -> tuple[dict, dict]:
    """(``pools``, ``done``) of a grant file; ``done`` also carries each job's ``started`` turns."""
    pools = {p: {"slots": {str(s): _holding_json(h) for s, h in pg.slots.items()},
                 "turn": _holding_json(pg.turn), "cursor": pg.cursor} for p, pg in grant.pools.items()}
    done = {j: {**d, **{f"{p}_started": v for p, v in grant.started.get(j, {}).items()}} for j, d in grant.done.items()}
    return pools, done


def grant_from_json(pools: Mapping, done: Mapping) -> GroupGrant:
    """The inverse of :func:`grant_to_json` (a grant file read back, e.g. by a restarted scheduler)."""
    return GroupGrant(
        pools={p: PoolGrant(slots={int(s): _holding(h) for s, h in pg["slots"].items()}, turn=_holding(pg.get("turn")),
                            cursor=int(pg.get("cursor", 0))) for p, pg in pools.items()},
        done={j: {p: int(d[p]) for p in POOLS} for j, d in done.items()},
        started={j: {p: int(d.get(f"{p}_started", NONE_DONE)) for p in POOLS} for j, d in done.items()})
