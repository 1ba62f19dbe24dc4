"""What a run has measured about itself so far: the input of the ``plan`` policy's forecast.

``History`` is an immutable value inside ``SchedState``; ``scheduler.recorder.HistoryRecorder``
(owned by the live coordinator or by the simulator, never global) folds the observations both
already make at each policy call (``Tick``) into it. The two feed it the same kinds of numbers:

* response lengths of finished requests, as counts per geometric bucket (``length_bucket``);
* decode speed: seconds per decode step of an instance running ``b`` requests (least-squares
  sums of ``step_s = alpha + beta * b``);
* actor mini-batch seconds and tokens at a data-parallel size; inference busy GPU-seconds and
  samples;
* the completion curve of the last iteration (seconds until each tenth of the samples was in
  complete groups, i.e. ready for inference) and switch latencies (publish -> applied, reshard
  included; a switch that grew the actor is kept with the fraction of its state it moved, so the
  forecast can tell the fixed latency from the reshard, ``cost_model.reshard_fraction``);
* how far the rollout forecast was off last iteration: the median of actual / forecast
  remaining rollout seconds over snapshots of the iteration (``forecast.rollout_bias``).

The values only: this module imports nothing of the scheduler, so ``forecast`` can read them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

#: Buckets per doubling of the response length (bucket ``i`` covers ``[2**(i/B), 2**((i+1)/B))``).
BUCKETS_PER_DOUBLING = 4
#: Number of length buckets (lengths up to 2**20 tokens).
NUM_BUCKETS = 20 * BUCKETS_PER_DOUBLING
#: Completion-curve points: the seconds at which 10 %, 20 %, ..., 100 % of the samples finished.
CURVE_POINTS = 10
#: Mini-batch and switch observations kept (the most recent ones).
KEEP = 32
#: Seconds between the rollout snapshots that check the rollout forecast after an iteration.
SNAPSHOT_EVERY_S = 1.0


def length_bucket(tokens: int) -> int:
    """The bucket of a response of ``tokens`` tokens."""
    return min(NUM_BUCKETS - 1, max(0, int(math.log2(max(1, tokens)) * BUCKETS_PER_DOUBLING)))


def bucket_edges(i: int) -> tuple[float, float]:
    """Lower and upper length of bucket ``i``."""
    return 2 ** (i / BUCKETS_PER_DOUBLING), 2 ** ((i + 1) / BUCKETS_PER_DOUBLING)


def add_hist(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Bucket-wise sum of two length histograms (either may be empty)."""
    if not a:
        return tuple(b)
    if not b:
        return tuple(a)
    return tuple(x + y for x, y in zip(a, b))


@dataclass(frozen=True)
class DecodeFit:
    """Duration-weighted least-squares sums for ``step_s = alpha + beta * running``."""

    w: float = 0.0
    sb: float = 0.0
    sy: float = 0.0
    sbb: float = 0.0
    sby: float = 0.0

    def add(self, running: float, step_s: float, weight: float) -> "DecodeFit":
        if weight <= 0 or running <= 0 or step_s <= 0:
            return self
        return DecodeFit(self.w + weight, self.sb + weight * running, self.sy + weight * step_s,
                         self.sbb + weight * running * running, self.sby + weight * running * step_s)

    def line(self) -> tuple[float, float] | None:
        """``(alpha, beta)``; ``beta = 0`` while a single load was seen; None without data."""
        if self.w <= 0:
            return None
        mb, my = self.sb / self.w, self.sy / self.w
        var = self.sbb / self.w - mb * mb
        if var <= 1e-9 * max(1.0, mb * mb):
            return my, 0.0
        beta = max(0.0, (self.sby / self.w - mb * my) / var)
        alpha = my - beta * mb
        if alpha <= 0:  # a step never costs nothing: fall back to a load-independent step
            return my, 0.0
        return alpha, beta


@dataclass(frozen=True)
class History:
    """Measurements of this run (earlier iterations, and the current one so far)."""

    iterations_done: int = 0
    lengths: tuple[int, ...] = ()          # finished responses of earlier iterations, per bucket
    current_lengths: tuple[int, ...] = ()  # finished responses of the current iteration so far
    decode: DecodeFit = field(default_factory=DecodeFit)
    minibatches: tuple[tuple[int, float, int], ...] = ()  # (actor DP, seconds, tokens) of recent ones
    inference: tuple[float, float] = (0.0, 0.0)       # (samples, busy GPU-seconds), earlier iterations
    current_inference: tuple[float, float] = (0.0, 0.0)  # ... of the current iteration so far
    curve: tuple[float, ...] = ()          # last iteration: seconds until each tenth finished
    curve_work: tuple[float, ...] = ()     # ... and rollout instance-seconds spent until then (the
                                           # tail after the queue drained on the instances at the drain)
    iteration_s: tuple[float, ...] = ()    # wall time of earlier iterations
    time_sliced: tuple[bool, ...] = ()     # ... whether each ran collocated (every rank time-sliced)
    switches: tuple[float, ...] = ()       # seconds from a decision to the switch being applied
    reshards: tuple[tuple[float, float], ...] = ()  # (state fraction moved, seconds) of actor growths
    longest: int = 0                       # longest response seen (earlier iterations)
    rollout_bias: float = 1.0              # actual / forecast remaining rollout time, last iteration
    rollout_end_s: float = 0.0             # last iteration: seconds until its last response (0: not seen)
    drain_instances: int = 0               # rollout instances when the current iteration's queue
                                           # drained (0: not drained yet)

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form (``control/history.json`` of a live run)."""
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "History":
        """Inverse of ``to_json``."""
        fields = dict(doc)
        fields["decode"] = DecodeFit(**fields.get("decode", {}))
        for key in ("lengths", "current_lengths", "curve", "curve_work", "iteration_s", "time_sliced", "switches"):
            fields[key] = tuple(fields.get(key, ()))
        for key in ("inference", "current_inference"):
            fields[key] = tuple(fields.get(key, (0.0, 0.0)))
        fields["minibatches"] = tuple(tuple(m) for m in fields.get("minibatches", ()))
        fields["reshards"] = tuple(tuple(m) for m in fields.get("reshards", ()))
        return cls(**fields)

    def mode_iteration_s(self, time_sliced: bool, window: int) -> tuple[float, int] | None:
        """The mean wall time of the latest ``window`` earlier iterations that ran collocated (``time_sliced``)
        or not, and how many iterations ago the latest of them ended (1: the last one); None when none did.
        The run's first iteration does not count (engines built, caches and the forecast cold): it measures the
        start, not the mode."""
        modes = self.time_sliced[-len(self.iteration_s):] if self.iteration_s else ()
        modes = (False,) * (len(self.iteration_s) - len(modes)) + modes
        first = len(self.iteration_s) - 1 if len(self.iteration_s) == self.iterations_done else -1
        seen = [(age, seconds) for age, (seconds, mode) in
                enumerate(zip(reversed(self.iteration_s), reversed(modes)), start=1)
                if mode == time_sliced and age - 1 != first][:window]
        if not seen:
            return None
        return sum(seconds for _, seconds in seen) / len(seen), seen[0][0]

    @property
    def switch_s(self) -> float | None:
        """Mean latency of the switches that moved no actor state (None before the first)."""
        return sum(self.switches) / len(self.switches) if self.switches else None

    def state_move_s(self, latency_s: float) -> float | None:
        """Seconds to move the actor's whole state, from the growths seen: the mean of
        ``(seconds - latency_s) / fraction`` (None before the first growth)."""
        if not self.reshards:
            return None
        return max(0.0, sum((sec - latency_s) / frac for frac, sec in self.reshards) / len(self.reshards))


@dataclass(frozen=True)
class Tick:
    """What the coordinator / simulator saw at one policy call of iteration ``iteration``."""

    iteration: int
    elapsed_s: float
    samples: int
    finished: int
    inference_done: int
    groups_ready: int                      # samples of complete groups (inference input so far)
    inference_gpus: int
    max_running: int                       # requests one rollout instance decodes at most
    running: int                           # rollout requests decoding now
    instances: int                         # rollout instances now
    inference_busy_gpu_s: float            # GPU-seconds inference computed this iteration so far
    lengths: tuple[int, ...]               # histogram of this iteration's finished responses
    decode: tuple[tuple[float, float], ...] = ()  # (running, seconds per step) per busy instance
    minibatch: tuple[int, float, int] | None = None  # (DP, seconds, tokens) of a mini-batch that ended
    longest: int = 0                                 # longest response finished this iteration
    switch_s: float | None = None                 # a switch that was applied since the last tick
    switch_fraction: float = 0.0                  # ... the fraction of the actor's state it moved
    time_sliced: bool = False                     # the iteration runs collocated (every rank time-sliced)
