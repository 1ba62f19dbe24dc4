#!/usr/bin/env python3
"""Scheduling benchmark: end-to-end time per iteration under each policy, printed as JSON.

Simulated half (default): the math-RL profile (``slurm_rl.scheduler.profiles.math_rl``) at 8, 64
and 256 GPUs under ``static``, ``auto``, ``auto+pre_process`` and ``auto+wait_before_last_iter``.

Live half (``--live``): the same profile as emulated runs at 8 and 32 ranks through
``slurm_rl.launch.local.run_local(cfg)`` (imported only then), with every cost scaled by
``--live-time-scale`` so an iteration takes seconds, next to the simulator's figure for the same
config (the calibration target is agreement within 10 %).

    python tools/bench_scheduling.py [--gpus 8,64,256] [--iterations 3] [--seeds 0,1,2] [--live]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from typing import Any

from slurm_rl.scheduler.profiles import math_rl
from slurm_rl.scheduler.simulate import simulate

POLICIES = ("static", "auto", "auto+pre_process", "auto+wait_before_last_iter")


def simulated(gpus: list[int], iterations: int, seeds: list[int]) -> dict[str, Any]:
    """Mean end-to-end seconds per iteration, per GPU count and policy, over ``seeds``."""
    out: dict[str, Any] = {}
    for g in gpus:
        cfg = math_rl(g, num_iterations=iterations)
        row: dict[str, Any] = {}
        for policy in POLICIES:
            t0 = time.perf_counter()
            reports = [simulate(cfg, policy=policy, seed=s) for s in seeds]
            per_iter = [round(statistics.mean(r.iterations[i].time_s for r in reports), 2)
                        for i in range(iterations)]
            row[policy] = {
                "iteration_s": per_iter,
                "mean_iteration_s": round(statistics.mean(r.mean_iteration_s for r in reports), 2),
                "placement_changes_per_iteration": round(statistics.mean(
                    it.placement_changes for r in reports for it in r.iterations), 2),
                "bubble_fraction": round(statistics.mean(
                    it.bubble_gpu_s / (g * it.time_s) for r in reports for it in r.iterations), 3),
                "sim_wall_s": round(time.perf_counter() - t0, 2),
            }
        base = row["static"]["mean_iteration_s"]
        for policy in POLICIES:
            row[policy]["reduction_vs_static"] = round(1 - row[policy]["mean_iteration_s"] / base, 3)
        out[str(g)] = row
    return out


def _scaled(cfg: dict[str, Any], scale: float) -> dict[str, Any]:
    cfg = copy.deepcopy(cfg)
    for key in ("rollout_s_per_token", "inference_s_per_token", "actor_s_per_token",
                "reshard_s_per_gb"):
        cfg["emulated"][key] *= scale
    cfg.setdefault("runtime", {})["device"] = "emulated"
    return cfg


def live(ranks: list[int], iterations: int, scale: float) -> dict[str, Any]:
    """Emulated live runs (needs the local launcher), next to the simulator on the same config."""
    from slurm_rl.launch.local import run_local  # lazy: the runtime is only needed here

    out: dict[str, Any] = {}
    for n in ranks:
        row: dict[str, Any] = {}
        for policy in POLICIES:
            cfg = _scaled(math_rl(n, num_iterations=iterations), scale)
            base, _, opts = policy.partition("+")
            cfg["scheduler"]["policy"] = base
            cfg["cluster"]["auto_scheduler"] = base == "auto"
            cfg["cluster"]["use_pre_process_policy"] = "pre_process" in opts
            cfg["cluster"]["use_wait_before_last_iter_policy"] = "wait_before_last_iter" in opts
            t0 = time.perf_counter()
            result = run_local(cfg)
            wall = time.perf_counter() - t0
            sim = simulate(cfg, policy=policy)
            row[policy] = {"live_wall_s": round(wall, 2),
                           "live_result": result if _jsonable(result) else repr(result),
                           "simulated_total_s": round(sim.total_time_s, 2)}
        out[str(n)] = row
    return out


def _jsonable(obj: Any) -> bool:
    try:
        json.dumps(obj)
        return True
    except (TypeError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="8,64,256")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--live", action="store_true", help="also run emulated live runs")
    ap.add_argument("--live-ranks", default="8,32")
    ap.add_argument("--live-time-scale", type=float, default=0.01)
    args = ap.parse_args(argv)
    result: dict[str, Any] = {
        "profile": "math_rl",
        "policies": list(POLICIES),
        "simulated": simulated([int(g) for g in args.gpus.split(",")], args.iterations,
                               [int(s) for s in args.seeds.split(",")]),
    }
    if args.live:
        result["live"] = live([int(n) for n in args.live_ranks.split(",")], args.iterations,
                              args.live_time_scale)
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
