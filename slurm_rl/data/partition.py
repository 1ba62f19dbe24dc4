"""Token-balanced split of a stage across the data-parallel ranks of the current epoch."""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from slurm_rl.data.errors import DataPlaneError
from slurm_rl.data.reader import StageReader
from slurm_rl.data.shardio import row_tokens


def partition_by_tokens(token_counts: Sequence[int], dp_size: int) -> list[list[int]]:
    """Split item indices into ``dp_size`` bins of near-equal token sums, deterministically.

    Greedy longest-processing-time: items by decreasing tokens (ties: lower index first) go
    to the currently lightest bin (ties: fewer items, then lower bin). Indices are sorted within
    each bin. The heaviest bin exceeds the lightest by at most the largest single item.
    """
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        raise DataPlaneError(f"dp_size must be a positive int, got {dp_size!r}")
    counts = np.asarray(token_counts, dtype=np.int64)
    if counts.ndim != 1 or (counts < 0).any():
        raise DataPlaneError("token_counts must be a flat sequence of non-negative ints")
    order = np.lexsort((np.arange(len(counts)), -counts))
    heap = [(0, 0, b) for b in range(dp_size)]
    bins: list[list[int]] = [[] for _ in range(dp_size)]
    for i in order.tolist():
        load, n, b = heapq.heappop(heap)
        bins[b].append(i)
        heapq.heappush(heap, (load + int(counts[i]), n + 1, b))
    return [sorted(b) for b in bins]


def _unit_rows(table: pa.Table, group_column: str | None) -> tuple[list[np.ndarray], np.ndarray]:
    """Partition units (single rows, or whole groups) and their token counts."""
    tokens = row_tokens(table)
    if group_column is None:
        return [np.array([i]) for i in range(table.num_rows)], tokens
    groups = table.column(group_column).to_numpy()
    uniq, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    members = np.split(order, np.cumsum(np.bincount(inverse, minlength=len(uniq)))[:-1])
    return members, np.array([tokens[m].sum() for m in members], dtype=np.int64)


def dp_share_indices(table: pa.Table, dp_rank: int, dp_size: int, *, group_column: str | None = None) -> np.ndarray:
    """Row indices of ``table`` that belong to ``dp_rank`` out of ``dp_size`` (token-balanced).

    With ``group_column`` whole groups stay on one rank (e.g. GRPO groups).
    """
    if not 0 <= dp_rank < dp_size:
        raise DataPlaneError(f"dp_rank {dp_rank} outside [0, dp_size={dp_size})")
    members, unit_tokens = _unit_rows(table, group_column)
    bins = partition_by_tokens(unit_tokens, dp_size)
    mine = [members[u] for u in bins[dp_rank]]
    return np.sort(np.concatenate(mine)) if mine else np.zeros(0, dtype=np.int64)


def take_dp_share(table: pa.Table, dp_rank: int, dp_size: int, *, group_column: str | None = None) -> pa.Table:
    """The rows of ``table`` for ``dp_rank`` of ``dp_size``, token-balanced."""
    return table.take(pa.array(dp_share_indices(table, dp_rank, dp_size, group_column=group_column), type=pa.int64()))


def read_dp_share(
    run_dir: str | Path,
    iteration: int,
    stage: str,
    producer_ranks: Sequence[int] | None,
    dp_rank: int,
    dp_size: int,
    *,
    poll_interval_s: float = 0.05,
    timeout_s: float = 600.0,
    schema: pa.Schema | None = None,
    group_column: str | None = None,
    who: str | None = None,
) -> pa.Table:
    """Wait for the whole stage and return this DP rank's token-balanced share.

    Every DP rank computes the same partition from the same (complete) stage, so the shares
    are disjoint and cover every row, whatever ``dp_size`` the current epoch has.
    """
    table = StageReader(
        run_dir, iteration, stage, producer_ranks, poll_interval_s, timeout_s, schema=schema, who=who
    ).read_all()
    return take_dp_share(table, dp_rank, dp_size, group_column=group_column)


def iter_dp_share(
    reader: StageReader, dp_rank: int, dp_size: int, *, group_column: str | None = None
) -> Iterator[pa.Table]:
    """Streaming variant: split every shard by tokens as it arrives and yield this rank's part.

    Deterministic whatever the arrival order (the split of a shard depends only on its content
    and on (producer rank, seq)); the bin order is rotated per shard so the heaviest item of
    each shard does not always land on the same rank.
    """
    if not 0 <= dp_rank < dp_size:
        raise DataPlaneError(f"dp_rank {dp_rank} outside [0, dp_size={dp_size})")
    for shard in reader.iter_entries():
        members, unit_tokens = _unit_rows(shard.table, group_column)
        bins = partition_by_tokens(unit_tokens, dp_size)
        rotated = bins[(dp_rank + shard.producer_rank + shard.seq) % dp_size]
        rows = [members[u] for u in rotated]
        idx = np.sort(np.concatenate(rows)) if rows else np.zeros(0, dtype=np.int64)
        yield shard.table.take(pa.array(idx, type=pa.int64()))
