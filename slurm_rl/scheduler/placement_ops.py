"""Pure helpers on placements: instances, idle ranks, the iteration-start layout, validation,
the actor's tensor-parallel size."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from slurm_rl.config import straddling_tp_groups
from slurm_rl.scheduler.state import (
    Decision,
    RankMap,
    PolicyConfig,
    Ranks,
    SchedState,
    normalize_placement,
    valid_dp_sizes,
)


def rollout_instances(ranks: Sequence[int], ranks_per_instance: int) -> list[Ranks]:
    """Split sorted rollout ranks into instances of ``ranks_per_instance`` consecutive entries."""
    ordered = sorted(ranks)
    if len(ordered) % ranks_per_instance:
        raise ValueError(
            f"rollout ranks {ordered} do not split into instances of {ranks_per_instance}")
    return [tuple(ordered[i:i + ranks_per_instance])
            for i in range(0, len(ordered), ranks_per_instance)]


def idle_ranks(world: Sequence[int], placement: Mapping[str, Sequence[int]]) -> Ranks:
    """Ranks of the allocation that no component holds."""
    used = {r for ranks in placement.values() for r in ranks}
    return tuple(r for r in sorted(world) if r not in used)


def iteration_start_placement(initial: Mapping[str, Sequence[int]], cfg: PolicyConfig) -> RankMap:
    """Placement every iteration starts from: the configured one, or with the pre-process policy
    the configured one with rollout also spanning the actor's GPUs (the actor waits, its state
    kept on its initial ranks' host memory, until pre-process hands the GPUs back). The actor's
    ranks are lent only when they form whole rollout instances (``setup_problems`` reports it)."""
    start = normalize_placement(initial)
    if (cfg.use_pre_process_policy and start["actor"]
            and len(start["actor"]) % cfg.rollout_ranks_per_instance == 0):
        start["rollout"] = tuple(sorted(start["rollout"] + start["actor"]))
        start["actor"] = ()
    return start


def mid_iteration_problems(current: Mapping[str, Sequence[int]], new: Mapping[str, Sequence[int]]) -> list[str]:
    """Inside an iteration rollout and inference may only shrink: a rank joining them would need
    this iteration's weights (rollout) or a share fixed at the iteration start (inference)."""
    problems = []
    for comp in ("rollout", "inference"):
        grown = sorted(set(new.get(comp, ())) - set(current.get(comp, ())))
        if grown:
            problems.append(f"{comp}: ranks {grown} cannot join mid-iteration (only at an iteration gate)")
    return problems


def actor_tp_problems(actor: Sequence[int], tp: int, world_size: int, cfg: PolicyConfig,
                      global_batch_size: int, micro_batch_size: int) -> list[str]:
    """Why the actor cannot run on ranks ``actor`` at tensor-parallel size ``tp`` (empty list
    when it can): ``tp`` is one of ``cfg.tp_choices``, the ranks form whole TP groups, DP =
    ranks / tp is a valid DP size, and each TP group (``tp`` consecutive sorted ranks) lies
    inside one node (when ``cfg`` knows the nodes)."""
    problems: list[str] = []
    if tp not in cfg.tp_choices:
        problems.append(f"actor: tensor-parallel size {tp} is not one of {list(cfg.tp_choices)} "
                        "(actor.tensor_parallel_choices)")
    dp, rest = divmod(len(actor), tp)
    max_dp = world_size // tp
    if rest or not 1 <= dp <= max_dp or global_batch_size % (micro_batch_size * dp):
        problems.append(
            f"actor: {len(actor)} ranks give DP {len(actor) / tp:g}, not a valid DP size "
            f"(global_batch_size % (micro_batch_size * dp) == 0 with "
            f"global_batch_size={global_batch_size}, micro_batch_size={micro_batch_size}"
            + (f", tensor-parallel size {tp}" if tp > 1 else "")
            + f": {valid_dp_sizes(global_batch_size, micro_batch_size, max_dp)})")
    elif cfg.rank_nodes or cfg.ranks_per_node is not None:
        for group in straddling_tp_groups(actor, tp, cfg.node_of)[:1]:
            problems.append(f"actor: TP group {list(group)} (tensor-parallel size {tp}) spans nodes "
                            f"{sorted({cfg.node_of(r) for r in group}, key=str)}; each TP group lies inside one node")
    return problems


def choose_actor_tp(actor: Sequence[int], current_tp: int, world_size: int, cfg: PolicyConfig,
                    global_batch_size: int, micro_batch_size: int) -> int | None:
    """The actor's tensor-parallel size on ranks ``actor``: the configured size
    (``cfg.actor_ranks_per_instance``, i.e. ``actor.tensor_parallel``: the user's choice, so the actor
    returns to it whenever it fits), else ``current_tp`` when it is usable there (see
    :func:`actor_tp_problems`), else the smallest usable one of ``cfg.tp_choices``; None when none
    is. An empty actor keeps ``current_tp``."""
    if not actor:
        return current_tp
    for tp in (cfg.actor_ranks_per_instance, current_tp, *cfg.tp_choices):
        if not actor_tp_problems(actor, tp, world_size, cfg, global_batch_size, micro_batch_size):
            return tp
    return None


def with_actor_tp(state: SchedState, decision: Decision | None) -> Decision | None:
    """``decision`` with ``actor_tp`` set when the tensor-parallel size in force does not suit its
    actor ranks and another choice does (see :func:`choose_actor_tp`); otherwise unchanged."""
    if decision is None or decision.actor_tp is not None or not decision.placement["actor"]:
        return decision
    tp = choose_actor_tp(decision.placement["actor"], state.tp, len(state.world_ranks), state.cfg,
                         state.batch.global_batch_size, state.batch.micro_batch_size)
    if tp is None or tp == state.tp:
        return decision
    return dataclasses.replace(decision, actor_tp=tp,
                               reason=f"{decision.reason}; actor tensor parallel {state.tp} -> {tp}")


def placement_problems(placement: Mapping[str, Sequence[int]], world: Sequence[int],
                       cfg: PolicyConfig, global_batch_size: int, micro_batch_size: int,
                       allow_empty_actor: bool = False, actor_tp: int | None = None,
                       allow_shared: bool = False) -> list[str]:
    """Why a placement is not usable (empty list when it is).

    Checks: no rank held twice (unless ``allow_shared``: collocated components, time-sliced by the
    static policy), no rank outside the allocation, rollout splits into whole instances, and the
    actor (or no ranks, when ``allow_empty_actor``) is usable at tensor-parallel size ``actor_tp``
    (default: ``cfg.actor_ranks_per_instance``): see :func:`actor_tp_problems`.
    """
    problems: list[str] = []
    world_set = set(world)
    owner: dict[int, str] = {}
    for comp, ranks in placement.items():
        for r in ranks:
            if r not in world_set:
                problems.append(f"{comp}: rank {r} is outside the allocation {sorted(world_set)}")
            if r in owner and not allow_shared:
                problems.append(f"rank {r} assigned to both {owner[r]} and {comp} (components share ranks "
                                "only under scheduler.policy static, which time-slices them)")
            owner[r] = comp
    rollout = tuple(placement.get("rollout", ()))
    if len(rollout) % cfg.rollout_ranks_per_instance:
        problems.append(f"rollout: {len(rollout)} ranks do not split into instances of "
                        f"{cfg.rollout_ranks_per_instance}")
    actor = tuple(placement.get("actor", ()))
    if not actor:
        if not allow_empty_actor:
            problems.append("actor: no ranks")
    else:
        tp = cfg.actor_ranks_per_instance if actor_tp is None else actor_tp
        problems.extend(actor_tp_problems(actor, tp, len(world_set), cfg, global_batch_size, micro_batch_size))
    return problems


def grow_actor(actor: Ranks, available: Sequence[Sequence[int]], state: SchedState) -> tuple[Ranks, int]:
    """Grow the actor to the most ranks that the ``available`` rank groups allow and that the
    actor can use: at the tensor-parallel size in force or, failing that, another of
    ``cfg.tp_choices`` (a valid DP size, each TP group inside one node; see
    :func:`choose_actor_tp`, which :func:`with_actor_tp` applies to the decision).

    ``available`` is an ordered list of rank groups, taken whole and in order (idle ranks one by
    one, then whole rollout instances, ...). Returns the new actor ranks and how many groups were
    consumed; ranks of the last consumed group that the actor does not need stay out of it.
    """
    cfg, world = state.cfg, len(state.world_ranks)
    gbs, mbs = state.batch.global_batch_size, state.batch.micro_batch_size
    room = len(actor) + sum(len(g) for g in available)
    sizes = sorted({dp * tp for tp in cfg.tp_choices for dp in valid_dp_sizes(gbs, mbs, world // tp)
                    if len(actor) < dp * tp <= room}, reverse=True)
    for n in sizes:
        taken, used = take_groups(available, n - len(actor))
        grown = tuple(sorted(actor + taken))
        if choose_actor_tp(grown, state.tp, world, cfg, gbs, mbs) is not None:
            return grown, used
    return actor, 0


def take_groups(available: Sequence[Sequence[int]], need: int) -> tuple[Ranks, int]:
    """The first ``need`` ranks of the ``available`` groups, taken whole and in order, and how
    many groups that consumed (fewer ranks when the groups hold fewer)."""
    taken: list[int] = []
    used = 0
    for group in available:
        if len(taken) >= need:
            break
        taken.extend(group)
        used += 1
    return tuple(taken[:need]), used


def setup_problems(initial: Mapping[str, Sequence[int]], world: Sequence[int], cfg: PolicyConfig,
                   global_batch_size: int, micro_batch_size: int, allow_shared: bool = False) -> list[str]:
    """Why an initial placement cannot be scheduled (empty list when it can): the
    ``placement_problems`` plus the needs of the policy options."""
    problems = placement_problems(initial, world, cfg, global_batch_size, micro_batch_size,
                                  allow_shared=allow_shared)
    actor = tuple(initial.get("actor", ()))
    if cfg.use_pre_process_policy and len(actor) % cfg.rollout_ranks_per_instance:
        problems.append(
            f"use_pre_process_policy: the actor's {len(actor)} ranks do not form whole rollout "
            f"instances of {cfg.rollout_ranks_per_instance} ranks")
    for comp in ("actor", "rollout"):
        if not initial.get(comp):
            problems.append(f"{comp}: no ranks in the initial placement")
    return problems
