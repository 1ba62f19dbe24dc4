"""The ``plan`` policy's forecast: remaining rollout, inference and actor time from ``History``.

Everything is fitted from the run's own measurements (``slurm_rl.scheduler.history``); nothing
here is a per-workload constant. Pure functions, a few hundred float operations per call.

* Response lengths: the quantile function of the finished responses of earlier iterations
  (cold start: this iteration's finished responses, the unfinished upper part extrapolated
  lognormally through the median and the highest quantile seen, up to the expected longest of
  the iteration's samples); ``Survival`` tabulates it once per forecast.
* Decode: ``step_s(b) = alpha + beta * b`` per request and step on an instance running ``b``
  requests; with one load seen so far ``beta = 0`` (no gain from spreading is assumed).
* Rollout (``RolloutView``): followed in tokens per request (every running request decodes one
  per step): the queue drains at full-load throughput; the requests in the slots then have
  tokens left as in a renewal process; the load falls as they finish (``_TailLoad``); the
  longest pending requests were dispatched in random order before the drain. Times the bias
  learned from the last iteration (``rollout_bias``).
* Actor: mini-batch seconds ``W / dp ** s`` (``s`` fitted once two DP sizes were seen, else 1);
  a switch from DP ``a`` to ``b``: the latency of a switch plus the seconds to move the whole
  state times the fraction that moves (``cost_model.reshard_fraction``), both as seen;
  inference: GPU-seconds per sample (busy time over samples scored).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable

from slurm_rl.scheduler.cost_model import reshard_fraction
from slurm_rl.scheduler.history import (
    BUCKETS_PER_DOUBLING,
    CURVE_POINTS,
    History,
    Tick,
    bucket_edges,
    length_bucket,
)


def quantiles(hist: tuple[int, ...], probs: list[float]) -> list[float] | None:
    """Length quantiles of a bucket histogram (geometric interpolation inside a bucket)."""
    if sum(hist) <= 0:
        return None
    lf = LengthForecast.from_hist(hist)
    return [lf.quantile(p) for p in probs]


@dataclass(frozen=True)
class LengthForecast:
    """Quantile function of response lengths (tokens) from a bucket histogram.

    ``known_fraction < 1`` (cold start): the histogram holds the shortest ``known_fraction`` of
    the responses; above it the lengths follow a lognormal through the histogram's median and
    highest quantile. Build with ``from_hist`` (precomputes the cumulative fractions)."""

    cum: tuple[float, ...]       # cumulative fraction at the upper edge of each non-empty bucket
    buckets: tuple[int, ...]     # their bucket indices
    known_fraction: float = 1.0
    tail: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (median, sigma, z of the median)
    mean: float = 0.0

    @classmethod
    def from_hist(cls, hist: tuple[int, ...], known_fraction: float = 1.0) -> "LengthForecast":
        total = float(sum(hist))
        cum, buckets, acc, mean = [], [], 0.0, 0.0
        for i, c in enumerate(hist):
            if c:
                acc += c
                cum.append(acc / total)
                buckets.append(i)
                lo, hi = bucket_edges(i)
                mean += c / total * (hi - lo) / math.log(hi / lo)  # mean of a log-uniform bucket
        lf = cls(tuple(cum), tuple(buckets), known_fraction)
        if known_fraction >= 1.0:
            return dataclasses.replace(lf, mean=mean)
        top = 1.0 - 0.5 / total
        q1, q2 = lf._known(0.5), lf._known(top)
        z1, z2 = _norm_ppf(0.5 * known_fraction), _norm_ppf(known_fraction * top)
        sigma = max(0.05, (math.log(q2) - math.log(q1)) / max(1e-6, z2 - z1))
        lf = dataclasses.replace(lf, tail=(q1, sigma, z1))
        grid = [lf.quantile((i + 0.5) / 64) for i in range(64)]
        return dataclasses.replace(lf, mean=sum(grid) / len(grid))

    def _known(self, p: float) -> float:
        j = bisect.bisect_left(self.cum, min(max(p, 0.0), 1.0))
        j = min(j, len(self.cum) - 1)
        below = self.cum[j - 1] if j else 0.0
        lo, hi = bucket_edges(self.buckets[j])
        frac = (p - below) / max(1e-12, self.cum[j] - below)
        return lo * (hi / lo) ** min(1.0, max(0.0, frac))

    def quantile(self, p: float) -> float:
        kf = self.known_fraction
        if kf >= 1.0 or p <= kf:
            return self._known(p / kf if kf < 1.0 else p)
        q1, sigma, z1 = self.tail
        return q1 * math.exp(sigma * (_norm_ppf(p) - z1))

    def cdf(self, length: float) -> float:
        """Fraction of responses not longer than ``length``."""
        if self.known_fraction < 1.0:
            lo, hi = 0.0, 1.0
            for _ in range(30):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if self.quantile(mid) <= length else (lo, mid)
            return lo
        b = length_bucket(int(length))
        j = bisect.bisect_left(self.buckets, b)
        below = self.cum[j - 1] if j else 0.0
        if j >= len(self.buckets):
            return 1.0
        if self.buckets[j] != b:
            return below
        lo, hi = bucket_edges(b)
        frac = math.log(max(length, lo) / lo) / math.log(hi / lo)
        return below + (self.cum[j] - below) * min(1.0, frac)


def _norm_ppf(p: float) -> float:
    """Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9)."""
    p = min(max(p, 1e-12), 1 - 1e-12)
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
         1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
         6.680131188771972e+01, -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
         -2.549671035525976e+00, 4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00)
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
               ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        return -_norm_ppf(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
           (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


@dataclass(frozen=True)
class Forecast:
    """Fitted models; build with ``Forecast.fit``."""

    lengths: LengthForecast
    alpha: float            # decode seconds per step, load-independent part
    beta: float             # ... per running request
    max_running: int
    mb_work: float          # actor seconds of one mini-batch at DP 1 (W)
    mb_scaling: float       # s in W / dp ** s
    inf_gpu_s_per_sample: float | None
    switch_s: float
    curve: tuple[float, ...]
    last_iteration_s: float | None
    longest: int = 0
    samples: int = 0        # responses per iteration
    bias: float = 1.0       # learned correction of the rollout forecast
    state_move_s: float = 0.0  # seconds to move the actor's whole state (0 before a growth was seen)
    drain_instances: int = 0   # rollout instances when this iteration's queue drained (0: not yet)

    @classmethod
    def fit(cls, h: History, total: int, finished: int, max_running: int,
            default_switch_s: float) -> "Forecast | None":
        """A forecast, or None while a model lacks data (cold start: no decode or mini-batch
        measured yet, or fewer than a tenth of the responses seen)."""
        if sum(h.lengths) > 0:
            lengths = LengthForecast.from_hist(h.lengths)
        elif finished * 10 >= total and sum(h.current_lengths) > 0:
            lengths = LengthForecast.from_hist(h.current_lengths, known_fraction=finished / total)
        else:
            return None
        line = h.decode.line()
        if line is None or not h.minibatches:
            return None
        work, scaling = _fit_minibatches(h.minibatches)
        samples, busy = h.inference[0] + h.current_inference[0], h.inference[1] + h.current_inference[1]
        inf = busy / samples if samples >= 1 and busy > 0 else None
        switch_s = h.switch_s if h.switch_s is not None else default_switch_s
        return cls(lengths=lengths, alpha=line[0], beta=line[1], max_running=max_running,
                   mb_work=work, mb_scaling=scaling, inf_gpu_s_per_sample=inf, switch_s=switch_s,
                   curve=h.curve, last_iteration_s=h.iteration_s[-1] if h.iteration_s else None,
                   longest=h.longest, bias=h.rollout_bias, state_move_s=h.state_move_s(switch_s) or 0.0,
                   drain_instances=h.drain_instances, samples=total)

    # -- rollout ----------------------------------------------------------------------------
    def step_s(self, running: float) -> float:
        return self.alpha + self.beta * min(max(running, 1.0), self.max_running)

    def length(self, p: float) -> float:
        """Response length at quantile ``p``, capped by the longest response of earlier iterations
        (before one was seen: by the expected longest of the iteration's ``samples``)."""
        if self.longest:
            return min(self.lengths.quantile(p), self.longest)
        return self.lengths.quantile(min(p, 1.0 - 0.5 / max(1, self.samples)))

    def rollout_view(self, total: int, running: int, pending: int) -> "RolloutView":
        """What is left of the rollout (see ``RolloutView``)."""
        return RolloutView(self, total, running, pending)

    def mean_length(self) -> float:
        return self.lengths.mean

    @functools.cached_property
    def survival(self) -> "Survival":
        """``P(L > x)`` of the response lengths, tabulated once per forecast."""
        return Survival.of(self)

    # -- actor and inference ----------------------------------------------------------------
    def minibatch_s(self, dp: int) -> float:
        return self.mb_work / max(1, dp) ** self.mb_scaling

    def switch(self, old_dp: int, new_dp: int) -> float:
        """Seconds until an actor moved from DP ``old_dp`` to ``new_dp`` can train again."""
        return self.switch_s + self.state_move_s * reshard_fraction(old_dp, new_dp)

    def inference_s(self, samples: int, gpus: int) -> float:
        if samples <= 0 or self.inf_gpu_s_per_sample is None:
            return 0.0
        if gpus <= 0:
            return math.inf
        return samples * self.inf_gpu_s_per_sample / gpus

    def inference_keeps_pace(self, samples: int, gpus: int, rollout_s: float,
                             shape: tuple[float, ...] | None = None) -> bool:
        """With ``gpus`` inference GPUs, is inference done by the end of a rollout of
        ``rollout_s`` seconds (plus one switch), if samples arrive as in the last iteration
        (its completion ``curve``, or ``shape``, stretched to ``rollout_s``)?"""
        curve = self.curve if shape is None else shape
        if not self.inf_gpu_s_per_sample or len(curve) < CURVE_POINTS or rollout_s <= 0 or gpus <= 0:
            return False
        rate = gpus / self.inf_gpu_s_per_sample
        if not 0 < rate < math.inf:
            return False
        scale = rollout_s / curve[-1] if curve[-1] > 0 else 1.0
        arrived = [0.0] + [t * scale for t in curve]
        finish = 0.0
        for i in range(CURVE_POINTS):  # tenth i arrives evenly over [arrived[i], arrived[i + 1]]
            finish = max(max(finish, arrived[i]) + samples / CURVE_POINTS / rate, arrived[i + 1])
        return finish <= rollout_s + self.switch_s


@dataclass(frozen=True)
class RolloutView:
    """The outstanding rollout requests, as the forecast sees them.

    Every request decodes one token per step, so the rollout is followed in tokens per request
    (``_TailLoad``). While requests wait, every slot (``k * max_running``) is busy and the queue
    drains once all but ``k * max_running`` of the outstanding requests have finished (on fewer
    instances than run them, the running requests beyond the slots wait again). The requests
    in the slots then (``slots``, or the running ones when the queue drained already: the slots
    at the drain) have tokens left as after ``tau`` tokens of a renewal process per slot, with
    ``tau = (total - slots) * mean / slots``; the tail is as far along as the running count
    says, and ends with its longest request. The ``j`` longest pending requests (the last of ``j``
    dispatched in random order starts at about ``drain * j / (j + 1)``) may end later. The
    result is multiplied by the bias learned from the last iteration (``rollout_bias``).
    """

    fc: Forecast
    total: int
    running: int
    pending: int

    def _top(self, among: int, rank: float) -> float:
        return self.fc.length(1.0 - rank / max(1, among))

    def seconds(self, instances: int) -> float:
        fc = self.fc
        out = self.running + self.pending
        if out <= 0:
            return 0.0
        if instances <= 0:
            return math.inf
        m = fc.max_running
        if not self.pending:  # drained: the running requests are the tail of the slots then
            slots = min(self.total, (fc.drain_instances or instances) * m)
            tail = _TailLoad(fc, instances, max(self.running, slots), self._tau(slots))
            return fc.bias * tail.remaining(self.running)
        slots = min(self.total, instances * m)
        load = min(m, out / instances)
        v_queue = 1.0 / fc.step_s(load)
        # on fewer instances than run them, the running requests beyond their slots wait again
        drain = max(0.0, out - instances * m) * fc.mean_length() / (instances * load * v_queue)
        tail = _TailLoad(fc, instances, min(out, slots), self._tau(slots))
        ends = [drain + tail.remaining(min(out, slots))]
        # the longest pending requests start at random times before the queue drains: among the
        # j longest the last one starts at about drain * j / (j + 1) (order statistics)
        for j in range(1, min(8, self.pending) + 1):
            start, length = drain * j / (j + 1), self._top(self.pending, j - 0.5)
            left = length - (drain - start) * v_queue
            ends.append(start + length / v_queue if left <= 0 else drain + tail.seconds(left))
        return fc.bias * max(ends)

    def _tau(self, slots: int) -> float:
        """Tokens per slot decoded before the queue drains (0 when it never fills the slots)."""
        return max(0, self.total - slots) * self.fc.mean_length() / max(1, slots)


@dataclass(frozen=True)
class Survival:
    """``P(L > x)`` through points ``(length at quantile p, 1 - p)`` (dense towards the longest
    response), linear in between, and its running integral (the mean tokens left beyond x)."""

    xs: tuple[float, ...]
    s: tuple[float, ...]
    cum: tuple[float, ...]

    @classmethod
    def of(cls, fc: Forecast) -> "Survival":
        probs = [i / 50 for i in range(46)] + [1.0 - 0.1 * 2 ** (-j / 3) for j in range(31)] + [1.0]
        pts = sorted({fc.length(p): 1.0 - p for p in probs}.items())
        xs, s = [0.0] + [x for x, _ in pts], [1.0] + [v for _, v in pts]
        s[-1] = 0.0
        cum = [0.0]
        for i in range(1, len(xs)):
            cum.append(cum[-1] + (s[i - 1] + s[i]) / 2 * (xs[i] - xs[i - 1]))
        return cls(tuple(xs), tuple(s), tuple(cum))

    def at(self, x: float) -> float:
        i = bisect.bisect_right(self.xs, x)
        if i >= len(self.xs):
            return 0.0
        x0, x1 = self.xs[i - 1], self.xs[i]
        return self.s[i - 1] + (self.s[i] - self.s[i - 1]) * (x - x0) / max(1e-12, x1 - x0)

    def integral(self, y: float) -> float:
        """Of ``P(L > v)`` over ``[0, y]``."""
        i = bisect.bisect_right(self.xs, y)
        if i >= len(self.xs):
            return self.cum[-1]
        return self.cum[i - 1] + (self.s[i - 1] + self.at(y)) / 2 * (y - self.xs[i - 1])


class _TailLoad:
    """The rollout after its queue drained, in tokens per request: ``population`` requests in
    the slots then, with tokens left as after ``tau`` tokens of a renewal process per slot (fresh
    lengths when ``tau`` is 0). After ``x`` more tokens the requests still running share the
    instances evenly (more than fit take turns); ``seconds(x)`` integrates the decode step over
    that falling load."""

    POINTS = 32

    def __init__(self, fc: Forecast, instances: int, population: float, tau: float) -> None:
        self.fc = fc
        top = fc.length(1.0)
        # uniform in tokens (the tail's last requests need it), and finer where the load falls fast
        low = [(top / 16) ** (i / 8) for i in range(8)]
        self.xs = sorted({0.0, *low, *(top * i / self.POINTS for i in range(1, self.POINTS + 1))})
        sv = fc.survival
        surv = [sv.at(x) for x in self.xs]
        if tau > 0:
            # a slot holds its first request (fresh length beyond tau) or a later one: tokens
            # left after a renewal process ran for tau tokens, the renewal density taken as its
            # limit 1 / mean: P(R > x) ~ P(L > tau + x) + integral_x^(tau + x) P(L > v) dv / mean
            mean = max(1e-9, fc.mean_length())
            raw = [sv.at(tau + x) + (sv.integral(tau + x) - sv.integral(x)) / mean for x in self.xs]
            surv = [r / max(1e-9, raw[0]) for r in raw]
        # requests still running after x tokens, at every grid point
        self.n = [population * sv for sv in surv]
        self.t = [0.0]
        for i in range(1, len(self.xs)):
            n = (self.n[i - 1] + self.n[i]) / 2 / instances  # requests per instance
            # beyond the slots, requests take turns (a token for all takes n / m steps)
            self.t.append(self.t[-1] + (self.xs[i] - self.xs[i - 1])
                          * fc.step_s(min(fc.max_running, max(1.0, n))) * max(1.0, n / fc.max_running))

    def _x_at(self, running: float) -> float:
        """Tokens after which ``running`` requests are still running (the grid interpolated)."""
        for i in range(1, len(self.xs)):
            if self.n[i] < running:
                hi, lo = self.n[i - 1], self.n[i]
                frac = (hi - running) / max(1e-12, hi - lo)
                return self.xs[i - 1] + frac * (self.xs[i] - self.xs[i - 1])
        return self.xs[-1]

    def remaining(self, running: int) -> float:
        """Seconds until the last of ``running`` requests of this tail finishes: the tail is as
        far along as its running count says; the longest ends where half a request is left."""
        now = self._x_at(running) if running < self.n[0] else 0.0
        last = self._x_at(0.5)
        return max(0.0, self.seconds(last) - self.seconds(now))

    def seconds(self, x: float) -> float:
        i = bisect.bisect_left(self.xs, x)
        if i >= len(self.xs):
            return self.t[-1] + (x - self.xs[-1]) * self.fc.step_s(1.0)
        if i == 0:
            return 0.0
        x0, x1 = self.xs[i - 1], self.xs[i]
        return self.t[i - 1] + (self.t[i] - self.t[i - 1]) * (x - x0) / max(1e-12, x1 - x0)


def piecewise_seconds(roll: Callable[[int], float], k0: int, segments: list[tuple[int, float]]) -> float:
    """Rollout end when it runs on ``k0`` instances, then on ``k`` from each segment's time
    (``roll(k)``: the forecast on ``k`` instances): the work left is a fraction of the forecast
    for the instances in force."""
    t, k, left = 0.0, k0, 1.0
    for k_next, at in segments:
        whole = roll(k)
        if whole <= 0 or t + left * whole <= at:
            break
        left -= (at - t) / whole
        t, k = at, k_next
    return t + left * roll(k)


def rollout_bias(h: History, snapshots: list[Tick], rollout_end_s: float,
                 drain_instances: int = 0) -> float | None:
    """Median of actual / forecast remaining rollout seconds over ``snapshots`` of an iteration
    whose rollout ended after ``rollout_end_s`` (the forecast fitted on ``h`` without a bias, on
    the instances the rollout actually had from each snapshot on; ``drain_instances``: those
    when its queue drained); None when it cannot be fitted."""
    ratios = []
    for i, t in enumerate(snapshots):
        fc = Forecast.fit(h, t.samples, t.finished, t.max_running, 0.0)
        if fc is None or not t.instances:
            continue
        drained = t.finished + t.running >= t.samples
        fc = dataclasses.replace(fc, bias=1.0, drain_instances=drain_instances if drained else 0)
        pending = t.samples - t.finished - t.running
        view = fc.rollout_view(t.samples, t.running, pending)
        segments, k = [], t.instances
        for later in snapshots[i + 1:]:
            if later.instances != k and later.instances:
                segments.append((later.instances, later.elapsed_s - t.elapsed_s))
                k = later.instances
        predicted = piecewise_seconds(view.seconds, t.instances, segments)
        if predicted > 0:
            ratios.append((rollout_end_s - t.elapsed_s) / predicted)
    if not ratios:
        return None
    ratios.sort()
    return min(4.0, max(0.25, ratios[len(ratios) // 2]))


def _fit_minibatches(obs: tuple[tuple[int, float, int], ...]) -> tuple[float, float]:
    """``(W, s)`` with ``seconds = W * mean tokens / dp ** s`` (log-linear least squares over
    DP sizes of the seconds per token, scaled to the mean mini-batch's tokens)."""
    by_dp: dict[int, list[float]] = {}
    tokens = [t for _, _, t in obs if t > 0]
    mean_tokens = sum(tokens) / len(tokens) if tokens else 1.0
    for dp, sec, tok in obs:
        if dp > 0 and sec > 0:
            by_dp.setdefault(dp, []).append(sec / tok * mean_tokens if tok > 0 else sec)
    pts = [(math.log(dp), math.log(sum(v) / len(v))) for dp, v in by_dp.items()]
    if len(pts) == 1:
        x, y = pts[0]
        return math.exp(y + x), 1.0
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / var
    s = min(1.0, max(0.3, -slope))
    return math.exp(my + s * mx), s


__all__ = ["BUCKETS_PER_DOUBLING", "Forecast", "LengthForecast", "piecewise_seconds", "quantiles"]
