"""The benchmark scripts still run end to end on a tiny setting and print the JSON they promise
(their figures are reported in notes, never asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, str(REPO / "tools" / script), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_bench_scheduling_prints_every_policy_of_a_cell() -> None:
    out = _run("bench_scheduling.py", "--profiles", "math_rl", "--gpus", "8", "--iterations", "1",
               "--seeds", "0", "--jobs", "1")
    cell = out["simulated"]["math_rl"]["8"]
    for policy in out["policies"]:
        row = cell[policy]
        assert len(row["iteration_s"]) == 1 and row["iteration_s"][0] > 0, (policy, row)
    assert cell["static"]["speedup_vs_static"] == 1.0
    assert "speedup_math_rl" in out["targets"]


def test_bench_mux_prints_the_trace_comparison() -> None:
    out = _run("bench_mux.py", "--jobs", "4", "--seeds", "0")
    assert "mux" in out["mux_variants"] and out["prices_per_gpu_hour"]


@pytest.mark.slow  # three processes import torch, megatron-core and transformers (a real gloo weight sync)
def test_bench_load_prints_a_json_line_per_section(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "bench_load.py"), "--scale",
                           "small", "--dir", str(tmp_path), "--repeat", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {row["section"]: row for row in map(json.loads, proc.stdout.splitlines())}
    assert set(rows) == {"checkpoint", "raw", "raw_cold", "actor", "rollout", "sync"}
    assert rows["checkpoint"]["written_now"] and rows["checkpoint"]["architecture"] == "qwen2"
    params = rows["checkpoint"]["parameters"]
    assert rows["actor"]["parameters"] == rows["rollout"]["parameters"] == params
    assert rows["raw"]["bytes"] == rows["actor"]["bytes"] == 2 * params  # bf16, read once each
    assert rows["actor"]["load_vs_raw_fp32_kept"] > 0 and rows["rollout"]["load_s_min"] > 0
    assert rows["sync"]["bytes"] == 4 * params and rows["sync"]["equal"]  # fp32 over the wire
