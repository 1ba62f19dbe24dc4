"""The ``plan`` policy's forecast: remaining rollout, inference and actor time from ``History``.

Everything is fitted from the run's own measurements (``slurm_rl.scheduler.history``); nothing
here is a per-workload constant. Pure functions, a few hundred float operations per call.

* Response lengths: the quantile function of the finished responses of earlier iterations
  (cold start: this iteration's finished responses, the unfinished upper part extrapolated
  lognormally through the median and the highest quantile seen).
* Decode: ``step_s(b) = alpha + beta * b`` per request and step on an instance running ``b``
  requests; with one load seen so far ``beta = 0`` (no gain from spreading is assumed).
* Rollout (``RolloutView``): running requests are the survivors of those dispatched, pending ones a
  random sample; the rollout ends after the bulk at full-load throughput, or with the longest
  running / pending requests (the latter dispatched in random order before the queue drained),
  whichever is later, times the bias learned from the last iteration (``rollout_bias``).
* Actor: mini-batch seconds ``W / dp ** s`` (``s`` fitted once two DP sizes were seen, else 1);
  a switch from DP ``a`` to ``b``: the latency of a switch plus the seconds to move the whole
  state times the fraction that moves (``cost_model.reshard_fraction``), both as seen;
  inference: GPU-seconds per sample (busy time over samples scored).
"""

from __future__ import annotations

import bisect
import dataclasses
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
    bias: float = 1.0       # learned correction of the rollout forecast
    state_move_s: float = 0.0  # seconds to move the actor's whole state (0 before a growth was seen)

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
                   longest=h.longest, bias=h.rollout_bias, state_move_s=h.state_move_s(switch_s) or 0.0)

    # -- rollout ----------------------------------------------------------------------------
    def step_s(self, running: float) -> float:
        return self.alpha + self.beta * min(max(running, 1.0), self.max_running)

    def length(self, p: float) -> float:
        """Response length at quantile ``p`` (capped by the longest response seen)."""
        q = self.lengths.quantile(p)
        return min(q, self.longest) if self.longest else q

    def rollout_view(self, total: int, running: int, pending: int, finished: int,
                     elapsed_s: float) -> "RolloutView":
        """What is left of the rollout (see ``RolloutView``)."""
        return RolloutView(self, total, running, pending, finished, elapsed_s)

    def mean_length(self) -> float:
        return self.lengths.mean

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

    Running requests are the longest of those dispatched so far (the others finished), less
    the tokens decoded so far (the length at the finished quantile); pending requests
    are a random sample of the length distribution (dispatch order is blind to length).
    ``seconds(k)``: with ``k`` instances the bulk ends when the outstanding tokens are decoded
    at full-load throughput (``B``); the queue drains after ``D`` (pending tokens at that
    throughput). The longest running request and the ``j`` longest pending ones (the last of
    ``j`` dispatched in random order starts at about ``D * j / (j + 1)``) decode at full-load
    speed until ``B``, then at the speed of an instance shared by the requests still running
    after ``B`` (half of them on average). The rollout ends with the latest of these (or ``B``).
    """

    fc: Forecast
    total: int
    running: int
    pending: int
    finished: int
    elapsed_s: float

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
        v_full = 1.0 / fc.step_s(m)
        dispatched = self.running + self.finished
        # a running request has outlived the finished ones: about as long as the length at the
        # finished quantile of the dispatched requests (at least the elapsed time at full speed)
        decoded = max(self.elapsed_s * v_full,
                      fc.length(self.finished / dispatched) if self.finished else 0.0)
        mean = fc.mean_length()
        run_left = 0.0
        longest_run = 0.0
        if self.running:
            lo = 1.0 - self.running / max(1, dispatched)
            n_cls = min(16, self.running)
            for j in range(n_cls):
                p = lo + (j + 0.5) * (1.0 - lo) / n_cls
                run_left += self.running / n_cls * max(1.0, fc.length(p) - decoded)
            longest_run = max(1.0, self._top(dispatched, 0.5) - decoded)
        pend_tokens = self.pending * mean
        throughput = instances * min(m, out / instances) / fc.step_s(min(m, out / instances))
        bulk = (run_left + pend_tokens) / throughput
        drain = pend_tokens / throughput
        # requests still running after the bulk share the instances
        threshold = bulk * v_full
        after = (self.running * (1.0 - _cdf(fc, threshold + decoded, lo_p=1.0 - self.running / max(1, dispatched)))
                 + self.pending * (1.0 - _cdf(fc, threshold, lo_p=0.0)))
        # the tail's load falls from after / k to one request: its mean
        v_tail = 1.0 / fc.step_s(max(1.0, (min(m, after / instances) + 1.0) / 2))

        def end(start: float, length: float) -> float:
            if length <= 0:
                return start
            if start >= bulk:
                return start + length / v_tail
            done = (bulk - start) * min(v_full, 1.0 / fc.step_s(min(m, out / instances)))
            if done >= length:
                return start + length / v_full
            return bulk + (length - done) / v_tail

        # the longest pending requests start at random times before the queue drains: among the
        # j longest the last one starts at about drain * j / (j + 1) (order statistics)
        pend_end = 0.0
        if self.pending:
            for j in range(1, min(8, self.pending) + 1):
                pend_end = max(pend_end, end(drain * j / (j + 1), self._top(self.pending, j - 0.5)))
        return fc.bias * max(bulk, end(0.0, longest_run), pend_end)


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


def rollout_bias(h: History, snapshots: list[Tick], rollout_end_s: float) -> float | None:
    """Median of actual / forecast remaining rollout seconds over ``snapshots`` of an iteration
    whose rollout ended after ``rollout_end_s`` (the forecast fitted on ``h`` without a bias, on
    the instances the rollout actually had from each snapshot on); None when it cannot be fitted."""
    ratios = []
    for i, t in enumerate(snapshots):
        fc = Forecast.fit(h, t.samples, t.finished, t.max_running, 0.0)
        if fc is None or not t.instances:
            continue
        fc = dataclasses.replace(fc, bias=1.0)
        pending = t.samples - t.finished - t.running
        view = fc.rollout_view(t.samples, t.running, pending, t.finished, t.elapsed_s)
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


def _cdf(fc: Forecast, length: float, lo_p: float) -> float:
    """Fraction of the requests above quantile ``lo_p`` that are shorter than ``length``."""
    if fc.longest and length >= fc.longest:
        return 1.0
    p = fc.lengths.cdf(length)
    return max(0.0, p - lo_p) / max(1e-12, 1.0 - lo_p)


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
