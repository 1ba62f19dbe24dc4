"""Discrete-event model of one allocation running rollout -> inference -> actor.

The pipeline is fine-grained: a GRPO group goes to inference as soon as its last response is
done, and the actor trains a mini-batch as soon as ``global_batch_size`` samples came out of
inference. Costs follow ``cost_model.CostModel``. After every change of progress (at most once
per ``tick_s`` simulated seconds, and always at stage boundaries) the simulator builds a
``SchedState`` and calls the same policy function the live coordinator calls, then applies the
decision: ranks that change role are unavailable for ``switch_latency_s``; the actor also waits
for its reshard; rollout instances that are released migrate their running requests back to the
queue, keeping the tokens already generated. A decision that changes the actor's ranks while it
is inside a mini-batch is held until that mini-batch ends. Iterations are sequential (on-policy).
Deterministic given the seed.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections import deque
from dataclasses import dataclass, field

from slurm_rl.errors import InputError
from slurm_rl.placement import COMPONENTS
from slurm_rl.scheduler import defaults
from slurm_rl.scheduler.collocated import epoch_zero, shares_ranks, time_slice
from slurm_rl.scheduler.cost_model import CostModel, reshard_fraction
from slurm_rl.scheduler.errors import SimulationError
from slurm_rl.scheduler.history import NUM_BUCKETS, Tick, length_bucket
from slurm_rl.scheduler.lengths import LengthModel
from slurm_rl.scheduler.placement_ops import (
    placement_problems,
    rollout_instances,
    setup_problems,
)
from slurm_rl.scheduler.policies import Policy
from slurm_rl.scheduler.recorder import HistoryRecorder
from slurm_rl.scheduler.report import IterationReport, SimReport
from slurm_rl.scheduler.state import (
    ActorProgress,
    BatchSpec,
    Decision,
    InferenceProgress,
    RankMap,
    PolicyConfig,
    RolloutProgress,
    SchedState,
    derive_phase,
    normalize_placement,
)


class SimulationSetupError(InputError):
    """A setup the simulator cannot run (placement, batch or policy name): bad input, not a bug."""


@dataclass(frozen=True)
class SimSetup:
    """Everything one simulated run needs."""

    gpus: int
    initial: RankMap
    batch: BatchSpec
    group_size: int
    num_iterations: int
    prompt_len: int
    lengths: LengthModel
    cost: CostModel
    policy_cfg: PolicyConfig = field(default_factory=PolicyConfig)
    switch_latency_s: float = defaults.SWITCH_LATENCY_S
    tick_s: float = defaults.TICK_S
    seed: int = defaults.SEED
    max_sim_s: float = 1e7
    iteration_overhead_s: float = 0.0  # idle seconds at each iteration start (gate, weight sync)
    # ranks of ``initial`` may serve several components (they time-slice them, as in any shared epoch)
    collocated: bool = False
    phase_switch_s: float = 0.0  # a shared epoch: extra seconds of a move of the actor (its offload or onload)
    offloads: bool = False  # the actor's state parks between a shared rank's phases (actor.offload_*)
    # PPO's critic on ranks of its own (0: none, or on the actor's ranks): its DP size. It trains each mini-batch
    # once it is stamped and it is free, at the actor's cost law; the iteration ends once it has trained them all
    critic_dp: int = 0

    @property
    def start(self) -> RankMap:
        """Epoch 0 (``collocated.epoch_zero``, as the live run's ``live_state.start_placement``)."""
        return epoch_zero(self.initial, tuple(range(self.gpus)), self.policy_cfg.time_slicing)

    def __post_init__(self) -> None:
        object.__setattr__(self, "initial", normalize_placement(self.initial))
        problems = setup_problems(self.initial, range(self.gpus), self.policy_cfg,
                                  self.batch.global_batch_size, self.batch.micro_batch_size,
                                  allow_shared=self.collocated)
        if problems:
            raise SimulationSetupError("cluster.component_placement: " + "; ".join(problems))
        if self.batch.samples_per_iteration % self.group_size:
            raise SimulationSetupError(f"train.group_size: {self.group_size} does not divide "
                             f"{self.batch.samples_per_iteration} samples")


@dataclass
class _Request:
    rid: int
    group: int
    length: int
    generated: float = 0.0
    instance: int | None = None


@dataclass
class _Instance:
    """A rollout instance; ``counter`` counts tokens decoded per running request so far."""

    uid: int
    ranks: tuple[int, ...]
    ready_at: float
    counter: float = 0.0
    counter_t: float = 0.0
    version: int = 0
    running: dict[int, float] = field(default_factory=dict)  # rid -> counter at finish
    heap: list[tuple[float, int]] = field(default_factory=list)


class Simulation:
    """One run of ``SimSetup`` under ``policy``; call ``run()`` once."""

    def __init__(self, setup: SimSetup, policy: Policy, policy_name: str = "custom") -> None:
        self.s = setup
        self.policy = policy
        self.policy_name = policy_name
        self.rng = random.Random(setup.seed)
        self.t = 0.0
        self.events: list[tuple[float, int, str, int, int]] = []
        self.seq = itertools.count()
        # the epoch in force where it shares ranks (they time-slice: ``placement`` is then each rank's
        # component of the moment, as the live ranks switch on their own); None: ``placement`` is the epoch
        self.epoch: RankMap | None = dict(setup.start) if shares_ranks(setup.start) else None
        self.placement: RankMap = dict(setup.start)  # a shared one: the first call sends each rank to its phase
        self.ready_at: dict[str, float] = {c: 0.0 for c in COMPONENTS}
        # DP of the ranks holding the actor's state: a held-back actor (no ranks) keeps it where
        # it was, as the runtime does, so coming back onto those ranks moves nothing
        self.state_dp = len(self.placement["actor"]) // setup.policy_cfg.actor_ranks_per_instance
        self.actor_tp = setup.policy_cfg.actor_ranks_per_instance  # the actor's tensor-parallel size in force
        self.it = 0
        self.uids = itertools.count()
        self.instances: dict[int, _Instance] = {}
        self._rebuild_instances(0.0)
        self.pending_decision: Decision | None = None
        self.left_epoch: RankMap | None = None  # a shared epoch a decision left mid-iteration (actor parked there)
        self.last_policy_t = -1e18
        self.tick_scheduled = False
        self.recorder = HistoryRecorder()
        self.seen_minibatch: tuple[int, float] | None = None
        self.seen_switch: float | None = None
        self.seen_growth = 0.0  # fraction of the actor's state the last switch moved
        self.decide_s: list[float] = []

    # ---------------------------------------------------------------- iteration state
    def _start_iteration(self, it: int) -> None:
        self.it = it
        self.events.clear()
        self.tick_scheduled = False
        self.wakes: set[float] = set()
        n = self.s.batch.samples_per_iteration
        lens = self.s.lengths.sample(self.rng, n)
        self.requests = [_Request(i, i // self.s.group_size, ln) for i, ln in enumerate(lens)]
        self.pending: deque[int] = deque(range(n))
        self.finished = 0
        self.group_left = [self.s.group_size] * (n // self.s.group_size)
        self.inf_queue: deque[int] = deque()
        self.inf_batch: list[int] = []
        self.inf_done = 0
        self.actor_queue: deque[int] = deque()
        self.replay: list[int] = []  # the first pass's samples, in training order (actor.ppo_epochs > 1)
        self.actor_busy = False
        self.actor_samples_done = 0
        self.mb_done = 0
        self.actor_started_at = 0.0
        self.phase_end: dict[str, float] = {}
        self.actor_tokens = 0
        self.critic_free = 0.0  # when the critic with ranks of its own has trained the mini-batches stamped so far
        self.inference_busy_gpu_s = 0.0
        self.longest = 0
        self.length_hist = [0] * NUM_BUCKETS

    def _new_report(self, it: int) -> None:
        self.report = IterationReport(iteration=it, time_s=0.0,
                                      busy_gpu_s={c: 0.0 for c in COMPONENTS},
                                      idle_gpu_s={c: 0.0 for c in COMPONENTS})
        self.t_start = self.t

    def _tokens(self, rid: int) -> int:
        return self.s.prompt_len + self.requests[rid].length

    def state(self) -> SchedState:
        """The ``SchedState`` the policy sees now."""
        running = sum(len(i.running) for i in self.instances.values())
        rollout = RolloutProgress(running=running, pending=len(self.pending),
                                  finished=self.finished, total=len(self.requests))
        actor = ActorProgress(self.actor_samples_done, len(self.requests), self.mb_done,
                              self.s.batch.minibatches_per_iteration, busy=self.actor_busy,
                              state_dp=self.state_dp)
        return SchedState(
            iteration=self.it, num_iterations=self.s.num_iterations,
            phase=derive_phase(rollout, actor), world_ranks=tuple(range(self.s.gpus)),
            initial=self.s.initial, current=self.epoch or self.placement, rollout=rollout,
            inference=InferenceProgress(self.inf_done, len(self.requests)), actor=actor,
            batch=self.s.batch, cfg=self.s.policy_cfg, elapsed_s=self.t - self.t_start,
            history=self.recorder.history, actor_tp=self.actor_tp)

    def _observe(self) -> None:
        """Feed the history what a live coordinator would see now (see ``history.Tick``)."""
        decode = tuple((float(len(i.running)), 1.0 / self._rate(i)) for i in self.instances.values()
                       if i.running and self.t >= i.ready_at)
        tick = Tick(iteration=self.it, elapsed_s=self.t - self.t_start, samples=len(self.requests),
                    finished=self.finished, inference_done=self.inf_done,
                    groups_ready=self.inf_done + len(self.inf_queue) + len(self.inf_batch),
                    inference_gpus=len(self.placement["inference"]),
                    max_running=self.s.policy_cfg.max_running_requests,
                    running=sum(len(i.running) for i in self.instances.values()),
                    instances=len(self.instances),
                    inference_busy_gpu_s=self.inference_busy_gpu_s, lengths=tuple(self.length_hist),
                    decode=decode, minibatch=self.seen_minibatch, switch_s=self.seen_switch,
                    switch_fraction=self.seen_growth, longest=self.longest, time_sliced=self.epoch is not None)
        self.seen_minibatch = self.seen_switch = None
        self.recorder.observe(tick)

    # ---------------------------------------------------------------- time and accounting
    def _push(self, t: float, kind: str, key: int = 0, version: int = 0) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, key, version))

    def _advance(self, t: float) -> None:
        dt = t - self.t
        if dt <= 0:
            return
        rep = self.report
        tp = self.s.policy_cfg.rollout_ranks_per_instance
        busy = {
            "rollout": tp * sum(1 for i in self.instances.values() if i.running),
            "inference": len(self.placement["inference"]) if self.inf_batch else 0,
            "actor": len(self.placement["actor"]) if self.actor_busy else 0,
        }
        assigned = 0
        for comp in COMPONENTS:
            n = len(self.placement[comp])
            assigned += n
            rep.busy_gpu_s[comp] += busy[comp] * dt
            rep.idle_gpu_s[comp] += (n - busy[comp]) * dt
        rep.unassigned_gpu_s += (self.s.gpus - assigned) * dt
        self.t = t

    # ---------------------------------------------------------------- rollout
    def _rate(self, inst: _Instance) -> float:
        cfg = self.s.policy_cfg
        return self.s.cost.decode_tokens_per_s(len(inst.ranks), cfg.max_running_requests,
                                               len(inst.running))

    def _sync(self, inst: _Instance) -> None:
        """Bring the instance's token counter up to now."""
        begin = max(inst.counter_t, inst.ready_at)
        if self.t > begin and inst.running:
            inst.counter += (self.t - begin) * self._rate(inst)
        inst.counter_t = max(inst.counter_t, self.t)

    def _reschedule(self, inst: _Instance) -> None:
        inst.version += 1
        if inst.heap:
            begin = max(self.t, inst.ready_at)
            left = max(0.0, inst.heap[0][0] - inst.counter)
            self._push(begin + left / self._rate(inst), "inst", inst.uid, inst.version)

    def _rebuild_instances(self, ready_at: float) -> None:
        wanted = rollout_instances(self.placement["rollout"],
                                   self.s.policy_cfg.rollout_ranks_per_instance)
        by_ranks = {i.ranks: i for i in self.instances.values()}
        for ranks, inst in by_ranks.items():
            if ranks not in wanted:
                self._migrate_out(inst)
                del self.instances[inst.uid]
        for ranks in wanted:
            if ranks not in by_ranks:
                uid = next(self.uids)
                self.instances[uid] = _Instance(uid, ranks, ready_at, counter_t=self.t)

    def _migrate_out(self, inst: _Instance) -> None:
        self._sync(inst)
        for rid in sorted(inst.running, reverse=True):
            req = self.requests[rid]
            req.generated = req.length - max(1e-9, inst.running[rid] - inst.counter)
            req.instance = None
            self.pending.appendleft(rid)
            self.report.migrated_requests += 1
        inst.running.clear()
        inst.heap.clear()
        inst.version += 1

    def _dispatch(self) -> None:
        cap = self.s.policy_cfg.max_running_requests
        heap = [(len(i.running), uid) for uid, i in self.instances.items()
                if len(i.running) < cap]
        if not self.pending or not heap:
            return
        heapq.heapify(heap)
        touched: dict[int, _Instance] = {}
        while self.pending and heap:
            load, uid = heapq.heappop(heap)
            inst = self.instances[uid]
            if uid not in touched:
                self._sync(inst)
                touched[uid] = inst
            rid = self.pending.popleft()
            req = self.requests[rid]
            req.instance = uid
            finish = inst.counter + (req.length - req.generated)
            inst.running[rid] = finish
            heapq.heappush(inst.heap, (finish, rid))
            if load + 1 < cap:
                heapq.heappush(heap, (load + 1, uid))
        for inst in touched.values():
            self._reschedule(inst)

    def _instance_event(self, uid: int, version: int) -> bool:
        """Finish the requests of instance ``uid`` that are done; True when a group completed."""
        inst = self.instances.get(uid)
        if inst is None or inst.version != version:
            return False
        self._sync(inst)
        # Nothing changed on the instance since this event was scheduled: its head is done.
        inst.counter = max(inst.counter, inst.heap[0][0]) if inst.heap else inst.counter
        group_done = False
        while inst.heap and inst.heap[0][0] <= inst.counter + 1e-6:
            _, rid = heapq.heappop(inst.heap)
            del inst.running[rid]
            group_done |= self._finish_request(rid)
        self._reschedule(inst)
        self._dispatch()
        return group_done

    def _finish_request(self, rid: int) -> bool:
        req = self.requests[rid]
        req.instance = None
        req.generated = req.length
        self.finished += 1
        self.length_hist[length_bucket(req.length)] += 1
        if self.finished == len(self.requests):
            self.phase_end["rollout_end_s"] = self.t - self.t_start
        self.longest = max(self.longest, req.length)
        self.group_left[req.group] -= 1
        if self.group_left[req.group] == 0:
            first = req.group * self.s.group_size
            group = range(first, first + self.s.group_size)
            if self.s.initial["inference"]:
                self.inf_queue.extend(group)
            else:  # no inference component: the rollouts go to the actor as they are (its leader's scoring
                self.inf_done += len(group)  # of a KL's reference or a critic's values is not modelled)
                if self.inf_done >= len(self.requests):
                    self.phase_end["inference_end_s"] = self.t - self.t_start
                self.actor_queue.extend(group)
            return True
        return False

    # ---------------------------------------------------------------- inference and actor
    def _start_stages(self) -> None:
        inf = self.placement["inference"]
        if inf and not self.inf_batch and self.inf_queue and self.t >= self.ready_at["inference"]:
            n = min(len(self.inf_queue), self.s.batch.global_batch_size)
            self.inf_batch = [self.inf_queue.popleft() for _ in range(n)]
            tokens = sum(self._tokens(r) for r in self.inf_batch)
            seconds = self.s.cost.seconds("inference", tokens, len(inf))
            self.inference_busy_gpu_s += seconds * len(inf)
            self._push(self.t + seconds, "inf")
        elif inf and self.inf_queue and self.t < self.ready_at["inference"]:
            self._wake(self.ready_at["inference"])
        actor = self.placement["actor"]
        gbs = self.s.batch.global_batch_size
        if actor and not self.actor_busy and len(self.actor_queue) >= gbs:
            if self.t < self.ready_at["actor"]:
                self._wake(self.ready_at["actor"])
                return
            tokens = sum(self._tokens(self.actor_queue[i]) for i in range(gbs))
            self.actor_busy = True
            self.actor_started_at = self.t
            self.phase_end["last_minibatch_start_s"] = self.t - self.t_start
            self.actor_tokens = tokens
            self._push(self.t + self.s.cost.seconds("actor", tokens, len(actor)), "actor")
            if self.s.critic_dp:  # the critic's ranks take the stamped mini-batch in turn
                self.critic_free = max(self.critic_free, self.t) + self.s.cost.seconds("actor", tokens, self.s.critic_dp)

    def _wake(self, t: float) -> None:
        if t not in self.wakes:
            self.wakes.add(t)
            self._push(t, "wake")

    def _finish_inference(self) -> None:
        self.inf_done += len(self.inf_batch)
        if self.inf_done + len(self.inf_batch) >= len(self.requests):
            self.phase_end["inference_end_s"] = self.t - self.t_start
        self.actor_queue.extend(self.inf_batch)
        self.inf_batch = []

    def _finish_minibatch(self) -> None:
        batch = self.s.batch
        first_pass = self.mb_done < batch.minibatches_per_epoch
        trained = [self.actor_queue.popleft() for _ in range(batch.global_batch_size)]
        if first_pass:
            self.actor_samples_done += batch.global_batch_size
            if batch.ppo_epochs > 1:
                self.replay.extend(trained)
        self.mb_done += 1
        if first_pass and self.mb_done == batch.minibatches_per_epoch:  # the later passes, as the workers stamp them
            self.actor_queue.extend(self.replay * (batch.ppo_epochs - 1))
        self.actor_busy = False
        self.seen_minibatch = (len(self.placement["actor"]) // self.actor_tp,
                               self.t - self.actor_started_at, self.actor_tokens)
        if self.pending_decision is not None:
            decision, self.pending_decision = self.pending_decision, None
            self._apply(decision)

    # ---------------------------------------------------------------- decisions
    def _call_policy(self, force: bool) -> None:
        if self.pending_decision is not None:
            return
        if not force and self.t - self.last_policy_t < self.s.tick_s:
            if not self.tick_scheduled:
                self.tick_scheduled = True
                self._push(self.last_policy_t + self.s.tick_s, "tick")
            return
        self.last_policy_t = self.t
        self._observe()
        state = self.state()
        t0 = time.thread_time()  # CPU time: other processes on the machine do not inflate it
        decision = self.policy(state)
        self.decide_s.append(time.thread_time() - t0)
        if decision is not None:
            new_epoch = normalize_placement(decision.placement)
            if shares_ranks(new_epoch):  # its ranks switch phases on their own from now on
                self.epoch = new_epoch
                self.report.decisions.append({"t": round(self.t - self.t_start, 3), "reason": decision.reason,
                                              "boundary": decision.boundary, "time_sliced": True,
                                              "placement": {c: len(r) for c, r in new_epoch.items()}})
                decision = None
            else:
                if self.epoch is not None and state.phase not in ("start", "end"):
                    self.left_epoch = self.epoch  # mid-iteration: its parked actor ranks onload first
                self.epoch = None
        if decision is None and self.epoch is not None:
            decision = time_slice(state, self.epoch, self.placement)
        if decision is None:
            return
        actor_changes = (decision.placement["actor"] != self.placement["actor"]
                         or decision.actor_tp not in (None, self.actor_tp))
        if actor_changes and self.actor_busy:
            self.pending_decision = decision
            return
        self._apply(decision)

    def _apply(self, d: Decision) -> None:
        new = normalize_placement(d.placement)
        tp = self.actor_tp if d.actor_tp is None else d.actor_tp
        problems = placement_problems(new, range(self.s.gpus), self.s.policy_cfg,
                                      self.s.batch.global_batch_size,
                                      self.s.batch.micro_batch_size, allow_empty_actor=True, actor_tp=tp)
        if problems:
            raise SimulationError(f"policy {self.policy_name} at t={self.t:.1f}s iteration "
                                  f"{self.it}: unusable placement: {'; '.join(problems)}")
        tp_changes, self.actor_tp = tp != self.actor_tp, tp
        if new == self.placement and not tp_changes:
            return
        old = self.placement
        ready = self.t + self.s.switch_latency_s
        parking = 0.0
        # a shared rank's actor state parks or comes back (also where auto leaves a shared epoch mid-iteration:
        # the actor's shared ranks, parked while they scored, bring it back before the reshard)
        moved = new["actor"] != old["actor"]
        back = moved and self.left_epoch is not None and bool(
            set(new["actor"]) & set(self.left_epoch["actor"]) - set(old["actor"]))
        if moved:
            self.left_epoch = None
        if moved and (self.epoch is not None or back):
            parking = self.s.phase_switch_s
            ready += parking
            parked = set(old["actor"]) - set(new["actor"])
            for inst in self.instances.values():  # a shared rank decodes once its actor state has left
                if parked.intersection(inst.ranks):
                    inst.ready_at = max(inst.ready_at, ready)
        self.seen_growth = 0.0
        if new["inference"] != old["inference"]:
            if self.inf_batch:
                self.inf_queue.extendleft(reversed(self.inf_batch))
                self.inf_batch = []
            self.ready_at["inference"] = ready
        actor_moves = new["actor"] != old["actor"] or tp_changes
        if actor_moves:
            reshard = 0.0
            if new["actor"]:
                new_dp = len(new["actor"]) // tp
                reshard = self.s.cost.reshard_seconds(self.state_dp, new_dp)
                self.seen_growth = reshard_fraction(self.state_dp, new_dp)
                self.state_dp = new_dp
            self.ready_at["actor"] = ready + reshard
        if self.epoch is None or self.seen_growth:  # a shared rank's phase change is no epoch: a live
            # coordinator sees only the reshard into a collocated iteration (without the parking)
            self.seen_switch = max(self.ready_at["actor"] if actor_moves else ready, ready) - self.t - parking
        self.placement = new
        self._rebuild_instances(ready)
        self.report.placement_changes += 1
        self.report.decisions.append({"t": round(self.t - self.t_start, 3), "reason": d.reason,
                                      "boundary": d.boundary,
                                      "placement": {c: len(r) for c, r in new.items()},
                                      **({"forecast_end_s": d.forecast_end_s} if d.forecast_end_s is not None else {})})
        self._dispatch()
        self._start_stages()

    # ---------------------------------------------------------------- main loop
    def run(self) -> SimReport:
        """Simulate every iteration and return the report."""
        cfg = self.s.policy_cfg
        out = SimReport(policy=self.policy_name, gpus=self.s.gpus, decide_s=self.decide_s,
                        use_pre_process_policy=cfg.use_pre_process_policy,
                        use_wait_before_last_iter_policy=cfg.use_wait_before_last_iter_policy,
                        seed=self.s.seed)
        self._new_report(0)
        for it in range(self.s.num_iterations):
            self._start_iteration(it)
            if self.s.iteration_overhead_s > 0:
                self._advance(self.t + self.s.iteration_overhead_s)
            self._call_policy(force=True)
            self._dispatch()
            self._start_stages()
            self._run_iteration()
            self.report.time_s = self.t - self.t_start
            total = self.s.gpus * self.report.time_s
            self.report.bubble_gpu_s = total - sum(self.report.busy_gpu_s.values())
            self.report.phases = dict(self.phase_end)
            self.report.bounds = self._bounds()
            out.iterations.append(self.report)
            self.recorder.end_iteration(self.report.time_s)
            # The end-of-iteration decision (back to the initial placement) is paid by the next.
            self._new_report(it + 1)
            self._call_policy(force=True)
        return out

    def _bounds(self) -> dict[str, float]:
        """Lower bounds of the iteration just simulated (see ``IterationReport.bounds``)."""
        cfg, cost, gbs = self.s.policy_cfg, self.s.cost, self.s.batch.global_batch_size
        longest = max(self.requests, key=lambda r: r.length)
        lone = longest.length / cost.decode_tokens_per_s(cfg.rollout_ranks_per_instance,
                                                         cfg.max_running_requests, 1)
        group = range(longest.group * self.s.group_size, (longest.group + 1) * self.s.group_size)
        group_tokens = sum(self._tokens(r) for r in group)
        mb_tokens = gbs * sum(self._tokens(r.rid) for r in self.requests) / len(self.requests)
        tail = (lone + cost.seconds("inference", group_tokens, self.s.gpus)
                + cost.seconds("actor", mb_tokens, self.s.gpus // cfg.actor_ranks_per_instance))
        busy = sum(self.report.busy_gpu_s.values())
        return {"tail_s": tail, "work_s": busy / self.s.gpus, "longest_response": float(longest.length)}

    def _run_iteration(self) -> None:
        total_mb = self.s.batch.minibatches_per_iteration
        while self.mb_done < total_mb:
            if not self.events:
                raise SimulationError(
                    f"simulation stalled at t={self.t:.1f}s, iteration {self.it}: "
                    f"placement {self.placement}, {len(self.pending)} pending, "
                    f"{self.finished} finished, inference done {self.inf_done}, "
                    f"actor mini-batches {self.mb_done}/{total_mb}")
            t, _, kind, key, version = heapq.heappop(self.events)
            if t > self.s.max_sim_s:
                raise SimulationError(f"simulation passed max_sim_s={self.s.max_sim_s}")
            self._advance(t)
            force = kind in ("inf", "actor")
            if kind == "inst":
                force = self._instance_event(key, version)
            elif kind == "inf":
                self._finish_inference()
            elif kind == "actor":
                self._finish_minibatch()
            elif kind == "tick":
                self.tick_scheduled = False
                force = True
            self._call_policy(force=force)  # before the actor picks its next mini-batch
            self._start_stages()
        if self.critic_free > self.t:  # the critic's last steps: the next iteration's values need them
            self._advance(self.critic_free)
