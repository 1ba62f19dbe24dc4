"""Per-rank progress documents (``progress/rank-NNNN.json``) that the scheduler reads."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.paths import RunPaths


def write_progress(paths: RunPaths, rank: int, doc: dict[str, Any]) -> None:
    """Atomically replace the rank's progress file with ``doc`` plus ``rank`` and ``time``.

    Not fsynced: progress is rewritten often and a lost update is replaced by the next one.
    """
    atomic_write_json(paths.progress(rank), {**doc, "rank": rank, "time": time.time()}, durable=False)


def read_all_progress(paths: RunPaths, ranks: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Progress of each rank that has written one (one ``open`` per rank; absent ranks are left out)."""
    out: dict[int, dict[str, Any]] = {}
    for rank in ranks:
        try:
            out[rank] = read_json(paths.progress(rank))
        except FileNotFoundError:
            continue
    return out
