"""Asynchronous RL with partial rollout, simulated: the rollout decodes across the gates.

With ``rollout.partial_rollout`` the weights of version ``v + 1`` land in the rollout's engines while they decode
(:class:`slurm_rl.worker.protocol._Landing`), so a rollout rank never waits at a gate for its requests to finish:
its requests carry over into the next iteration and decode on with the new weights. The gate stops being a
barrier for the rollout, and the long tail of one iteration's responses overlaps the training of the next.

The model, on a static disaggregated placement (the actor's, the rollout's and the inference's GPUs fixed):

- every iteration's requests wait in one queue, in iteration and sample order; a rollout instance takes the next
  one as a slot frees (continuous batching across iterations), but a request of iteration ``j`` only once the
  rollout holds version ``j - lead`` (``lead``: ``algorithm.max_staleness``; the first iteration starts with
  version 0 and draws iterations ``0 .. lead``), so no sample is trained more than ``lead`` versions after the
  version that drew its first token;
- a group goes to the inference queue of its iteration once its last response is done; the inference ranks
  score iteration ``j`` from its gate on (they hold the iteration's weights from then), ``train.global_batch_size``
  samples at a time;
- the actor trains iteration ``j``'s mini-batches from its scored groups as they come, after the iteration before;
  once it has trained the last one, version ``j + 1`` exists: the gate of ``j + 1`` (``iteration_overhead_s``
  later), the weights land in the rollout and the next iteration's requests may start;
- where the actor shares ranks with the inference (verl's fully async layout: reference scoring on the Trainer's
  GPUs), those ranks time-slice them as the live ones do, one thing at a time: where the actor's state parks
  between phases (``actor.offload_*``) the iteration is scored whole, then trained (the first mini-batch pays
  ``phase_switch_s``, the state coming back); else scoring and training interleave, a ready mini-batch first,
  as verl's Trainer scores and trains each batch it takes.

Decode speeds, lengths (the same draws as :mod:`~slurm_rl.scheduler.simulator`'s for the seed) and costs are the
cost model's (:mod:`~slurm_rl.scheduler.cost_model`). A request's staleness is its iteration less the version
that drew its first token.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from dataclasses import dataclass, field

from slurm_rl.scheduler.async_pipeline import AsyncIteration, AsyncReport
from slurm_rl.scheduler.placement_ops import rollout_instances
from slurm_rl.scheduler.simulator import SimSetup

Request = tuple[int, int]  # (iteration, index of the sample in it)


@dataclass
class _Instance:
    """A rollout instance: ``counter`` counts the tokens each running request has decoded since it started."""

    gpus: int
    running: dict[Request, float] = field(default_factory=dict)  # request -> the counter at its finish
    heap: list[tuple[float, Request]] = field(default_factory=list)
    counter: float = 0.0
    counter_t: float = 0.0
    version: int = 0  # invalidates scheduled finish events


class _Stream:
    """One simulated run (see the module docstring); :meth:`run` once."""

    def __init__(self, setup: SimSetup, lead: int) -> None:
        s = self.s = setup
        self.lead = lead
        self.n, self.g, self.gbs = s.batch.samples_per_iteration, s.group_size, s.batch.global_batch_size
        self.iterations = s.num_iterations
        rng = random.Random(s.seed)  # the synchronous simulation's draws, iteration by iteration
        self.lengths = [s.lengths.sample(rng, self.n) for _ in range(self.iterations)]
        placement = s.initial
        self.actor_gpus, self.inference_gpus = len(placement["actor"]), len(placement["inference"])
        self.time_sliced = bool(set(placement["actor"]) & set(placement["inference"]))
        self.interleaved = self.time_sliced and not s.offloads
        self.instances = [_Instance(len(ranks)) for ranks in
                          rollout_instances(placement["rollout"], s.policy_cfg.rollout_ranks_per_instance)]
        self.cap = s.policy_cfg.max_running_requests
        self.pending: deque[Request] = deque((j, i) for j in range(self.iterations) for i in range(self.n))
        self.group_left = [[self.g] * (self.n // self.g) for _ in range(self.iterations)]
        self.scoring: list[deque[int]] = [deque() for _ in range(self.iterations)]  # samples waiting to be scored
        self.scored: list[deque[int]] = [deque() for _ in range(self.iterations)]  # samples the actor may take
        self.events: list[tuple[float, int, str, int, int]] = []
        self.seq = itertools.count()
        self.t = 0.0
        self.rollout_version = 0  # the weights the rollout holds
        self.actor_iteration = 0  # the iteration the actor trains (its gate has passed)
        self.minibatch = 0
        self.actor_busy = False
        self.inference_batch: tuple[int, list[int]] | None = None
        self.gate = [0.0] + [0.0] * self.iterations
        self.first_start = [None] * self.iterations
        self.last_end = [0.0] * self.iterations
        self.start_version: dict[Request, int] = {}
        self.spans: list[tuple[str, int, float, float]] = []  # (scoring or training, iteration, start, end)
        self.running_s = 0.0  # request-seconds the rollout's slots ran

    def _tokens(self, j: int, i: int) -> int:
        return self.s.prompt_len + self.lengths[j][i]

    def _rate(self, inst: _Instance) -> float:
        return self.s.cost.decode_tokens_per_s(inst.gpus, self.cap, len(inst.running))

    def _sync(self, inst: _Instance) -> None:
        if inst.running and self.t > inst.counter_t:
            inst.counter += (self.t - inst.counter_t) * self._rate(inst)
        inst.counter_t = self.t

    def _reschedule(self, uid: int) -> None:
        inst = self.instances[uid]
        inst.version += 1
        if inst.heap:
            left = max(0.0, inst.heap[0][0] - inst.counter)
            heapq.heappush(self.events, (self.t + left / self._rate(inst), next(self.seq), "decode", uid, inst.version))

    def _dispatch(self) -> None:
        """Start the queued requests the rollout's version allows on the least loaded instances."""
        touched: set[int] = set()
        loads = [(len(inst.running), uid) for uid, inst in enumerate(self.instances) if len(inst.running) < self.cap]
        heapq.heapify(loads)
        while self.pending and loads and self.pending[0][0] <= self.rollout_version + self.lead:
            load, uid = heapq.heappop(loads)
            inst = self.instances[uid]
            if uid not in touched:
                self._sync(inst)
                touched.add(uid)
            req = self.pending.popleft()
            j, i = req
            self.start_version[req] = self.rollout_version
            if self.first_start[j] is None:
                self.first_start[j] = self.t
            finish = inst.counter + self.lengths[j][i]
            inst.running[req] = finish
            heapq.heappush(inst.heap, (finish, req))
            if load + 1 < self.cap:
                heapq.heappush(loads, (load + 1, uid))
        for uid in touched:
            self._reschedule(uid)

    def _decoded(self, uid: int, version: int) -> None:
        inst = self.instances[uid]
        if inst.version != version:
            return
        self._sync(inst)
        inst.counter = max(inst.counter, inst.heap[0][0])
        while inst.heap and inst.heap[0][0] <= inst.counter + 1e-6:
            _, (j, i) = heapq.heappop(inst.heap)
            del inst.running[j, i]
            self.last_end[j] = self.t
            group = i // self.g
            self.group_left[j][group] -= 1
            if not self.group_left[j][group]:
                members = range(group * self.g, (group + 1) * self.g)
                (self.scoring[j] if self.inference_gpus else self.scored[j]).extend(members)
        self._reschedule(uid)
        self._dispatch()

    def _start_stages(self) -> None:
        j = self.actor_iteration
        if j >= self.iterations or self.t < self.gate[j]:  # the iteration's scorers and actor start at its gate
            return
        cost = self.s.cost
        ready = len(self.scored[j]) >= self.gbs
        shared_busy = self.interleaved and (self.actor_busy or ready)  # the shared ranks train first
        if self.inference_batch is None and self.scoring[j] and not shared_busy:
            take = [self.scoring[j].popleft() for _ in range(min(self.gbs, len(self.scoring[j])))]
            self.inference_batch = (j, take)
            seconds = cost.seconds("inference", sum(self._tokens(j, i) for i in take), self.inference_gpus)
            self.spans.append(("scoring", j, self.t, self.t + seconds))
            heapq.heappush(self.events, (self.t + seconds, next(self.seq), "scored", 0, 0))
        whole = not self.time_sliced or self.interleaved or self.minibatch > 0 or len(self.scored[j]) == self.n
        scoring = self.interleaved and self.inference_batch is not None
        if not self.actor_busy and ready and whole and not scoring:
            take = [self.scored[j].popleft() for _ in range(self.gbs)]
            self.actor_busy = True
            seconds = cost.seconds("actor", sum(self._tokens(j, i) for i in take), self.actor_gpus)
            if self.time_sliced and self.minibatch == 0:
                seconds += self.s.phase_switch_s
            self.spans.append(("training", j, self.t, self.t + seconds))
            heapq.heappush(self.events, (self.t + seconds, next(self.seq), "trained", 0, 0))

    def _trained(self) -> None:
        self.actor_busy = False
        self.minibatch += 1
        if self.minibatch * self.gbs < self.n:
            return
        self.minibatch = 0
        self.actor_iteration += 1
        j = self.actor_iteration
        self.gate[j] = self.t + self.s.iteration_overhead_s
        heapq.heappush(self.events, (self.gate[j], next(self.seq), "gate", j, 0))

    def run(self) -> AsyncReport:
        self._dispatch()
        while self.actor_iteration < self.iterations:
            t, _, kind, key, version = heapq.heappop(self.events)
            self.running_s += (t - self.t) * sum(len(inst.running) for inst in self.instances)
            self.t = t
            if kind == "decode":
                self._decoded(key, version)
            elif kind == "scored":
                assert self.inference_batch is not None
                j, rows = self.inference_batch
                self.scored[j].extend(rows)
                self.inference_batch = None
            elif kind == "trained":
                self._trained()
            elif kind == "gate":  # the new weights land in the rollout: the next iteration's requests may start
                self.rollout_version = key
                self._dispatch()
            self._start_stages()
        out = []
        for j in range(self.iterations):
            versions = [self.start_version[j, i] for i in range(self.n)]
            out.append(AsyncIteration(j, float(self.first_start[j] or 0.0), self.last_end[j], self.gate[j + 1],
                                      min(versions), j - min(versions)))
        slots = self.cap * len(self.instances) * self.t
        return AsyncReport(self.lead, self.gate[self.iterations], 0.0, True, {}, out,
                           rollout_occupancy=self.running_s / slots if slots else None, spans=self.spans)


def stream(setup: SimSetup, lead: int) -> AsyncReport:
    """``setup`` (static, disaggregated) run asynchronously with partial rollout, up to ``lead`` versions ahead
    (module docstring)."""
    if lead < 1:
        raise ValueError(f"lead {lead}: partial rollout runs at least one version ahead")
    return _Stream(setup, lead).run()
