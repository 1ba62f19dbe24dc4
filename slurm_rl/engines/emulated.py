"""Emulated compute: a calibrated cost model that replaces GPU work by sleeps.

The cost model is the simulator's (:class:`slurm_rl.scheduler.cost_model.CostModel`): a component
holding ``n`` GPUs processes ``T`` tokens in ``T * s_per_token / n**scaling`` seconds, so a rank
doing its share ``t`` of that work sleeps ``t * s_per_token * n**(1 - scaling)``.

Rollout decodes per request, as the simulator does: an instance of ``g`` GPUs runs up to
``m = max_running_requests`` requests at once, and one decode step (one token for each of the ``b``
running requests) takes ``rollout_s_per_token * m / g**scaling * (f + (1 - f) * b / m)`` seconds
with ``f = decode_fixed_fraction``. :class:`DecodeBatch` advances such an instance in virtual time
driven by the wall clock, so bookkeeping between decode steps costs no emulated GPU time.

No torch import: emulated ranks stay a few tens of MB.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

from slurm_rl.engines.errors import EngineStateError
from slurm_rl.scheduler.cost_model import CostModel

__all__ = ["DecodeBatch", "emulate"]


def emulate(seconds: float) -> float:
    """Stand in for GPU work; returns the seconds slept."""
    if seconds > 0:
        time.sleep(seconds)
    return max(0.0, seconds)


@dataclass
class DecodeBatch:
    """One emulated rollout instance decoding up to ``max_running`` requests at once.

    ``counter`` counts decode steps since the start; a request admitted at ``counter = c`` with
    ``r`` tokens left finishes at ``c + r``. :meth:`advance` moves virtual time to ``now``
    piecewise (the step time changes whenever a request finishes) and returns what finished.
    """

    cost: CostModel
    instance_gpus: int
    max_running: int
    t: float = 0.0
    counter: float = 0.0
    running: dict[int, tuple[float, int]] = field(default_factory=dict)  # id -> (finish counter, length)
    _heap: list[tuple[float, int]] = field(default_factory=list)

    @property
    def free_slots(self) -> int:
        return max(0, self.max_running - len(self.running))

    def step_seconds(self) -> float | None:
        """Seconds per decode step now (None while nothing runs)."""
        return self._step_s() if self.running else None

    def _step_s(self) -> float:
        return self.cost.decode_step_seconds(self.instance_gpus, self.max_running, len(self.running))

    def admit(self, request_id: int, generated: int, length: int, now: float) -> None:
        """Start decoding a request of ``length`` tokens of which ``generated`` exist already."""
        if len(self.running) >= self.max_running:
            raise EngineStateError(f"decode batch full ({self.max_running} running requests)")
        if not self.running:
            self.t = now
        finish = self.counter + max(1e-9, float(length - generated))
        self.running[request_id] = (finish, length)
        heapq.heappush(self._heap, (finish, request_id))

    def advance(self, now: float) -> list[int]:
        """Decode up to ``now``; the ids of requests that finished, in finishing order."""
        done: list[int] = []
        while self.running and self.t < now:
            step = self._step_s()
            head = self._heap[0][0]
            reach = self.t + (head - self.counter) * step
            if reach > now:
                self.counter += (now - self.t) / step
                self.t = now
                break
            self.t, self.counter = reach, head
            while self._heap and self._heap[0][0] <= self.counter + 1e-9:
                _, rid = heapq.heappop(self._heap)
                del self.running[rid]
                done.append(rid)
        if not self.running:
            self.t = max(self.t, now)
        return done

    def next_finish_at(self) -> float | None:
        """Wall time at which the next request finishes if nothing else changes."""
        if not self.running:
            return None
        return self.t + (self._heap[0][0] - self.counter) * self._step_s()

    def generated(self, request_id: int) -> int:
        """Tokens generated so far for a running request."""
        finish, length = self.running[request_id]
        return max(0, min(length - 1, int(length - (finish - self.counter))))

    def evict_all(self) -> dict[int, int]:
        """Stop every running request; returns id -> tokens generated so far."""
        out = {rid: self.generated(rid) for rid in self.running}
        self.running.clear()
        self._heap.clear()
        return out
