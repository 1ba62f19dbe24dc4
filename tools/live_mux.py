"""The live part of ``tools/bench_mux.py --live``: a group run for real (emulated) against its jobs
run alone one after another, and against the simulator's prediction of the same group.

Times exclude process start-up on both sides: a group's span runs from the first phase start to
the last release (``slurm-rl inspect GROUP_DIR``), a solo run's from the release of its first
iteration to its final gate. GPU-seconds = slots of the group x span (the same slots, held by the
group for its span, or by each solo run in turn).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _solo_seconds(run_dir: Path) -> float:
    from slurm_rl.control.events import read_events
    from slurm_rl.control.paths import RunPaths

    released = [e["released_at"] for e in read_events(RunPaths(run_dir), "release")]
    return released[-1] - released[0]


def live_section(group_file: Path) -> dict[str, Any]:
    """Run ``group_file`` with ``slurm-rl mux``, each job alone with ``slurm-rl run``; figures."""
    from slurm_rl.mux.group_file import load_group
    from slurm_rl.inspect.group_timeline import group_report_json
    from slurm_rl.mux.predict import predict_group

    tmp = Path(tempfile.mkdtemp(prefix="bench-mux-"))
    group_dir = tmp / "group"
    spec = load_group(group_file, [f"group.dir={group_dir}"])
    predicted = predict_group([j.cfg for j in spec.jobs], [j.name for j in spec.jobs], spec.pools["rollout"],
                              spec.pools["train"], spec.tail_fraction, spec.tail_slots,
                              {"rollout": 2 * spec.park_s, "train": 2 * spec.park_s})
    proc = subprocess.run([sys.executable, "-m", "slurm_rl.cli", "mux", str(group_file), f"group.dir={group_dir}"],
                          cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"group run failed: {proc.stdout}{proc.stderr}")
    report = group_report_json(group_dir)
    span = float(report["span"]["seconds"])
    solo: dict[str, float] = {}
    for job in spec.jobs:
        run_dir = tmp / f"solo-{job.name}"
        proc = subprocess.run([sys.executable, "-m", "slurm_rl.cli", "run", str(job.config_path), *job.overrides,
                               f"runtime.run_dir={run_dir}", "--no-inspect"], cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"solo run of {job.name} failed: {proc.stdout}{proc.stderr}")
        solo[job.name] = round(_solo_seconds(run_dir), 2)
    slots = len(spec.slots)
    sequential = sum(solo.values())
    return {
        "group": str(group_file), "jobs": [j.name for j in spec.jobs], "slots": slots,
        "measured": {"group_span_s": round(span, 2), "sequential_s": round(sequential, 2), "solo_s": solo,
                     "gpu_s_mux": round(slots * span, 1), "gpu_s_sequential": round(slots * sequential, 1),
                     "cost_ratio_sequential_over_mux": round(sequential / span, 3),
                     "slowdown": {j: r.get("slowdown") for j, r in report["jobs"].items()},
                     "pools": {p: {k: r.get(k) for k in ("busy_fraction", "bubble_fraction")}
                               for p, r in report["pools"].items()}},
        "predicted": {"group_span_s": round(predicted["makespan_s"], 2),
                      "sequential_s": round(predicted["sequential_s"], 2),
                      "slowdown": predicted["slowdown"]},
        "error_vs_prediction": round(span / predicted["makespan_s"] - 1.0, 4),
        "group_dir": str(group_dir),
    }
