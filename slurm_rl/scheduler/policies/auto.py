"""``auto``: RLinf's dynamic scheduling, as a pure, level-triggered function of the state.

Rules, first match wins:

1. Iteration boundary (phase ``start``, or ``end`` with iterations left): return to the
   iteration-start placement (``placement_ops.iteration_start_placement``).
2. Repair: a component with work left but no ranks gets the initial placement back.
3. The actor is inside a mini-batch: no change (its ranks only change at mini-batch boundaries).
4. Pre-process (``use_pre_process_policy``): while the actor holds no ranks, rollout keeps the
   actor's GPUs until the outstanding requests fall to ``pre_process_threshold`` of the
   iteration's samples (and ``pre_process_min_finished`` of them finished); then the rollout
   instances on the actor's initial ranks migrate out and the actor starts.
5. Wait before the last mini-batch (``use_wait_before_last_iter_policy``): once only the last
   mini-batch is left, nothing moves until rollout and inference finished; then the actor gets
   every GPU (largest valid DP).
6. Release and grow: rollout keeps ``ceil(outstanding / max_running_requests)`` instances (none
   when it finished), inference is released once it finished its share; the actor grows to the
   largest valid DP that idle ranks, released inference ranks and surplus rollout instances
   allow. Only as many rollout instances are released as the actor can use (RLinf's
   ``find_release_instance_num_needed``); finished components are released entirely.

On a hybrid placement (ranks of the configured placement that serve several components, time-sliced)
the shared ranks are pinned: they keep their components while any of them has work (a shared rollout
instance is never released while requests are outstanding), and leave the rollout and inference only
once those finished; the actor grows into the other ranks as they free up, and into shared ranks whose
components all finished. ``config`` refuses what auto cannot do there (a pre-process that would lend
shared actor ranks; an actor that holds every rank already, so that nothing is left to move).

The actor keeps its tensor-parallel size while it suits its new ranks; otherwise the decision
carries the smallest of ``actor_tp_choices`` that does (``placement_ops.with_actor_tp``), and the
actor never grows onto ranks that no choice suits (a TP group across nodes, an invalid DP size).
"""

from __future__ import annotations

from slurm_rl.scheduler.collocated import shared_ranks
from slurm_rl.scheduler.placement_ops import (
    choose_actor_tp,
    grow_actor,
    idle_ranks,
    iteration_start_placement,
    rollout_instances,
    with_actor_tp,
)
from slurm_rl.scheduler.state import Decision, RankMap, SchedState, instances_needed


def decide_auto(state: SchedState) -> Decision | None:
    """RLinf auto-scheduler semantics (see the module docstring for the rules)."""
    return with_actor_tp(state, _decide(state))


def _decide(state: SchedState) -> Decision | None:
    start = iteration_start_placement(state.initial, state.cfg)
    if state.phase == "start" or (state.phase == "end"
                                  and state.iteration + 1 < state.num_iterations):
        if state.current == start:
            return None
        nxt = state.iteration if state.phase == "start" else state.iteration + 1
        what = ("the iteration-start placement (pre-process: rollout also on the actor's ranks)"
                if start != state.initial else "the initial placement")
        return Decision(start, f"return to {what} for iteration {nxt}",
                        boundary="iteration")
    if state.phase == "end":
        return None
    starved = starved_components(state)
    if starved:
        repair = start if _actor_held_back(state) else dict(state.initial)
        if repair != state.current:
            return Decision(repair, f"repair: {', '.join(starved)} hold no ranks but have work",
                            migrate_from=(), boundary="minibatch")
    if state.actor.busy:
        return None
    if state.cfg.use_pre_process_policy and not state.current["actor"] and state.initial["actor"]:
        return _pre_process(state)
    last = state.actor.minibatches_total - 1
    if state.cfg.use_wait_before_last_iter_policy and state.actor.minibatches_done >= last:
        return _wait_before_last(state)
    return _release_and_grow(state)


def _actor_held_back(state: SchedState) -> bool:
    """The pre-process policy keeps the actor off the GPUs (it has not started this iteration)."""
    return (state.cfg.use_pre_process_policy and state.actor.minibatches_done == 0
            and not state.actor.busy)


def starved_components(state: SchedState, placement: RankMap | None = None) -> list[str]:
    """Components that still have work this iteration but hold no ranks in ``placement``
    (default: the current one). The actor held back by the pre-process policy is not starved."""
    placement = state.current if placement is None else placement
    work = {
        "rollout": state.rollout.outstanding > 0,
        "inference": not state.inference.finished,
        "actor": (state.actor.minibatches_done < state.actor.minibatches_total
                  and not _actor_held_back(state)),
    }
    return [c for c, has_work in work.items() if has_work and not placement.get(c)]


def _pre_process(state: SchedState) -> Decision | None:
    total = state.rollout.total
    out = state.rollout.outstanding
    if out > state.cfg.pre_process_threshold * total:
        return None
    if state.rollout.finished < state.cfg.pre_process_min_finished * total:
        return None
    actor = state.initial["actor"]
    taken = set(actor)
    # Whole rollout instances that touch the actor's ranks leave (rollout keeps whole instances).
    leaving = [inst for inst in rollout_instances(state.current["rollout"], state.cfg.rollout_ranks_per_instance)
               if taken & set(inst)]
    gone = taken | {r for inst in leaving for r in inst}
    placement: RankMap = {c: tuple(r for r in ranks if r not in gone)
                            for c, ranks in state.current.items()}
    placement["actor"] = actor
    if [c for c in starved_components(state, placement) if c != "actor"]:
        return None  # the actor's ranks are still the only ranks of a component with work
    migrate = tuple(r for r in state.current["rollout"] if r in gone) if out else ()
    return Decision(placement,
                    f"pre-process: {out} of {total} requests outstanding "
                    f"(<= {state.cfg.pre_process_threshold:g}); actor starts on {len(actor)} ranks",
                    migrate_from=migrate, boundary="minibatch")


def _wait_before_last(state: SchedState) -> Decision | None:
    if state.rollout.outstanding > 0 or not state.inference.finished:
        return None
    available = [(r,) for r in state.world_ranks if r not in set(state.current["actor"])]
    actor, _ = grow_actor(state.current["actor"], available, state)
    placement: RankMap = {"actor": actor, "rollout": (), "inference": ()}
    if placement == state.current:
        return None
    return Decision(placement,
                    f"wait-before-last: rollout and inference finished; actor takes "
                    f"{len(actor)} of {len(state.world_ranks)} ranks for its last mini-batch",
                    boundary="minibatch")


def _release_and_grow(state: SchedState) -> Decision | None:
    cur = state.current
    cfg = state.cfg
    out = state.rollout.outstanding
    pinned = shared_ranks(state.initial)  # a hybrid placement's shared ranks keep their components
    instances = rollout_instances(cur["rollout"], cfg.rollout_ranks_per_instance)
    keep = min(len(instances), instances_needed(out, cfg.max_running_requests))
    keep = max(keep, 1) if out > 0 else 0
    movable = [inst for inst in instances if not pinned.intersection(inst)]
    surplus = movable[:len(instances) - keep]  # lowest ranks first, as RLinf releases them
    inference_done = state.inference.finished and bool(cur["inference"])
    idle = idle_ranks(state.world_ranks, cur)

    groups: list[tuple[int, ...]] = [(r,) for r in idle]
    if inference_done:  # a shared rank joins the actor once none of its components has work left
        groups.extend((r,) for r in cur["inference"]
                      if r not in cur["actor"] and (out == 0 or r not in cur["rollout"]))
    n_fixed = len(groups)
    groups.extend(surplus)
    actor, used = grow_actor(cur["actor"], groups, state)

    released_instances = max(0, used - n_fixed)
    released = instances if out == 0 else surplus[:released_instances]
    released_rollout = tuple(r for inst in released for r in inst)
    placement: RankMap = {
        "actor": actor,
        "rollout": tuple(r for r in cur["rollout"] if r not in set(released_rollout)),
        "inference": () if inference_done else cur["inference"],
    }
    if placement == cur:
        return None
    parts = []
    if actor != cur["actor"]:
        tp = choose_actor_tp(actor, state.tp, len(state.world_ranks), cfg, state.batch.global_batch_size,
                             state.batch.micro_batch_size) or state.tp
        parts.append(f"actor grows to {len(actor)} ranks (DP {len(actor) // tp})")
    if released_rollout:
        parts.append(f"rollout releases {len(released_rollout)} ranks ({out} requests "
                     f"outstanding, {keep} instance(s) needed)")
    if inference_done:
        parts.append(f"inference finished, releases {len(cur['inference'])} ranks")
    return Decision(placement, "; ".join(parts),
                    migrate_from=released_rollout if out else (),
                    boundary="minibatch" if actor != cur["actor"] else "now")
