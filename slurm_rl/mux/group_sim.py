"""Event simulation of one co-execution group, driven by the live rotation policy.

Every change the live group scheduler would see (a job joins or waits for a pool, a slot is
released, a rollout reaches its tail fraction, a job leaves) leads to a call of
:func:`slurm_rl.mux.rotation.decide` — the same pure function the live group scheduler
calls — and the simulator applies the grant it returns, slot by slot:

* an admitted job first loads its state into its nodes' host memory (``cold_s``, while the
  members run), then joins the rotation;
* a slot granted to a job becomes usable after a switch: nothing if the job was the slot's last
  user (its state is still on the GPU), else the pool's warm switch (host memory -> GPU);
* rollout: each usable slot decodes up to ``lanes_per_slot`` of the job's responses at once, first
  come first served, each response taking its own decode seconds (so a rollout's speed grows with
  the slots it holds while responses queue, and its long tail does not);
* a revoked rollout slot (long-tail migration) stops at once, hands its unfinished responses
  (with the seconds already decoded) to the job's queue after ``migrate_s`` and is released then;
  the job's kept slots pick them up;
* training starts once the job holds every one of its train slots and lasts ``train_s``; the
  slots are released when it ends; a job's rollout slots are released when its last response ends.

Deterministic. Records per-slot busy/switch/migrate intervals (the timeline), busy and bubble
shares per pool, and per job: join, finish, slowdown vs running alone, and how many responses of
each iteration finished (each exactly once — a second finish raises).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from slurm_rl.scheduler.errors import SimulationError
from slurm_rl.mux.model import POOLS, JobProfile, Pools, solo_pools
from slurm_rl.mux.rotation import (
    NONE_DONE,
    SCHEDULES,
    GroupGrant,
    GroupView,
    Holding,
    JobView,
    PoolGrant,
    decide,
    initial_grant,
)

#: decide() is called until it returns None; more rounds than this at one instant is a bug.
MAX_DECIDE_ROUNDS = 16


@dataclass(frozen=True)
class Interval:
    """One slot's activity: ``kind`` is ``busy`` (computing), ``switch`` or ``migrate``."""

    pool: str
    slot: int
    job: str
    iteration: int
    start: float
    end: float
    kind: str = "busy"


@dataclass(frozen=True)
class JobResult:
    """One member's outcome."""

    name: str
    joined_s: float
    finish_s: float | None  # None: did not finish (failed or still running)
    solo_s: float  # the same job alone on its own pools
    slo: float
    iterations_done: int
    responses_finished: tuple[int, ...]  # per iteration
    responses_expected: tuple[int, ...]
    migrated_responses: int
    failed: bool = False

    @property
    def slowdown(self) -> float | None:
        if self.finish_s is None or self.solo_s <= 0:
            return None
        return (self.finish_s - self.joined_s) / self.solo_s

    @property
    def slo_met(self) -> bool:
        s = self.slowdown
        return s is not None and s <= self.slo + 1e-9


@dataclass(frozen=True)
class PoolStats:
    """Slot-seconds of one pool: provisioned, computing, switching, migrating (lanes: rollout)."""

    slots: int
    provisioned_slot_s: float
    busy_slot_s: float
    switch_slot_s: float
    migrate_slot_s: float
    lane_busy_s: float = 0.0  # rollout: response-seconds decoded
    lane_active_s: float = 0.0  # rollout: lane-seconds of slots that were ready to decode

    @property
    def lane_fraction(self) -> float:
        """Rollout: share of the lanes of working slots that decoded (low: a thin tail)."""
        return self.lane_busy_s / self.lane_active_s if self.lane_active_s else 0.0

    @property
    def busy_fraction(self) -> float:
        return self.busy_slot_s / self.provisioned_slot_s if self.provisioned_slot_s else 0.0

    @property
    def bubble_fraction(self) -> float:
        return 1.0 - self.busy_fraction if self.provisioned_slot_s else 0.0


@dataclass(frozen=True)
class GroupResult:
    """A simulated group."""

    jobs: Mapping[str, JobResult]
    pools: Mapping[str, PoolStats]
    start_s: float
    end_s: float
    timeline: tuple[Interval, ...] = ()
    grants: int = 0
    events: tuple[tuple[float, str], ...] = ()

    @property
    def makespan_s(self) -> float:
        return self.end_s - self.start_s

    def as_dict(self, timeline: bool = False) -> dict[str, Any]:
        """Plain JSON."""
        out: dict[str, Any] = {
            "start_s": round(self.start_s, 3), "end_s": round(self.end_s, 3),
            "makespan_s": round(self.makespan_s, 3), "grants": self.grants,
            "jobs": {n: {**asdict(j), "slowdown": None if j.slowdown is None else round(j.slowdown, 4),
                         "slo_met": j.slo_met} for n, j in self.jobs.items()},
            "pools": {p: {**asdict(s), "busy_fraction": round(s.busy_fraction, 4),
                          "bubble_fraction": round(s.bubble_fraction, 4)} for p, s in self.pools.items()},
        }
        if timeline:
            out["timeline"] = [asdict(i) for i in self.timeline]
        return out


@dataclass
class _Slot:
    pool: str
    sid: int
    added_s: float
    holder: tuple[str, int] | None = None
    gen: int = 0  # bumps on every grant change (stale ready events are dropped)
    active: bool = False
    revoked: bool = False
    lanes: int = 0
    running: dict[int, float] = field(default_factory=dict)  # rid -> start of its current run
    last_job: str | None = None
    busy_since: float | None = None
    switch_since: float | None = None
    active_since: float = 0.0


@dataclass
class _Job:
    prof: JobProfile
    joined_s: float
    rollout_slots: tuple[int, ...]
    train_slots: tuple[int, ...]
    follow_pool: bool  # sits on every rollout slot, also on slots added later
    it: int = 0
    phase: str = "rollout"  # loading | rollout | train | done
    waiting: dict[str, int] = field(default_factory=dict)
    released: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    out: bool = False
    failed: bool = False
    finish_s: float | None = None
    # rollout of the current iteration
    n: int = 0
    remaining: list[float] = field(default_factory=list)
    version: list[int] = field(default_factory=list)
    where: dict[int, int] = field(default_factory=dict)  # rid -> slot running it
    pending: deque[int] = field(default_factory=deque)
    done_flags: bytearray = field(default_factory=bytearray)
    finished: int = 0
    tail_at: int = 0
    finished_per_it: list[int] = field(default_factory=list)
    expected_per_it: list[int] = field(default_factory=list)
    migrated: int = 0
    train_ready: set[int] = field(default_factory=set)
    train_started: bool = False


class GroupSim:
    """One group over time: add jobs (and rollout slots) at any time, advance with ``run_until``.

    ``schedule``: how the rotation hands out a free pool (``round_robin`` or ``work_conserving``,
    see :mod:`slurm_rl.mux.rotation`); the live group scheduler gets it from the group's
    ``schedule``. ``pin_rollout``: members pinned to disjoint rollout slots roll out at once
    (``GroupView.pin_rollout``; the live group scheduler does not offer it yet)."""

    def __init__(self, pools: Pools, tail_fraction: float = 0.8, tail_slots: int = 1,
                 record: bool = True, start_s: float = 0.0, schedule: str = "round_robin",
                 pin_rollout: bool = False) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule: got {schedule!r}, allowed {SCHEDULES}")
        self.pools = pools
        self.pin_rollout = pin_rollout
        self.schedule = schedule
        self.tail_fraction = tail_fraction
        self.tail_slots = tail_slots
        self.record = record
        self.now = start_s
        self.start_s = start_s
        self.grant: GroupGrant = initial_grant({"rollout": pools.rollout, "train": pools.train}, ())
        self.members: list[str] = []
        self.jobs: dict[str, _Job] = {}
        self.slots: dict[tuple[str, int], _Slot] = {}
        for pool in POOLS:
            for s in pools.slots(pool):
                self.slots[(pool, s)] = _Slot(pool, s, start_s)
        self.heap: list[tuple[float, int, str, tuple]] = []
        self.seq = itertools.count()
        self.timeline: list[Interval] = []
        self.events: list[tuple[float, str]] = []
        self.grants = 0
        self.acc = {p: {"busy": 0.0, "switch": 0.0, "migrate": 0.0, "lane": 0.0, "lane_cap": 0.0}
                    for p in POOLS}
        self._view_cache: dict[str, JobView] = {}
        self._dirty = False  # something the rotation looks at changed since its last call
        self._to_dispatch: set[str] = set()  # jobs with new room on their slots (dispatched together)

    # ------------------------------------------------------------------ membership
    @property
    def active(self) -> list[str]:
        """Jobs not finished or failed (including those still loading their state)."""
        return [n for n, j in self.jobs.items() if not j.out]

    def add_job(self, job: JobProfile, t: float | None = None, rollout: Sequence[int] | None = None,
                train: Sequence[int] | None = None) -> None:
        """``job`` is admitted at ``t`` (default: now), sitting on ``rollout`` (default: every
        rollout slot) and ``train`` (default: the first ``job.train_slots`` train slots). Its state
        is loaded into the nodes' host memory first (``switch.cold_s``, beside the running
        members); then it joins the rotation (see :func:`with_member`)."""
        if job.name in self.jobs:
            raise ValueError(f"job {job.name} is already a member")
        t = self.now if t is None else t
        self.run_until(t)
        ro = tuple(rollout) if rollout is not None else tuple(self.pools.rollout)
        tr = tuple(train) if train is not None else tuple(self.pools.train[:job.train_slots])
        for pool, ss in (("rollout", ro), ("train", tr)):
            missing = [s for s in ss if (pool, s) not in self.slots]
            if missing or not ss:
                raise ValueError(f"job {job.name}: {pool} slots {list(ss)} not all in the pool")
        if len(tr) != job.train_slots:
            raise ValueError(f"job {job.name}: needs {job.train_slots} train slots, got {list(tr)}")
        j = _Job(job, t, ro, tr, follow_pool=rollout is None, phase="loading")
        self.jobs[job.name] = j
        self._push(t + job.switch.cold_s, "join", (job.name,))
        self.run_until(t)

    def _on_join(self, name: str) -> None:
        j = self.jobs[name]
        if j.out:
            return
        self.grant, order = with_member(self.grant, self.members, name)
        self.members = list(order)
        self._log(f"{name} joined the rotation")
        self._start_rollout(j, 0)
        self._dirty = True

    def add_slots(self, pool: str, slots: Sequence[int], t: float | None = None) -> None:
        """New free slots join ``pool`` at ``t`` (members that follow the pool sit on them)."""
        t = self.now if t is None else t
        self.run_until(t)
        new = [s for s in slots if (pool, s) not in self.slots]
        if not new:
            return
        pg = self.grant.pools[pool]
        self.grant = GroupGrant(pools={**self.grant.pools, pool: PoolGrant(
            slots={**pg.slots, **{s: None for s in new}}, turn=pg.turn, cursor=pg.cursor)},
            done=self.grant.done, started=self.grant.started)
        for s in new:
            self.slots[(pool, s)] = _Slot(pool, s, self.now)
        if pool == "rollout":
            self.pools = Pools(self.pools.rollout + tuple(new), self.pools.train, self.pools.gpus_per_slot,
                               self.pools.host_bytes_per_slot, self.pools.rollout_gpu, self.pools.train_gpu)
            for j in self.jobs.values():
                if j.follow_pool and not j.out:
                    j.rollout_slots = j.rollout_slots + tuple(new)
                    if j.phase == "train":  # its last rollout is over: it has nothing there
                        j.released.setdefault(("rollout", j.it), set()).update(new)
        else:
            self.pools = Pools(self.pools.rollout, self.pools.train + tuple(new), self.pools.gpus_per_slot,
                               self.pools.host_bytes_per_slot, self.pools.rollout_gpu, self.pools.train_gpu)
        self._dirty = True
        self._settle()

    def fail_job(self, name: str, t: float | None = None) -> None:
        """``name`` fails at ``t``: it leaves the rotation and its slots are freed."""
        t = self.now if t is None else t
        self.run_until(t)
        j = self.jobs[name]
        for (pool, _), slot in self.slots.items():
            if slot.holder is not None and slot.holder[0] == name:
                self._stop_slot(slot, withdraw=True)
        j.out = j.failed = True
        j.phase = "done"
        j.waiting = {}
        j.version = [v + 1 for v in j.version]
        self._log(f"{name} failed")
        self._dirty = True
        self._settle()

    # ------------------------------------------------------------------ running
    def run_until(self, t_stop: float | None = None) -> None:
        """Process every event up to ``t_stop`` (None: until nothing is left)."""
        while self.heap and (t_stop is None or self.heap[0][0] <= t_stop):
            t = self.heap[0][0]
            self.now = max(self.now, t)
            while self.heap and self.heap[0][0] <= t:
                _, _, kind, payload = heapq.heappop(self.heap)
                getattr(self, "_on_" + kind)(*payload)
            self._settle()
        if t_stop is not None:
            self.now = max(self.now, t_stop)
        elif any(not j.out for j in self.jobs.values()):
            raise SimulationError(f"group stalled at t={self.now:.1f}s: " + self._describe())

    def result(self, solo_s: Mapping[str, float] | None = None, end_s: float | None = None) -> GroupResult:
        """Outcome so far; ``solo_s`` gives each job's time alone (computed when missing)."""
        finishes = [j.finish_s for j in self.jobs.values() if j.finish_s is not None]
        end = end_s if end_s is not None else max(finishes, default=self.now)
        if end_s is None and any(not j.out for j in self.jobs.values()):
            end = self.now
        jobs = {}
        for name, j in self.jobs.items():
            solo = (solo_s or {}).get(name)
            if solo is None:
                solo = solo_time(j.prof, self.pools.gpus_per_slot, self.pools.host_bytes_per_slot)
            done = j.it + (1 if j.phase == "done" and not j.failed else 0)
            jobs[name] = JobResult(name, j.joined_s, j.finish_s, solo, j.prof.slo, done,
                                   tuple(j.finished_per_it), tuple(j.expected_per_it), j.migrated, j.failed)
        pools = {}
        for pool in POOLS:
            slots = [s for (p, _), s in self.slots.items() if p == pool]
            prov = sum(max(0.0, end - s.added_s) for s in slots)
            busy = self.acc[pool]["busy"] + sum(end - s.busy_since for s in slots if s.busy_since is not None)
            lane_cap = self.acc[pool]["lane_cap"] + sum(s.lanes * (end - s.active_since) for s in slots
                                                        if s.active and pool == "rollout")
            pools[pool] = PoolStats(len(slots), prov, busy, self.acc[pool]["switch"], self.acc[pool]["migrate"],
                                    self.acc[pool]["lane"], lane_cap)
        return GroupResult(jobs, pools, self.start_s, end, tuple(self.timeline), self.grants,
                           tuple(self.events))

    # ------------------------------------------------------------------ the policy
    def _view(self) -> GroupView:
        jobs: dict[str, JobView] = {}
        for name in self.members:
            if name in self._view_cache:
                jobs[name] = self._view_cache[name]
                continue
            j = self.jobs[name]
            jv = JobView(slots={"rollout": j.rollout_slots, "train": j.train_slots},
                         iterations=j.prof.iterations, waiting=dict(j.waiting),
                         released={k: frozenset(v) for k, v in j.released.items()},
                         rollout_fraction=j.finished / j.n if j.phase == "rollout" and j.n else 0.0,
                         out=j.out, rollout_left=j.n - j.finished if j.phase == "rollout" else 0,
                         slot_capacity=j.prof.lanes_per_slot)
            if j.out:
                self._view_cache[name] = jv
            jobs[name] = jv
        return GroupView(members=tuple(self.members), jobs=jobs, tail_fraction=self.tail_fraction,
                         tail_slots=self.tail_slots, schedule=self.schedule, pin_rollout=self.pin_rollout)

    def _settle(self) -> None:
        """After the events of one instant: dispatch responses to every slot that became usable
        (all together, so they are spread evenly) and call the rotation until both settle."""
        for _ in range(MAX_DECIDE_ROUNDS):
            for name in sorted(self._to_dispatch):
                self._dispatch(self.jobs[name])
            self._to_dispatch.clear()
            if not self._dirty:
                return
            self._decide()
        raise SimulationError(f"group did not settle at t={self.now:.1f}s")

    def _decide(self) -> None:
        self._dirty = False
        for _ in range(MAX_DECIDE_ROUNDS):
            out = decide(self.grant, self._view())
            if out is None:
                return
            new, events = out
            old, self.grant = self.grant, new
            self.grants += 1
            for e in events:
                self._log(e)
            self._apply(old, new)
        raise SimulationError(f"rotation did not settle at t={self.now:.1f}s")

    def _apply(self, old: GroupGrant, new: GroupGrant) -> None:
        for pool in POOLS:
            before = old.pools[pool].slots
            for sid, h in new.pools[pool].slots.items():
                o = before.get(sid)
                if h == o:
                    continue
                slot = self.slots[(pool, sid)]
                if h is None:
                    self._stop_slot(slot, withdraw=False)
                    slot.holder = None
                    slot.revoked = False
                elif o is None or (o.job, o.iteration) != (h.job, h.iteration):
                    self._acquire(slot, h)
                elif h.revoked and not o.revoked:
                    self._revoke(slot, h)

    # ------------------------------------------------------------------ slots
    def _acquire(self, slot: _Slot, h: Holding) -> None:
        j = self.jobs[h.job]
        sw = j.prof.switch
        cost = 0.0 if slot.last_job == h.job else sw.warm(slot.pool)  # its state is in host memory
        slot.holder = (h.job, h.iteration)
        slot.gen += 1
        slot.active = slot.revoked = False
        slot.lanes = j.prof.lanes_per_slot
        slot.last_job = h.job
        if cost > 0:
            slot.switch_since = self.now
            self._push(self.now + cost, "ready", (slot.pool, slot.sid, slot.gen))
        else:
            self._on_ready(slot.pool, slot.sid, slot.gen)

    def _on_ready(self, pool: str, sid: int, gen: int) -> None:
        slot = self.slots[(pool, sid)]
        if slot.gen != gen or slot.holder is None:
            return
        self._end_switch(slot, "switch")
        job, k = slot.holder
        j = self.jobs[job]
        if j.out or j.it != k:
            return
        slot.active = True
        slot.active_since = self.now
        if pool == "rollout":
            if j.phase == "rollout":
                self._to_dispatch.add(job)
        elif j.phase == "train":
            j.train_ready.add(sid)
            if not j.train_started and j.train_ready >= set(j.train_slots):
                self._start_train(j)

    def _end_switch(self, slot: _Slot, kind: str) -> None:
        if slot.switch_since is None:
            return
        job, k = slot.holder or ("", -1)
        self.acc[slot.pool][kind] += self.now - slot.switch_since
        if self.record and self.now > slot.switch_since:
            self.timeline.append(Interval(slot.pool, slot.sid, job, k, slot.switch_since, self.now, kind))
        slot.switch_since = None

    def _revoke(self, slot: _Slot, h: Holding) -> None:
        """Tail migration: the slot stops, its responses go back to the job after ``migrate_s``."""
        j = self.jobs[h.job]
        rids = self._stop_slot(slot, withdraw=True)
        slot.revoked = True
        slot.gen += 1
        j.migrated += len(rids)
        slot.switch_since = self.now
        self._push(self.now + j.prof.switch.migrate_s, "migrated", (h.job, h.iteration, slot.sid, tuple(rids)))

    def _on_migrated(self, job: str, k: int, sid: int, rids: tuple[int, ...]) -> None:
        slot = self.slots[("rollout", sid)]
        self._end_switch(slot, "migrate")
        j = self.jobs[job]
        if j.out or j.it != k:
            return
        j.pending.extendleft(reversed(rids))
        self._release(j, "rollout", sid)
        self._to_dispatch.add(job)

    def _stop_slot(self, slot: _Slot, withdraw: bool) -> list[int]:
        """The slot stops computing; with ``withdraw`` its running responses keep their progress."""
        self._end_switch(slot, "switch")
        rids = sorted(slot.running)
        if slot.holder is not None and withdraw:
            j = self.jobs[slot.holder[0]]
            for rid in rids:
                started = slot.running[rid]
                j.remaining[rid] = max(1e-9, j.remaining[rid] - (self.now - started))
                j.version[rid] += 1
                j.where.pop(rid, None)
                self.acc["rollout"]["lane"] += self.now - started
        slot.running.clear()
        self._busy_end(slot)
        self._deactivate(slot)
        return rids

    def _deactivate(self, slot: _Slot) -> None:
        if slot.active and slot.pool == "rollout":
            self.acc["rollout"]["lane_cap"] += slot.lanes * (self.now - slot.active_since)
        slot.active = False

    def _release(self, j: _Job, pool: str, sid: int) -> None:
        slot = self.slots[(pool, sid)]
        self._end_switch(slot, "switch")
        self._busy_end(slot)
        self._deactivate(slot)
        slot.gen += 1
        j.released.setdefault((pool, j.it), set()).add(sid)
        self._dirty = True

    def _busy_begin(self, slot: _Slot) -> None:
        if slot.busy_since is None:
            slot.busy_since = self.now

    def _busy_end(self, slot: _Slot) -> None:
        if slot.busy_since is None:
            return
        self.acc[slot.pool]["busy"] += self.now - slot.busy_since
        if self.record and self.now > slot.busy_since and slot.holder is not None:
            self.timeline.append(Interval(slot.pool, slot.sid, slot.holder[0], slot.holder[1],
                                          slot.busy_since, self.now))
        slot.busy_since = None

    # ------------------------------------------------------------------ rollout
    def _start_rollout(self, j: _Job, k: int) -> None:
        durations = j.prof.responses(k)
        j.it, j.phase = k, "rollout"
        j.n = len(durations)
        j.remaining = list(durations)
        j.version = [0] * j.n
        j.where = {}
        j.pending = deque(range(j.n))
        j.done_flags = bytearray(j.n)
        j.finished = 0
        j.tail_at = max(1, math.ceil(self.tail_fraction * j.n - 1e-9))
        j.finished_per_it.append(0)
        j.expected_per_it.append(j.n)
        j.waiting = {"rollout": k}
        j.released = {key: v for key, v in j.released.items() if key[1] >= k - 1}

    def _dispatch(self, j: _Job) -> None:
        if not j.pending:
            return
        key = (j.prof.name, j.it)
        heap = [(len(s.running), s.sid) for sid in j.rollout_slots
                if (s := self.slots[("rollout", sid)]).active and not s.revoked and s.holder == key
                and len(s.running) < s.lanes]
        if not heap:
            return
        heapq.heapify(heap)
        while j.pending and heap:
            load, sid = heapq.heappop(heap)
            slot = self.slots[("rollout", sid)]
            rid = j.pending.popleft()
            slot.running[rid] = self.now
            j.where[rid] = sid
            self._busy_begin(slot)
            self._push(self.now + j.remaining[rid], "resp", (j.prof.name, j.it, rid, j.version[rid]))
            if load + 1 < slot.lanes:
                heapq.heappush(heap, (load + 1, sid))

    def _on_resp(self, job: str, k: int, rid: int, version: int) -> None:
        j = self.jobs[job]
        if j.out or j.it != k or j.phase != "rollout" or j.version[rid] != version:
            return
        sid = j.where.pop(rid)
        slot = self.slots[("rollout", sid)]
        started = slot.running.pop(rid)
        self.acc["rollout"]["lane"] += self.now - started
        if j.done_flags[rid]:
            raise AssertionError(f"{job} iteration {k}: response {rid} finished twice")
        j.done_flags[rid] = 1
        j.remaining[rid] = 0.0
        j.finished += 1
        j.finished_per_it[-1] += 1
        if not slot.running:
            self._busy_end(slot)
        if j.finished == j.n:
            self._rollout_complete(j)
            return
        if (self.tail_fraction < 1.0 and j.finished >= j.tail_at
                and j.n - j.finished <= j.prof.lanes_per_slot * max(1, self.tail_slots)):
            turn = self.grant.pools["rollout"].turn
            if turn is not None and (turn.job, turn.iteration) == (job, k):
                self._dirty = True  # the tail may move now
        self._dispatch(j)

    def _rollout_complete(self, j: _Job) -> None:
        if not all(j.done_flags):
            raise AssertionError(f"{j.prof.name} iteration {j.it}: rollout ended with unfinished responses")
        key = (j.prof.name, j.it)
        for sid in j.rollout_slots:
            slot = self.slots[("rollout", sid)]
            if slot.holder == key and slot.revoked:
                continue  # released when its migration ends
            self._release(j, "rollout", sid) if slot.holder == key else \
                j.released.setdefault(("rollout", j.it), set()).add(sid)
        j.phase = "train"
        j.waiting = {"train": j.it}
        self._dirty = True
        j.train_ready = set()
        j.train_started = False

    # ------------------------------------------------------------------ training
    def _start_train(self, j: _Job) -> None:
        j.train_started = True
        for sid in j.train_slots:
            self._busy_begin(self.slots[("train", sid)])
        self._push(self.now + j.prof.train_seconds(j.it), "train_done", (j.prof.name, j.it))

    def _on_train_done(self, job: str, k: int) -> None:
        j = self.jobs[job]
        if j.out or j.it != k or j.phase != "train":
            return
        for sid in j.train_slots:
            self._release(j, "train", sid)
        if k + 1 < j.prof.iterations:
            self._start_rollout(j, k + 1)
        else:
            j.phase, j.out, j.finish_s, j.waiting = "done", True, self.now, {}
            self._log(f"{job} finished")
        self._dirty = True

    # ------------------------------------------------------------------ plumbing
    def _push(self, t: float, kind: str, payload: tuple) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, payload))

    def _log(self, text: str) -> None:
        if self.record:
            self.events.append((round(self.now, 6), text))

    def _describe(self) -> str:
        parts = []
        for n in self.members:
            j = self.jobs[n]
            if not j.out:
                parts.append(f"{n}: iteration {j.it} {j.phase}, waiting {j.waiting}, "
                             f"{j.finished}/{j.n} responses, released {j.released}")
        holders = {p: {s: (h.job, h.iteration, h.revoked) if h else None
                       for s, h in self.grant.pools[p].slots.items()} for p in POOLS}
        turns = {p: self.grant.pools[p].turn for p in POOLS}
        return "; ".join(parts) + f"; holders {holders}; turns {turns}"


def with_member(grant: GroupGrant, members: Sequence[str], job: str) -> tuple[GroupGrant, tuple[str, ...]]:
    """Admit ``job`` into a running rotation: (grant, members' order) with ``job`` last in the
    round-robin order, i.e. inserted just before the job the train pool serves next.

    Both pools must serve phases in one cyclic order (the train pool lagging the rollout pool by
    less than a lap), or strict round-robin deadlocks: the rollout pool waiting for a job that
    waits for training while the train pool waits for a job that waits for rollout. Inserting the
    newcomer where the train pool's cursor points (the train cursor then moves past it) keeps
    that order; the rollout cursor keeps pointing at the same job, unless it points at that very
    job and the rollout pool is a lap ahead (its rollout started, its training not yet): then the
    newcomer's rollout is the next one.

    The same insertion serves both schedules: there is one members' order, cyclic on both pools.
    Under ``work_conserving`` a pool never waits for a job that is not ready, so no order can
    deadlock it; inserting the newcomer just before the train pool's next job still makes it the
    last of the current lap on both pools (it waits at most one lap for its first turns).
    """
    members = tuple(members)
    fresh = {p: NONE_DONE for p in POOLS}
    started = {j: dict(grant.started.get(j, fresh)) for j in grant.done}
    n = len(members)
    q = grant.pools["train"].cursor % n if n else 0
    c_r = grant.pools["rollout"].cursor % n if n else 0
    lap_ahead = bool(n) and started[members[q]]["rollout"] > started[members[q]]["train"]
    cursors = {"train": q + 1 if n else 0,
               "rollout": c_r + 1 if n and (c_r > q or (c_r == q and not lap_ahead)) else c_r}
    pools = {pool: PoolGrant(slots=pg.slots, turn=pg.turn, cursor=cursors[pool]) for pool, pg in grant.pools.items()}
    started[job] = dict(fresh)
    return (GroupGrant(pools=pools, done={**grant.done, job: dict(fresh)}, started=started),
            members[:q] + (job,) + members[q:])


def solo_time(job: JobProfile, gpus_per_slot: int = 8, host_bytes_per_slot: float = 1.0e12) -> float:
    """Seconds ``job`` takes alone on its own pools (cold start included), under the same model."""
    sim = GroupSim(solo_pools(job, gpus_per_slot, host_bytes_per_slot), tail_fraction=1.0, record=False)
    sim.add_job(job, 0.0)
    sim.run_until(None)
    finish = sim.jobs[job.name].finish_s
    assert finish is not None
    return finish


def simulate_group(pools: Pools, jobs: Sequence[JobProfile], tail_fraction: float = 0.8,
                   tail_slots: int = 1, rollout_assign: Mapping[str, Sequence[int]] | None = None,
                   train_assign: Mapping[str, Sequence[int]] | None = None, record: bool = True,
                   solo_s: Mapping[str, float] | None = None, schedule: str = "round_robin") -> GroupResult:
    """Run ``jobs`` (each joining at its ``arrival_s``, in that order) on ``pools`` to the end."""
    sim = GroupSim(pools, tail_fraction, tail_slots, record=record,
                   start_s=min((j.arrival_s for j in jobs), default=0.0), schedule=schedule)
    for job in sorted(jobs, key=lambda j: j.arrival_s):
        sim.add_job(job, job.arrival_s, (rollout_assign or {}).get(job.name), (train_assign or {}).get(job.name))
    sim.run_until(None)
    return sim.result(solo_s)


def simulate_group_from_phases(rollout_slots: Sequence[int], train_slots: Sequence[int],
                               jobs: Sequence[Mapping[str, Any]], tail_fraction: float = 0.8,
                               tail_slots: int = 1, switch: Mapping[str, float] | None = None,
                               record: bool = True, schedule: str = "round_robin") -> GroupResult:
    """Convenient entry: each job given as a mapping with ``name``, ``iterations``,
    ``response_s`` (per iteration: decode seconds of each response), ``train_s`` (per iteration),
    ``lanes_per_slot``, and optionally ``rollout`` / ``train`` (the slots it sits on; default all
    rollout slots and the first ``len(train_slots)`` train slots), ``slo``. ``switch``: seconds
    ``rollout`` / ``train`` (warm), ``cold``, ``migrate``. Slots are GPUs (``gpus_per_slot=1``)."""
    from slurm_rl.mux.model import SwitchCosts

    sw = dict(switch or {})
    costs = SwitchCosts(rollout_warm_s=float(sw.get("rollout", 0.0)), train_warm_s=float(sw.get("train", 0.0)),
                        cold_s=float(sw.get("cold", 0.0)), migrate_s=float(sw.get("migrate", 0.0)))
    pools = Pools(tuple(rollout_slots), tuple(train_slots), gpus_per_slot=1)
    profiles, ra, ta = [], {}, {}
    for spec in jobs:
        name = str(spec["name"])
        ro = tuple(spec.get("rollout") or rollout_slots)
        tr = tuple(spec.get("train") or train_slots)
        resp = tuple(tuple(float(x) for x in it) for it in spec["response_s"])
        trn = tuple(float(x) for x in spec["train_s"])
        profiles.append(JobProfile(
            name=name, iterations=int(spec["iterations"]), rollout_slots=len(ro), train_slots=len(tr),
            lanes_per_slot=int(spec["lanes_per_slot"]), response_s=resp, train_s=trn,
            max_response_s=float(spec.get("max_response_s", max(max(r) for r in resp))),
            train_max_s=float(spec.get("train_max_s", max(trn))), slo=float(spec.get("slo", 1.5)),
            switch=costs, arrival_s=float(spec.get("arrival_s", 0.0))))
        ra[name], ta[name] = ro, tr
    return simulate_group(pools, profiles, tail_fraction, tail_slots, ra, ta, record, schedule=schedule)
