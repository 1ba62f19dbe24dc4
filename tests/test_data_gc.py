"""Garbage collection of consumed iterations."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_rl.data import ROLLOUTS, DataPlaneError, StageWriter, collect_garbage, list_iterations
from slurm_rl.data.emulated import make_fake_prompts, make_fake_rollouts
from slurm_rl.data.layout import data_root


def _make_iterations(run_dir: Path, n: int) -> None:
    table = make_fake_rollouts(make_fake_prompts(0, 2, 4, seed=0), 2, 4)
    for it in range(n):
        with StageWriter(run_dir, it, "rollouts", 0, ROLLOUTS, fsync=False) as w:
            w.write(table)


def test_gc_keeps_last_k_consumed_and_everything_later(tmp_path: Path) -> None:
    _make_iterations(tmp_path, 10)
    (data_root(tmp_path) / "notes").mkdir()  # unrelated entries are left alone
    assert collect_garbage(tmp_path, consumed_through_iteration=7, keep_last=2) == [0, 1, 2, 3, 4, 5]
    assert list_iterations(tmp_path) == [6, 7, 8, 9]
    assert (data_root(tmp_path) / "notes").is_dir()
    assert not list(data_root(tmp_path).glob(".deleting-*"))
    assert collect_garbage(tmp_path, 7, 2) == []  # idempotent
    assert collect_garbage(tmp_path, 9, 0) == [6, 7, 8, 9]
    assert list_iterations(tmp_path) == []


def test_gc_keep_more_than_present_and_leftovers(tmp_path: Path) -> None:
    _make_iterations(tmp_path, 3)
    leftover = data_root(tmp_path) / ".deleting-iter-000000-dead"
    (leftover / "x").mkdir(parents=True)
    assert collect_garbage(tmp_path, 2, keep_last=5) == []
    assert list_iterations(tmp_path) == [0, 1, 2]
    assert not leftover.exists()
    with pytest.raises(DataPlaneError):
        collect_garbage(tmp_path, 2, keep_last=-1)
    assert collect_garbage(tmp_path / "nothing-here", 5, 1) == []
