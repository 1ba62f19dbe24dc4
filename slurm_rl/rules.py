"""Rules shared by the config's validation and the scheduler, kept below both (pure functions, no imports
from the rest of the package): which DP sizes a mini-batch splits over, when the actor holds every rank, and
RLinf's range notation for rank lists. ``slurm_rl.scheduler.state``, ``slurm_rl.scheduler.collocated`` and
``slurm_rl.inspect.epoch_log`` re-export them under their old homes."""

from __future__ import annotations

from typing import Iterable, Mapping


def valid_dp_sizes(global_batch_size: int, micro_batch_size: int, max_dp: int) -> list[int]:
    """Data-parallel sizes the actor may take, ascending.

    The rule: a DP size ``dp`` is valid when the samples of one mini-batch divide evenly over the
    replicas in whole micro-batches, i.e. ``global_batch_size % (micro_batch_size * dp) == 0``.
    Changing DP then only changes gradient accumulation, never the global batch (training math does
    not depend on placement). The actor engine (``engines.actor.microbatch``) calls this rule too.
    """
    if global_batch_size <= 0 or micro_batch_size <= 0:
        raise ValueError(
            f"valid_dp_sizes: global_batch_size={global_batch_size} and "
            f"micro_batch_size={micro_batch_size} must be positive")
    return [dp for dp in range(1, max_dp + 1)
            if global_batch_size % (micro_batch_size * dp) == 0]


def actor_holds_every_rank(placement: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether the actor serves every rank that ``placement`` uses (``auto`` has then no rank to grow it into)."""
    used = {r for ranks in placement.values() for r in ranks}
    return used <= set(placement.get("actor", ()))


def compress_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"`` (the RLinf range notation)."""
    out: list[str] = []
    sorted_ranks = sorted(set(ranks))
    i = 0
    while i < len(sorted_ranks):
        j = i
        while j + 1 < len(sorted_ranks) and sorted_ranks[j + 1] == sorted_ranks[j] + 1:
            j += 1
        out.append(str(sorted_ranks[i]) if i == j else f"{sorted_ranks[i]}-{sorted_ranks[j]}")
        i = j + 1
    return ",".join(out) or "-"
