"""Smoke run of tools/bench_control_plane.py: it runs real worker processes and prints its JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cli_command import tool

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_control_plane_prints_its_figures(tmp_path: Path) -> None:
    proc = subprocess.run([*tool("bench_control_plane.py"), "--ranks", "3",
                           "--epochs", "3", "--idle-s", "1.5", "--run-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (result,) = report["results"]
    assert result["ranks"] == 3 and result["epochs"] == 3
    assert 0 < result["publish_to_all_acked_ms"]["p50"] <= result["publish_to_all_acked_ms"]["max"]
    assert result["idle_counter"]["epoch_polls_per_rank_s_mean"] > 0
    assert sorted(p.name for p in (tmp_path / "ranks-3" / "control" / "acks").iterdir()) == [
        f"{n:06d}" for n in range(7)]  # warmup, 3 switches, idle, idle-end, stop
