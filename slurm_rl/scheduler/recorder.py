"""Folds a run's observations (``Tick``) into its ``History`` (``scheduler.history``).

Above both ``history`` (the values) and ``forecast`` (which reads them): closing an iteration
fits the rollout bias with the forecast (``forecast.rollout_bias``).
"""

from __future__ import annotations

from dataclasses import replace

from slurm_rl.scheduler.forecast import rollout_bias
from slurm_rl.scheduler.history import (
    CURVE_POINTS,
    KEEP,
    SNAPSHOT_EVERY_S,
    History,
    Tick,
    add_hist,
)


class HistoryRecorder:
    """Folds ``Tick`` observations into a ``History`` (one per run; not shared)."""

    def __init__(self, history: History | None = None, first_iteration: int = 0) -> None:
        """A recorder going on from ``history`` (a resumed run's), taking ticks of ``first_iteration`` on: the
        iterations before it were folded in by the incarnation that wrote ``history``, and the ranks'
        progress files may still report them when the resumed run starts."""
        self.history = History() if history is None else history
        self._last: Tick | None = None
        self._curve: list[float] = []
        self._curve_work: list[float] = []
        self._work = 0.0  # rollout instance-seconds of the current iteration so far
        self._drain_instances: int | None = None  # rollout instances when its queue drained
        self._closed = first_iteration - 1  # iterations up to this one are folded in; later ticks of them are ignored
        self._snapshots: list[Tick] = []  # rollout states of the current iteration
        self._rollout_end: float | None = None

    def observe(self, tick: Tick) -> History:
        """Record one tick; the updated ``History``."""
        h, last = self.history, self._last
        if tick.iteration <= self._closed:
            return h
        if last is not None and tick.iteration != last.iteration:
            h = self._close(h, last)
            last = None
        dt = 0.0 if last is None else max(0.0, tick.elapsed_s - last.elapsed_s)
        if last is not None and last.finished < last.samples:
            # once the queue drained, the tail's pace is set by its longest requests, not by the
            # instances left: it is counted on the instances there were at the drain
            if self._drain_instances is None and last.finished + last.running >= last.samples:
                self._drain_instances = last.instances
            self._work += (last.instances if self._drain_instances is None else self._drain_instances) * dt
        decode = h.decode
        for running, step_s in tick.decode:
            decode = decode.add(running, step_s, dt if dt > 0 else 1e-3)
        minibatches = h.minibatches + ((tick.minibatch,) if tick.minibatch else ())
        grew = tick.switch_s is not None and tick.switch_fraction > 0
        switches = h.switches + ((tick.switch_s,) if tick.switch_s is not None and not grew else ())
        reshards = h.reshards + (((tick.switch_fraction, tick.switch_s),) if grew else ())
        while len(self._curve) < CURVE_POINTS and tick.groups_ready * CURVE_POINTS >= (len(self._curve) + 1) * tick.samples:
            self._curve.append(tick.elapsed_s)
            self._curve_work.append(self._work)
        if tick.finished >= tick.samples and self._rollout_end is None:
            self._rollout_end = tick.elapsed_s
        if (tick.finished < tick.samples and tick.instances
                and (not self._snapshots or tick.elapsed_s >= self._snapshots[-1].elapsed_s + SNAPSHOT_EVERY_S)):
            self._snapshots.append(tick)
            if len(self._snapshots) > 2 * KEEP:
                self._snapshots = self._snapshots[::2]
        self.history = replace(h, current_lengths=tick.lengths, decode=decode,
                               drain_instances=self._drain_instances or 0,
                               current_inference=(float(tick.inference_done), tick.inference_busy_gpu_s),
                               minibatches=minibatches[-KEEP:], switches=switches[-KEEP:],
                               reshards=reshards[-KEEP:])
        self._last = tick
        return self.history

    def end_iteration(self, iteration_s: float) -> History:
        """The current iteration ended after ``iteration_s`` seconds (collocated where its ticks said so)."""
        time_sliced = self._last is not None and self._last.time_sliced
        if self._last is not None:
            self.history = self._close(self.history, self._last)
            self._last = None
        h = self.history
        self.history = replace(h, iteration_s=(h.iteration_s + (iteration_s,))[-KEEP:],
                               time_sliced=(h.time_sliced + (time_sliced,))[-KEEP:])
        return self.history

    def _close(self, h: History, last: Tick) -> History:
        full = len(self._curve) == CURVE_POINTS
        curve = tuple(self._curve) if full else h.curve
        curve_work = tuple(self._curve_work) if full else h.curve_work
        self._closed = max(self._closed, last.iteration)
        inference = (h.inference[0] + last.inference_done, h.inference[1] + last.inference_busy_gpu_s)
        if last.time_sliced and h.inference[0] > 0:  # inference on every rank at once is not the pace of a
            inference = h.inference  # disaggregated iteration's: counted only while none measured that
        h = replace(h, iterations_done=h.iterations_done + 1, longest=max(h.longest, last.longest),
                    inference=inference, current_inference=(0.0, 0.0),
                    lengths=add_hist(h.lengths, last.lengths), current_lengths=(), curve=curve,
                    curve_work=curve_work, drain_instances=0, rollout_end_s=self._rollout_end or 0.0)
        if self._rollout_end is not None:
            bias = rollout_bias(h, self._snapshots, self._rollout_end, self._drain_instances or 0)
            h = replace(h, rollout_bias=bias or h.rollout_bias)
        self._curve, self._curve_work, self._snapshots, self._rollout_end = [], [], [], None
        self._work, self._drain_instances = 0.0, None
        return h
