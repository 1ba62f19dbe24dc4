"""Data model of multiplexed RL jobs: job profiles, pools, switch costs, GPU prices (pure).

A *slot* is the unit a pool is granted in (a node of ``gpus_per_slot`` GPUs in the cluster
traces, one GPU in the live comparison). A job's rollout phase is a set of responses, each taking
a fixed number of decode seconds once started (per-request decode speed does not depend on the
batch: decode is memory-bound); a rollout slot decodes up to ``lanes_per_slot`` responses at once,
first come first served. So a rollout on more slots is faster while responses queue, and its long
tail (the last few long responses) takes as long on one slot as on all of them — which is what
long-tail migration exploits. The training phase (inference + actor) takes ``train_s`` on the job's
``train_slots`` (its parallel layout is fixed).

Phase times exist twice: *expected* (the profiled response lengths) and *conservative* (every
response at the job's max length), the latter for admission.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Mapping

POOLS = ("rollout", "train")
#: Relative price per GPU-hour (an H800 costs 2.85 H20s).
GPU_PRICE = {"H20": 1.0, "H800": 2.85}
#: GPU type of each pool in the disaggregated setting.
POOL_GPU = {"rollout": "H20", "train": "H800"}


@dataclass(frozen=True)
class SwitchCosts:
    """Seconds a slot is unusable when a job (re)takes it.

    ``*_warm_s``: the job's state is parked in the node's host memory (host -> GPU load, the other
    job's state offloaded); ``cold_s``: loading the job's state from storage into its nodes' host
    memory once, at start (in a group, beside the running members); ``migrate_s``: a revoked
    rollout slot hands its unfinished requests to the tail and parks. Retaking a slot nobody else
    used in between costs nothing (the state is still on the GPU).
    """

    rollout_warm_s: float = 1.4
    train_warm_s: float = 5.0
    cold_s: float = 60.0
    migrate_s: float = 2.0

    def warm(self, pool: str) -> float:
        return self.rollout_warm_s if pool == "rollout" else self.train_warm_s


@dataclass(frozen=True)
class JobProfile:
    """One RL job as the group scheduler sees it.

    ``response_s[i]``: decode seconds of each response of iteration ``i`` (cycled when the job
    runs more iterations than patterns given), in dispatch order; ``train_s[i]`` likewise for the
    training phase on ``train_slots`` slots. ``rollout_slots`` is the rollout pool the job was
    profiled on (its solo setup). A response may stand for several real ones of similar length
    (``responses_per_unit``; lanes count units too).
    """

    name: str
    iterations: int
    rollout_slots: int
    train_slots: int
    lanes_per_slot: int
    response_s: tuple[tuple[float, ...], ...]
    train_s: tuple[float, ...]
    max_response_s: float  # decode seconds of a response of max_response_len tokens
    train_max_s: float  # training phase seconds if every response had max_response_len tokens
    max_response_len: int = 0
    mean_response_len: float = 0.0
    slo: float = 1.5  # tolerated slowdown vs running alone
    rollout_bytes_per_slot: float = 0.0  # parked state on each rollout slot it sits on
    train_bytes_per_slot: float = 0.0  # parked state on each train slot it sits on
    switch: SwitchCosts = field(default_factory=SwitchCosts)
    arrival_s: float = 0.0
    kind: str = "balanced"
    model_b: float = 7.0
    responses_per_unit: int = 1

    def __post_init__(self) -> None:
        if self.iterations < 1 or self.rollout_slots < 1 or self.train_slots < 1:
            raise ValueError(f"job {self.name}: iterations, rollout_slots and train_slots must be >= 1")
        if self.lanes_per_slot < 1:
            raise ValueError(f"job {self.name}: lanes_per_slot must be >= 1")
        if not self.response_s or not self.train_s or any(not r for r in self.response_s):
            raise ValueError(f"job {self.name}: response_s and train_s need at least one iteration")
        if any(d <= 0 for r in self.response_s for d in r) or any(t <= 0 for t in self.train_s):
            raise ValueError(f"job {self.name}: phase and response seconds must be > 0")

    def responses(self, iteration: int) -> tuple[float, ...]:
        return self.response_s[iteration % len(self.response_s)]

    def train_seconds(self, iteration: int) -> float:
        return self.train_s[iteration % len(self.train_s)]

    def rollout_seconds(self, iteration: int, slots: int | None = None) -> float:
        """Rollout phase seconds of ``iteration`` on ``slots`` slots (default: its own)."""
        return schedule_rollout(self.responses(iteration), slots or self.rollout_slots,
                                self.lanes_per_slot).makespan_s

    def expected_rollout_s(self, slots: int | None = None) -> float:
        """Mean rollout phase seconds over the profiled iterations (memoized per slot count on the
        instance: the profile is immutable, and admission asks for it once per candidate group)."""
        memo = self.__dict__.setdefault("_expected_rollout_memo", {})
        key = slots or self.rollout_slots
        if key not in memo:
            n = len(self.response_s)
            memo[key] = sum(self.rollout_seconds(i, key) for i in range(n)) / n
        return memo[key]

    def expected_train_s(self) -> float:
        return sum(self.train_s) / len(self.train_s)

    def conservative_rollout_s(self, slots: int | None = None) -> float:
        """Rollout seconds if every response had max length: full waves of max-length responses."""
        n = max(len(r) for r in self.response_s)
        waves = math.ceil(n / ((slots or self.rollout_slots) * self.lanes_per_slot))
        return waves * self.max_response_s

    def solo_iteration_s(self, conservative: bool = False) -> float:
        """T_solo: rollout + training on its own pools, no switches."""
        if conservative:
            return self.conservative_rollout_s() + self.train_max_s
        return self.expected_rollout_s() + self.expected_train_s()

    def tail(self, iteration: int = 0, fraction: float = 0.8, slots: int | None = None) -> tuple[float, float]:
        """(seconds until ``fraction`` of the responses finished, seconds of the rest: the tail)."""
        sched = schedule_rollout(self.responses(iteration), slots or self.rollout_slots, self.lanes_per_slot)
        t = sched.time_at_fraction(fraction)
        return t, sched.makespan_s - t


@dataclass(frozen=True)
class RolloutSchedule:
    """Responses list-scheduled first come first served on ``slots * lanes`` lanes from t=0."""

    finish_s: tuple[float, ...]  # sorted finish times
    slot_busy_s: tuple[float, ...]  # per slot: seconds with at least one response running
    makespan_s: float

    def time_at_fraction(self, fraction: float) -> float:
        """Seconds until ``fraction`` of the responses finished (the tail curve's inverse)."""
        if not self.finish_s:
            return 0.0
        k = min(len(self.finish_s), max(1, math.ceil(fraction * len(self.finish_s))))
        return self.finish_s[k - 1]

    def finished_fraction_at(self, t: float) -> float:
        """Finished share of the responses at ``t`` seconds (the tail curve)."""
        return bisect.bisect_right(self.finish_s, t) / max(1, len(self.finish_s))


def schedule_rollout(durations: tuple[float, ...], slots: int, lanes: int) -> RolloutSchedule:
    """FIFO list schedule of ``durations`` on ``slots`` slots of ``lanes`` lanes (lane ``l`` on
    slot ``l % slots``, so the first wave spreads over every slot)."""
    n_lanes = slots * lanes
    heap = [(0.0, lane) for lane in range(n_lanes)]
    finish: list[float] = []
    busy = [0.0] * slots
    for d in durations:
        t, lane = heapq.heappop(heap)
        end = t + d
        finish.append(end)
        s = lane % slots
        busy[s] = max(busy[s], end)  # a slot fed FIFO stays busy until its last response ends
        heapq.heappush(heap, (end, lane))
    finish.sort()
    return RolloutSchedule(tuple(finish), tuple(busy), finish[-1] if finish else 0.0)


@dataclass(frozen=True)
class ColocatedModel:
    """Rollout on the training GPUs (H800) relative to the rollout GPUs (H20).

    Decode is memory-bound, so a request decodes on an H800 at ``decode_speed`` times its H20 speed
    (default 1.0: 3.35 TB/s HBM against 4.0 TB/s, made up by far more compute for the batched
    part) with ``lane_factor`` times the concurrent requests (default 0.8: 80 GB of HBM against
    96 GB). Every iteration pays a warm rollout and a warm training switch (engines offload and
    reload; weights reshard), the first a cold start per node.
    """

    decode_speed: float = 1.0
    lane_factor: float = 0.8

    def lanes(self, job: "JobProfile") -> int:
        return max(1, int(job.lanes_per_slot * self.lane_factor))

    def iteration_s(self, job: "JobProfile", iteration: int) -> tuple[float, float]:
        """(seconds, busy slot-seconds) of iteration ``iteration`` of ``job`` co-located on its
        training slots (switches included in the seconds)."""
        durations = tuple(d / self.decode_speed for d in job.responses(iteration))
        sched = schedule_rollout(durations, job.train_slots, self.lanes(job))
        train = job.train_seconds(iteration)
        return (sched.makespan_s + train + job.switch.rollout_warm_s + job.switch.train_warm_s,
                sum(sched.slot_busy_s) + train * job.train_slots)

    def expected_iteration_s(self, job: "JobProfile") -> float:
        """Mean co-located iteration seconds over the profiled iterations."""
        n = len(job.response_s)
        return sum(self.iteration_s(job, k)[0] for k in range(n)) / n

    def conservative_iteration_s(self, job: "JobProfile") -> float:
        """Co-located iteration seconds if every response had max length."""
        n = max(len(r) for r in job.response_s)
        waves = math.ceil(n / (job.train_slots * self.lanes(job)))
        return (waves * job.max_response_s / self.decode_speed + job.train_max_s
                + job.switch.rollout_warm_s + job.switch.train_warm_s)


@dataclass(frozen=True)
class Pools:
    """A group's two pools: slot ids, GPU type and host memory per slot."""

    rollout: tuple[int, ...]
    train: tuple[int, ...]
    gpus_per_slot: int = 8
    host_bytes_per_slot: float = 1.0e12
    rollout_gpu: str = POOL_GPU["rollout"]
    train_gpu: str = POOL_GPU["train"]

    def slots(self, pool: str) -> tuple[int, ...]:
        return self.rollout if pool == "rollout" else self.train

    def gpu(self, pool: str) -> str:
        return self.rollout_gpu if pool == "rollout" else self.train_gpu

    def price_per_slot_hour(self, pool: str) -> float:
        return self.gpus_per_slot * GPU_PRICE[self.gpu(pool)]

    def cost_per_hour(self) -> float:
        """Relative price of holding both pools for one hour."""
        return sum(len(self.slots(p)) * self.price_per_slot_hour(p) for p in POOLS)


def slots_cost_per_hour(rollout_slots: int, train_slots: int, gpus_per_slot: int = 8) -> float:
    """Price per hour of ``rollout_slots`` H20 slots and ``train_slots`` H800 slots."""
    return gpus_per_slot * (rollout_slots * GPU_PRICE["H20"] + train_slots * GPU_PRICE["H800"])


def solo_pools(job: JobProfile, gpus_per_slot: int = 8, host_bytes_per_slot: float = 1.0e12) -> Pools:
    """The job's own disaggregated pools (its profiled sizes)."""
    return Pools(tuple(range(job.rollout_slots)), tuple(range(job.train_slots)), gpus_per_slot,
                 host_bytes_per_slot)


@dataclass(frozen=True)
class GroupModel:
    """A co-execution group as the admission model sees it: its pools and members (rotation order, each a
    :class:`JobProfile`) with their pinned slots. (``group_file.GroupSpec`` is the validated group file;
    ``live.LiveGroup`` a group dir's state as it runs: ``LiveGroup.model`` gives its ``GroupModel``.)

    A member sits on ``rollout_assign[name]`` (default: every rollout slot — rollout is elastic,
    its instances spread over the group's rollout pool) and on ``train_assign[name]`` (default: the
    first ``train_slots`` train slots — the training layout is fixed).
    """

    pools: Pools
    members: tuple[JobProfile, ...] = ()
    rollout_assign: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    train_assign: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    gid: int = 0
    remaining: Mapping[str, int] = field(default_factory=dict)  # iterations left (default: all)
    schedule: str = "round_robin"  # the group's rotation schedule (or "work_conserving")
    pin_rollout: bool = False  # members roll out on their own ``rollout_assign`` slots at once (RollMux's pinning)

    def rollout_of(self, job: JobProfile) -> tuple[int, ...]:
        return tuple(self.rollout_assign.get(job.name, self.pools.rollout))

    def train_of(self, job: JobProfile) -> tuple[int, ...]:
        return tuple(self.train_assign.get(job.name, self.pools.train[:job.train_slots]))

    def with_member(self, job: JobProfile, train: tuple[int, ...] | None = None,
                    rollout: tuple[int, ...] | None = None) -> "GroupModel":
        """This group with ``job`` appended to the rotation."""
        ra = dict(self.rollout_assign)
        ta = dict(self.train_assign)
        if rollout is not None:
            ra[job.name] = tuple(rollout)
        if train is not None:
            ta[job.name] = tuple(train)
        return replace(self, members=self.members + (job,), rollout_assign=ra, train_assign=ta)
