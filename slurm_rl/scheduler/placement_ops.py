"""Pure helpers on placements: instances, idle ranks, the iteration-start layout, validation."""

from __future__ import annotations

from typing import Mapping, Sequence

from slurm_rl.scheduler.state import (
    RankMap,
    PolicyConfig,
    Ranks,
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


def placement_problems(placement: Mapping[str, Sequence[int]], world: Sequence[int],
                       cfg: PolicyConfig, global_batch_size: int, micro_batch_size: int,
                       allow_empty_actor: bool = False) -> list[str]:
    """Why a placement is not usable (empty list when it is).

    Checks: no rank held twice, no rank outside the allocation, rollout splits into whole
    instances, and the actor has a valid DP size (or no ranks, when ``allow_empty_actor``).
    """
    problems: list[str] = []
    world_set = set(world)
    owner: dict[int, str] = {}
    for comp, ranks in placement.items():
        for r in ranks:
            if r not in world_set:
                problems.append(f"{comp}: rank {r} is outside the allocation {sorted(world_set)}")
            if r in owner:
                problems.append(f"rank {r} assigned to both {owner[r]} and {comp}")
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
        tp = cfg.actor_ranks_per_instance
        dp, rest = divmod(len(actor), tp)
        max_dp = len(world_set) // tp
        if rest or dp not in valid_dp_sizes(global_batch_size, micro_batch_size, max_dp):
            problems.append(
                f"actor: {len(actor)} ranks give DP {len(actor) / tp:g}, not a valid DP size "
                f"(global_batch_size % (micro_batch_size * dp) == 0 with "
                f"global_batch_size={global_batch_size}, micro_batch_size={micro_batch_size}: "
                f"{valid_dp_sizes(global_batch_size, micro_batch_size, max_dp)})")
    return problems


def grow_actor(actor: Ranks, available: Sequence[Sequence[int]], cfg: PolicyConfig,
               valid_dps: Sequence[int]) -> tuple[Ranks, int]:
    """Grow the actor to the largest valid DP that the ``available`` rank groups allow.

    ``available`` is an ordered list of rank groups, taken whole and in order (idle ranks one by
    one, then whole rollout instances, ...). Returns the new actor ranks and how many groups were
    consumed; ranks of the last consumed group that the actor does not need stay out of it.
    """
    tp = cfg.actor_ranks_per_instance
    cur_dp = len(actor) // tp
    total = sum(len(g) for g in available)
    bigger = [dp for dp in valid_dps if dp > cur_dp and (dp - cur_dp) * tp <= total]
    if not bigger:
        return actor, 0
    taken, used = take_groups(available, (max(bigger) - cur_dp) * tp)
    return tuple(sorted(actor + taken)), used


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
                   global_batch_size: int, micro_batch_size: int) -> list[str]:
    """Why an initial placement cannot be scheduled (empty list when it can): the
    ``placement_problems`` plus the needs of the policy options."""
    problems = placement_problems(initial, world, cfg, global_batch_size, micro_batch_size)
    actor = tuple(initial.get("actor", ()))
    if cfg.use_pre_process_policy and len(actor) % cfg.rollout_ranks_per_instance:
        problems.append(
            f"use_pre_process_policy: the actor's {len(actor)} ranks do not form whole rollout "
            f"instances of {cfg.rollout_ranks_per_instance} ranks")
    for comp in ("actor", "rollout"):
        if not initial.get(comp):
            problems.append(f"{comp}: no ranks in the initial placement")
    return problems
