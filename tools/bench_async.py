#!/usr/bin/env python3
"""The quickstart run asynchronously: wall time, learning and staleness per ``algorithm.max_staleness``, as JSON.

Each bound runs ``configs/quickstart.yaml`` (4 cpu ranks: actor 0, rollout 1-2, inference 3) under
``scheduler.policy static`` (an async run's), and the quickstart as shipped (``auto``, on-policy) beside them.
One JSON line per run:
- ``max_staleness``, ``policy``; ``wall_s`` (the ``slurm-rl run`` command, start-up included) and
  ``iterations_s`` (first gate to the last, the training itself); ``iteration_s_median``;
- ``reward_last20``: the mean reward over the last 20 iterations (the quickstart learns when it is >= 0.8);
- ``staleness_max`` and ``staleness_counts`` over every actor batch (the samples' policy versions as the
  cutter saw them), and ``within_bound``: ``staleness_max <= max_staleness``;
- ``mismatch_kl_mean``: KL(rollout policy || actor) per token, the off-policy gap the loss trains against;
- ``partial_rollout`` (``--partial``: the bounds >= 1 run with ``rollout.partial_rollout``, weights landing
  mid-generation and requests carried over the gates) and ``mixed_versions``: samples two versions drew;
- ``placement``: ``--placement`` (the bounded runs' ``cluster.component_placement``), else null (the quickstart's).

    .venv/bin/python tools/bench_async.py [--staleness 0,1,2] [--iterations 300] [--no-auto] [--partial]
        [--placement PLACEMENT]

Needs ``runs/toy`` (``tools/make_toy_files.py runs/toy``, which ``tools/quickstart.sh`` runs). A 300-iteration
run takes ~3 minutes on a 2-core host.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run(run_dir: Path, iterations: int, overrides: list[str]) -> float:
    """``slurm-rl run`` the quickstart with ``overrides``; its wall seconds."""
    sys.path.insert(0, str(REPO))
    from slurm_rl.launch import zygote

    args = ["run", "configs/quickstart.yaml", f"runtime.run_dir={run_dir}", f"train.num_iterations={iterations}",
            *overrides, "--no-inspect"]
    cmd = zygote.command("slurm_rl.cli", args, "cpu", dict(os.environ))  # forked where a zygote serves
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench_async: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.time() - t0


def figures(run_dir: Path, bound: int, policy: str, wall: float, partial: bool = False) -> dict[str, Any]:
    """One run's JSON line (module docstring)."""
    from slurm_rl.control.events import read_events
    from slurm_rl.control.paths import RunPaths
    from slurm_rl.metrics import read_metrics

    rows = read_metrics(run_dir)
    released = [e["released_at"] for e in read_events(RunPaths(run_dir), "release")]
    gaps = [b - a for a, b in zip(released, released[1:])]
    counts: dict[str, int] = {}
    for r in rows:
        for s, n in (r.get("staleness/counts") or {}).items():
            counts[s] = counts.get(s, 0) + int(n)
    worst = max((int(s) for s in counts), default=0)
    mismatch = [r["mismatch/kl"] for r in rows if r.get("mismatch/kl") is not None]
    return {"max_staleness": bound, "policy": policy, "iterations": len(rows), "wall_s": round(wall, 1),
            "iterations_s": round(released[-1] - released[0], 1) if released else None,
            "iteration_s_median": round(statistics.median(gaps), 3) if gaps else None,
            "reward_last20": round(statistics.fmean(r["reward_mean"] for r in rows[-20:]), 4),
            "staleness_max": worst, "staleness_counts": dict(sorted(counts.items())),
            "within_bound": worst <= bound,
            "mismatch_kl_mean": round(statistics.fmean(mismatch), 6) if mismatch else None,
            "partial_rollout": partial,
            "mixed_versions": sum(int(r.get("staleness/mixed_versions") or 0) for r in rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--staleness", default="0,1,2", help="the bounds to run (comma-separated)")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--no-auto", action="store_true", help="leave out the quickstart as shipped (auto)")
    parser.add_argument("--partial", action="store_true", help="bounds >= 1 with rollout.partial_rollout")
    parser.add_argument("--placement", help="cluster.component_placement of the bounded runs, e.g. "
                        "\"{'actor,inference': '0-1', 'rollout': '2-3'}\" (verl's fully async layout)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    placed = [f"cluster.component_placement={args.placement}"] if args.placement else []
    runs = [(int(k), "static", ["cluster.auto_scheduler=false", f"algorithm.max_staleness={int(k)}", *placed,
                                *(["rollout.partial_rollout=true"] if args.partial and int(k) >= 1 else [])])
            for k in args.staleness.split(",")]
    if not args.no_auto:
        runs.append((0, "auto", []))
    with tempfile.TemporaryDirectory(prefix="bench_async-") as tmp:
        for i, (bound, policy, overrides) in enumerate(runs):
            run_dir = Path(tmp) / f"run{i}"
            wall = run(run_dir, args.iterations, overrides)
            partial = "rollout.partial_rollout=true" in overrides
            placement = args.placement if placed and placed[0] in overrides else None
            print(json.dumps({**figures(run_dir, bound, policy, wall, partial), "placement": placement}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
