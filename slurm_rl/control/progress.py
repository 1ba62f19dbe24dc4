"""Per-rank progress documents (``progress/rank-NNNN.json``) that the scheduler reads."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.validate import check_equal, check_fields

PROGRESS_FIELDS = {"host": "str", "state": "str", "iteration": "int?", "epoch": "int?", "roles": "list"}


def write_progress(paths: RunPaths, rank: int, doc: dict[str, Any]) -> None:
    """Atomically replace the rank's progress file with ``doc`` plus ``rank`` and ``time``.

    Not fsynced: progress is rewritten often and a lost update is replaced by the next one.
    """
    atomic_write_json(paths.progress(rank), {**doc, "rank": rank, "time": time.time()}, durable=False, fs=paths.fs)


def read_all_progress(paths: RunPaths, ranks: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Progress of each rank that has written one (one ``open`` per rank; absent ranks are left out).

    ``TornFileError`` naming the file and field for a document that is not a progress report."""
    out: dict[int, dict[str, Any]] = {}
    for rank in ranks:
        path = paths.progress(rank)
        try:
            doc = read_json(path, fs=paths.fs)
        except FileNotFoundError:
            continue
        check_equal(doc, path, rank=rank)
        check_fields(doc, path, {"time": "number"}, PROGRESS_FIELDS)
        out[rank] = doc
    return out
