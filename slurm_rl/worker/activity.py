"""Record what a rank computes, and when, around any :class:`~slurm_rl.worker.compute.Compute`.

:class:`RecordingCompute` forwards every call to the compute it wraps and appends one activity
span per unit of work (``control/activity/rank-NNNN.jsonl``): a rollout engine's busy stretch
(from the first admitted request while it was empty to the moment it holds none), a reference
scoring, a trained mini-batch, a reshard, a weight sync. The cost model returns the time at which
its result is ready (possibly in the future); that time ends the span. The first role change also
names the engines being built in the rank's progress file (the live view shows it).

With the cost model a follower may pick a mini-batch up after its stamped end (``ready_at``): the
work happened in virtual time, so the span is ``[ready_at - predicted seconds, ready_at]`` and the
reshard it paid for (recorded by the cost model without waiting) is placed just before it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from slurm_rl.control.activity import announce_phase, append_span
from slurm_rl.control.epochs import Epoch
from slurm_rl.control.paths import RunPaths
from slurm_rl.data.schemas import count_tokens
from slurm_rl.worker.compute import Compute, Decoder


class RecordingDecoder:
    """A :class:`Decoder` whose busy stretches (held > 0) become ``rollout`` spans."""

    def __init__(self, inner: Decoder, owner: "RecordingCompute", k: int) -> None:
        self.inner, self.owner, self.k = inner, owner, k
        self.busy_since: float | None = None

    def free_slots(self) -> int:
        return self.inner.free_slots()

    def held(self) -> int:
        return self.inner.held()

    def next_event_at(self) -> float | None:
        return self.inner.next_event_at()

    def step_seconds(self) -> float | None:
        return self.inner.step_seconds()

    def _settle(self, now: float) -> None:
        held = self.inner.held()
        if held and self.busy_since is None:
            self.busy_since = now
        elif not held and self.busy_since is not None:
            self.owner.span("rollout", self.busy_since, now, iteration=self.k)
            self.busy_since = None

    def admit(self, requests: pa.Table, now: float) -> None:
        self.inner.admit(requests, now)
        self._settle(now)

    def advance(self, now: float) -> pa.Table | None:
        out = self.inner.advance(now)
        self._settle(now)
        return out

    def evict(self, now: float, epoch: int) -> tuple[pa.Table | None, pa.Table | None]:
        out = self.inner.evict(now, epoch)
        self._settle(now)
        return out

    def land(self, version: int, now: float) -> None:
        self.inner.land(version, now)

    @property
    def lands_between_tokens(self) -> bool:
        return self.inner.lands_between_tokens


class RecordingCompute:
    """Forward to ``inner``; record spans of work for inspection (see the module docstring)."""

    def __init__(self, inner: Compute, paths: RunPaths, rank: int, host: str, builds_engines: bool = True) -> None:
        self.inner, self.paths, self.rank, self.host = inner, paths, rank, host
        self.builds_engines = builds_engines  # the cost model builds nothing: its phase says so
        self._first_roles = True
        self._pending_reshard: tuple[int, float, float] | None = None  # (epoch, seconds, called at)

    def span(self, kind: str, start: float, end: float, **extra: Any) -> None:
        append_span(self.paths, self.rank, kind, start, end, **extra)

    def __getattr__(self, name: str) -> Any:  # park, unpark, requests, close, ... unchanged
        return getattr(self.inner, name)

    def on_roles(self, old: Epoch | None, new: Epoch) -> dict[str, Any]:
        if self._first_roles:
            self._first_roles = False
            roles = ", ".join(new.role_of(self.rank)) or "no role"
            what = "building engines" if self.builds_engines else "taking its first roles"
            announce_phase(self.paths, self.rank, self.host, f"{what} ({roles})")
        return self.inner.on_roles(old, new)

    def decoder(self, k: int, landing: Callable[[], None] | None = None) -> Decoder:
        return RecordingDecoder(self.inner.decoder(k, landing), self, k)

    def score(self, k: int, rollouts: pa.Table, now: float, share_ranks: int) -> tuple[pa.Table, float]:
        table, ready = self.inner.score(k, rollouts, now, share_ranks)
        self.span("inference", now, max(ready, time.time()), iteration=k)
        return table, ready

    def train(self, k: int, index: int, batch: pa.Table, ranks: list[int], ready_at: float | None
              ) -> tuple[float, dict[str, Any]]:
        start = time.time()
        ready, stats = self.inner.train(k, index, batch, ranks, ready_at)
        seconds = None
        if ready_at is not None:  # the cost model: the mini-batch ran (virtually) until its stamp
            tokens = count_tokens(batch, "response_ids") + count_tokens(batch, "prompt_ids")
            seconds = self.inner.predict_train_seconds(tokens, ranks, ranks)
        if seconds is not None and ready_at is not None:
            begin, end = ready_at - seconds, ready_at
        else:
            begin, end = start, max(ready, time.time())
        if self._pending_reshard is not None and seconds is not None:  # the reshard it paid for, just before it
            epoch, reshard_s, _ = self._pending_reshard
            self._pending_reshard = None
            self.span("reshard", begin - reshard_s, begin, epoch=epoch)
        self._flush_reshard()
        self.span("actor", begin, end, iteration=k, minibatch=index)
        return ready, stats

    def reshard(self, old: list[int], new: list[int], epoch: int, old_tp: int = 1, new_tp: int = 1
                ) -> dict[str, Any]:
        self._flush_reshard()
        start = time.time()
        figures = self.inner.reshard(old, new, epoch, old_tp=old_tp, new_tp=new_tp)
        seconds = float(figures.get("seconds") or 0.0)
        if time.time() - start >= 0.5 * seconds:  # it took the time: record it as it happened
            self.span("reshard", start, time.time(), epoch=epoch)
        else:  # the cost model: paid by the next mini-batch, recorded with it (train)
            self._pending_reshard = (epoch, seconds, start)
        return figures

    def _flush_reshard(self) -> None:
        if self._pending_reshard is not None:
            epoch, seconds, called = self._pending_reshard
            self._pending_reshard = None
            self.span("reshard", called, called + seconds, epoch=epoch)

    def sync_weights(self, k: int, src: int, ranks: list[int], gather: list[int] | None = None,
                     in_place: bool = False, sharded: list[list[int]] | None = None) -> dict[str, Any]:
        start = time.time()
        figures = self.inner.sync_weights(k, src, ranks, gather, in_place=in_place, sharded=sharded)
        self.span("sync", start, time.time(), iteration=k,
                  **({"bytes": int(figures.get("bytes") or 0)} if sharded else {}))
        return figures

    def land_weights(self, version: int, src: int, ranks: list[int], gather: list[int]) -> dict[str, Any]:
        start = time.time()
        figures = self.inner.land_weights(version, src, ranks, gather)
        self.span("sync", start, time.time(), iteration=version - 1, mid_generation=True)
        return figures

    def switch_phase(self, phase: str) -> dict[str, Any]:
        start = time.time()
        figures = self.inner.switch_phase(phase)
        if figures.get("bytes"):
            peak = {"peak_gpu_bytes": int(figures["peak_gpu_bytes"])} if "peak_gpu_bytes" in figures else {}
            self.span("offload", start, time.time(), phase=phase, bytes=int(figures["bytes"]), **peak)
        return figures

    def sync_critic(self, k: int, src: int, ranks: list[int], gather: list[int]) -> dict[str, Any]:
        start = time.time()
        figures = self.inner.sync_critic(k, src, ranks, gather)
        self.span("sync", start, time.time(), iteration=k)
        return figures

    def train_critic(self, k: int, index: int, batch: pa.Table, ranks: list[int]) -> tuple[float, dict[str, Any]]:
        start = time.time()
        ready, stats = self.inner.train_critic(k, index, batch, ranks)
        self.span("critic", start, max(ready, time.time()), iteration=k, minibatch=index)
        return ready, stats

    def save_state(self, directory: Path, iteration: int) -> None:
        start = time.time()
        self.inner.save_state(directory, iteration)
        self.span("checkpoint", start, time.time())

    def close(self, finished: bool = True) -> None:
        self._flush_reshard()
        self.inner.close(finished)
