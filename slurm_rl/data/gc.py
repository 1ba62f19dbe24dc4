"""Delete iteration directories every stage has consumed, keeping the last few for inspection."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from slurm_rl.data.errors import DataPlaneError
from slurm_rl.data.layout import data_root, parse_iteration_dirname
from slurm_rl.fsio import rename


def list_iterations(run_dir: str | Path) -> list[int]:
    """Iteration numbers present under ``RUN_DIR/data`` (sorted)."""
    root = data_root(run_dir)
    if not root.is_dir():
        return []
    its = (parse_iteration_dirname(p.name) for p in root.iterdir() if p.is_dir())
    return sorted(i for i in its if i is not None)


def collect_garbage(run_dir: str | Path, consumed_through_iteration: int, keep_last: int) -> list[int]:
    """Delete ``iter-*`` dirs with number <= ``consumed_through_iteration`` except the newest
    ``keep_last`` of those; never touches later iterations. Returns the deleted iterations.

    A directory is first renamed to a hidden name, so a half-deleted iteration never looks valid.
    """
    if keep_last < 0:
        raise DataPlaneError(f"keep_last must be >= 0, got {keep_last}")
    root = data_root(run_dir)
    consumed = [i for i in list_iterations(run_dir) if i <= consumed_through_iteration]
    victims = consumed[: max(0, len(consumed) - keep_last)]
    for i in victims:
        src = root / f"iter-{i:06d}"
        doomed = root / f".deleting-{src.name}-{uuid.uuid4().hex[:8]}"
        try:
            rename(src, doomed)
        except FileNotFoundError:  # another collector got there first
            continue
        shutil.rmtree(doomed)
    for leftover in root.glob(".deleting-iter-*") if root.is_dir() else []:
        shutil.rmtree(leftover, ignore_errors=True)  # from an earlier interrupted collection
    return victims
