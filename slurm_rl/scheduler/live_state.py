"""Bridge between the live run and the pure policies: build ``SchedState`` from config + progress.

The coordinator reads progress files and the epoch in force, turns them into the same
``SchedState`` the simulator builds, and calls the same policy function (invariant 4).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from slurm_rl.config import Config, actor_offloads, actor_tp_choices
from slurm_rl.control.epochs import Epoch
from slurm_rl.control.progress import IterationCounters, LastMinibatch, RankProgress
from slurm_rl.scheduler.collocated import epoch_zero, shares_ranks
from slurm_rl.scheduler.cost_model import CostModel
from slurm_rl.scheduler.history import NUM_BUCKETS, History, Tick
from slurm_rl.scheduler.placement_ops import rollout_instances, setup_problems
from slurm_rl.scheduler.policies import make_policy
from slurm_rl.scheduler.state import (
    ActorProgress,
    BatchSpec,
    Decision,
    InferenceProgress,
    PolicyConfig,
    RolloutProgress,
    SchedState,
    ScriptedSwitch,
    derive_phase,
    valid_dp_sizes,
)

PolicyFn = Callable[[SchedState], "Decision | None"]


def initial_decision(cfg: Config) -> Decision:
    """Epoch 0: :func:`start_placement`."""
    reason = ("initial placement: every component on every rank (plan runs the first iteration collocated: "
              "scheduler.time_slicing)" if policy_config(cfg).time_slicing else "initial placement")
    return Decision(placement=start_placement(cfg), reason=reason, boundary="iteration")


def start_placement(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The placement of epoch 0, where the ranks build the actor (``collocated.epoch_zero``). The policies
    still plan from the configured placement (``SchedState.initial``)."""
    return epoch_zero(_ranks(cfg.placement), tuple(range(cfg.placement.world_size)), policy_config(cfg).time_slicing)


def restart_decision(epoch: Epoch, reason: str) -> Decision:
    """Re-publish the placement (and the actor's tensor-parallel size) in force under a new
    coordinator generation."""
    return Decision(placement={c: tuple(s["ranks"]) for c, s in epoch.placement.items()}, reason=reason,
                    boundary="iteration", actor_tp=epoch_actor_tp(epoch))


def epoch_actor_tp(epoch: Epoch) -> int | None:
    """The actor's tensor-parallel size in force at ``epoch``: its ``extra["actor_tp"]`` (written
    even while the actor holds no ranks), else the actor placement's ``"tp"``; None when neither."""
    tp = epoch.extra.get("actor_tp")
    if isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1:
        return tp
    spec = epoch.placement.get("actor")
    return int(spec["tp"]) if spec and "tp" in spec else None


def placement_json(decision: Decision, actor_tp: int = 1) -> dict[str, dict[str, Any]]:
    """The ``placement`` object of an epoch file: ranks and parallel layout per component. The
    actor's ``tp`` is ``actor_tp`` (``dp`` = its ranks / tp); rollout and inference have tp 1."""
    out = {}
    for component, ranks in decision.placement.items():
        if ranks:
            tp = actor_tp if component == "actor" else 1
            out[component] = {"ranks": list(ranks), "dp": max(1, len(ranks) // tp), "tp": tp, "pp": 1}
    return out


def _ranks(placement: Any) -> dict[str, tuple[int, ...]]:
    return {name: tuple(comp.ranks) for name, comp in placement.components.items()}


def policy_config(cfg: Config) -> PolicyConfig:
    """The policies' knobs from the resolved config (defaults live in ``scheduler.defaults``).

    The node of each rank comes from the placement: ``ranks_per_node`` (``cluster.gpus_per_node``)
    when rank ``r`` lives on node ``r // gpus_per_node``, else ``rank_nodes``. ``time_slicing``: under
    ``plan`` with ``scheduler.time_slicing`` (see :func:`time_slicing_problems` for what rules it out);
    ``phase_switch_s`` is costed from the ``emulated`` section (``offload_s_per_gb``, ``model_params``)
    where ``actor.offload_*`` park the actor between phases."""
    steps = tuple(
        ScriptedSwitch(at_phase=step.at_phase, placement=_ranks(parsed), at_iteration=step.at_iteration,
                       at_rollout_fraction=step.at_rollout_fraction, actor_tp=step.actor_tp)
        for step, parsed in zip(cfg.scheduler.script, cfg.script_placements)
    )
    pl, per = cfg.placement, cfg.cluster.gpus_per_node
    nodes = tuple(pl.node_of_rank(r) for r in range(pl.world_size))
    uniform = per is not None and all(n == r // per for r, n in enumerate(nodes))
    return PolicyConfig(
        ranks_per_node=per if uniform else None,
        rank_nodes=() if uniform else nodes,
        actor_tp_choices=actor_tp_choices(cfg),
        max_running_requests=cfg.scheduler.max_running_requests,
        rollout_ranks_per_instance=cfg.scheduler.rollout_ranks_per_instance,
        actor_ranks_per_instance=cfg.scheduler.actor_ranks_per_instance,
        pre_process_threshold=cfg.scheduler.pre_process_threshold,
        use_pre_process_policy=cfg.cluster.use_pre_process_policy,
        use_wait_before_last_iter_policy=cfg.cluster.use_wait_before_last_iter_policy,
        script=steps,
        time_slicing=cfg.scheduler.policy == "plan" and not time_slicing_problems(cfg),
        phase_switch_s=(CostModel.from_config(dataclasses.asdict(cfg.emulated))
                        .offload_seconds(cfg.actor.tensor_parallel) if actor_offloads(cfg) else 0.0),
    )


def time_slicing_problems(cfg: Config) -> list[str]:
    """Why ``plan`` may not run an iteration collocated under ``cfg`` (empty: it may): switched off by
    ``scheduler.time_slicing``, a critic on ranks of its own, or an actor that cannot train on every rank
    (its DP there must split the batch)."""
    problems = []
    if cfg.scheduler.time_slicing is False:
        problems.append("scheduler.time_slicing is false")
    if cfg.placement.critic_ranks:
        problems.append("the critic has ranks of its own")
    world, tp = cfg.placement.world_size, cfg.actor.tensor_parallel
    if world % tp or world // tp not in valid_dp_sizes(cfg.train.global_batch_size, cfg.train.micro_batch_size,
                                                      world // tp):
        problems.append(f"the actor at DP {world // max(1, tp)} on every rank cannot split train.global_batch_size "
                        f"{cfg.train.global_batch_size} into micro-batches of {cfg.train.micro_batch_size}")
    return problems


def check_setup(cfg: Config) -> None:
    """Refuse an initial placement the configured policy cannot schedule (names the problems)."""
    pcfg = policy_config(cfg)
    problems = setup_problems(_ranks(cfg.placement), range(cfg.placement.world_size), pcfg,
                              cfg.train.global_batch_size, cfg.train.micro_batch_size,
                              allow_shared=cfg.scheduler.policy in ("static", "auto"))
    if problems:
        raise ValueError(f"cluster.component_placement cannot be scheduled by policy "
                         f"{cfg.scheduler.policy!r}: " + "; ".join(problems))


def build_policy(cfg: Config) -> PolicyFn:
    """The configured policy, bound to its config."""
    return make_policy(cfg.scheduler.policy, policy_config(cfg))


def _current(progress: Mapping[int, RankProgress], iteration: int) -> list[IterationCounters]:
    """Counters of the ranks working on (or done with: waiting at the next gate) ``iteration``."""
    return [d.counters for d in progress.values() if d.iteration == iteration]


def build_state(cfg: Config, current: Epoch, progress: Mapping[int, RankProgress], iteration: int, at_gate: bool,
                elapsed_s: float = 0.0, history: History | None = None,
                actor_state_dp: int | None = None, actor_tp: int | None = None) -> SchedState:
    """A ``SchedState`` of the live run: at an iteration gate phase ``start``; otherwise from
    the ranks' progress counters of ``iteration`` (rollout finished/running, inference done,
    actor mini-batches done and busy). ``actor_state_dp``: DP of the ranks holding the actor's
    state, as the coordinator last placed it (None: not known). ``actor_tp``: the actor's
    tensor-parallel size in force (None: the ``current`` epoch's, else the configured one)."""
    samples = cfg.train.rollout_batch_size * cfg.train.group_size
    batch = BatchSpec(cfg.train.global_batch_size, cfg.train.micro_batch_size, samples, cfg.actor.ppo_epochs)
    has_inference = bool(cfg.placement.components.get("inference") and cfg.placement.components["inference"].ranks)
    inf_total = samples if has_inference else 0
    if at_gate:
        rollout = RolloutProgress(running=0, pending=samples, finished=0, total=samples)
        inference = InferenceProgress(done=0, total=inf_total)
        actor = ActorProgress(0, samples, 0, batch.minibatches_per_iteration, state_dp=actor_state_dp,
                              samples_ready=0)
    else:
        counters = _current(progress, iteration)
        # Samples the actor leader received have finished rollout (and inference): a floor that
        # does not lag the data as the producers' own reports may.
        received = max((c.actor_received for c in counters), default=0)
        finished = min(samples, max(received, sum(c.rollout_finished for c in counters)))
        running = min(samples - finished, sum(c.rollout_running for c in counters))
        rollout = RolloutProgress(running=running, pending=samples - finished - running, finished=finished, total=samples)
        inference_done = sum(c.inference_done for c in counters)
        inference = InferenceProgress(done=min(inf_total, max(received if inf_total else 0, inference_done)),
                                      total=inf_total)
        steps = min(batch.minibatches_per_iteration, max((c.actor_minibatches_done for c in counters), default=0))
        busy = any(c.actor_busy for c in counters)
        # complete groups the cutter holds or cut: the actor's data (inference here scores
        # samples as they come, not whole groups, so its count runs ahead of the data)
        trained = min(steps, batch.minibatches_per_epoch) * cfg.train.global_batch_size  # a later pass adds none
        ready = max([trained] + [c.actor_ready for c in counters])
        actor = ActorProgress(trained, samples, steps,
                              batch.minibatches_per_iteration, busy=busy, state_dp=actor_state_dp,
                              samples_ready=min(samples, ready))
    return SchedState(
        iteration=iteration,
        num_iterations=cfg.train.num_iterations,
        phase=derive_phase(rollout, actor),
        world_ranks=tuple(range(cfg.placement.world_size)),
        initial=_ranks(cfg.placement),
        current={c: tuple(s["ranks"]) for c, s in current.placement.items()},
        rollout=rollout,
        inference=inference,
        actor=actor,
        batch=batch,
        cfg=policy_config(cfg),
        elapsed_s=elapsed_s,
        history=history,
        actor_tp=actor_tp if actor_tp is not None else epoch_actor_tp(current),
    )


def live_tick(state: SchedState, progress: Mapping[int, RankProgress], minibatch: tuple[int, float, int] | None,
              switch_s: float | None, switch_fraction: float = 0.0) -> Tick:
    """The ``Tick`` the history records from a live state and the ranks' progress (see
    ``scheduler.history``): length histograms, decode step times and inference busy time summed
    over the ranks working on the state's iteration; the samples ready are those in complete
    groups at the actor's cutter."""
    counters = _current(progress, state.iteration)
    hist = [0] * NUM_BUCKETS
    longest = 0
    decode: list[tuple[float, float]] = []
    for c in counters:
        for b, n in c.rollout_len_hist.items():
            hist[min(NUM_BUCKETS - 1, b)] += n
        longest = max(longest, c.rollout_longest)
        if c.rollout_step_s and c.rollout_decoding:
            decode.append((float(c.rollout_decoding), c.rollout_step_s))
    inf_gpus = len(state.current["inference"])
    time_sliced = shares_ranks(state.current)
    # a collocated iteration scores only once its rollout ended: its curve follows the rollout's groups
    ready = state.rollout.finished if time_sliced else state.actor.samples_ready or 0
    return Tick(iteration=state.iteration, elapsed_s=state.elapsed_s, samples=state.rollout.total,
                finished=state.rollout.finished, inference_done=state.inference.done,
                groups_ready=ready,
                inference_gpus=inf_gpus, max_running=state.cfg.max_running_requests,
                running=state.rollout.running,
                instances=len(rollout_instances(state.current["rollout"], state.cfg.rollout_ranks_per_instance)),
                inference_busy_gpu_s=sum(c.inference_busy_s for c in counters), lengths=tuple(hist),
                decode=tuple(decode), minibatch=minibatch, switch_s=switch_s,
                switch_fraction=switch_fraction if switch_s is not None else 0.0, longest=longest,
                time_sliced=time_sliced)


def last_minibatch(progress: Mapping[int, RankProgress], iteration: int) -> LastMinibatch | None:
    """The actor's most recently cut mini-batch of ``iteration``, as its cutter reports it."""
    for c in _current(progress, iteration):
        if c.actor_last_minibatch is not None:
            return c.actor_last_minibatch
    return None
