#!/usr/bin/env python3
"""Scheduling benchmark: end-to-end time per iteration under each policy, printed as JSON.

Simulated half (default): the math-RL profile (``slurm_rl.scheduler.profiles.math_rl``) at 8, 64
and 256 GPUs under ``static``, ``auto``, ``auto+pre_process`` and ``auto+wait_before_last_iter``.

Live half (``--live``): the same profile as emulated live runs at 8 and 32 ranks (one local
process per rank, real epochs, acks, Arrow hand-off, mid-iteration decisions), with every cost
scaled by ``--live-time-scale`` so an iteration takes seconds and token counts divided by
``--live-token-scale`` (per-token costs multiplied: same seconds), next to the simulator's
prediction for the very same config (the calibration target is agreement within 10 %).
Per-iteration live times are gate-to-gate (``release`` events of the coordinator).

    python tools/bench_scheduling.py [--gpus 8,64,256] [--iterations 3] [--seeds 0,1,2] [--live]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slurm_rl.scheduler.profiles import math_rl, scaled_for_live
from slurm_rl.scheduler.simulate import simulate

POLICIES = ("static", "auto", "auto+pre_process", "auto+wait_before_last_iter")
#: Publish-to-all-acked latency of a live epoch as measured on the emulated runs (about 0.1 s);
#: the simulator is told the same, so the two model one system.
LIVE_SWITCH_LATENCY_S = 0.1


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


def live_config(gpus: int, iterations: int, time_scale: float, token_scale: float, run_dir: Path,
                policy: str) -> dict[str, Any]:
    """The math-RL profile as an emulated live run: every cost times ``time_scale`` (an iteration
    takes seconds), and responses/prompts ``token_scale`` times shorter with per-token costs
    ``token_scale`` times higher (the same seconds, smaller Arrow payloads). The simulator gets
    the very same config, so the two are compared on one workload."""
    cfg = scaled_for_live(math_rl(gpus, num_iterations=iterations), time_scale, token_scale)
    base, _, opts = policy.partition("+")
    cfg["scheduler"].update(policy=base, switch_latency_s=LIVE_SWITCH_LATENCY_S)
    cfg["cluster"].update(auto_scheduler=base == "auto", use_pre_process_policy="pre_process" in opts,
                          use_wait_before_last_iter_policy="wait_before_last_iter" in opts)
    cfg["runtime"] = {"device": "emulated", "run_dir": str(run_dir), "heartbeat_timeout_s": 60.0,
                      "ack_timeout_s": 60.0, "wait_timeout_s": 120.0, "run_timeout_s": 900.0}
    return cfg


def run_live(cfg: dict[str, Any], workdir: Path) -> list[float]:
    """Run ``cfg`` with one local process per rank; seconds per iteration (gate to gate)."""
    import yaml

    from slurm_rl.control.events import read_events
    from slurm_rl.control.paths import RunPaths
    from slurm_rl.launch.local import run_local  # lazy: the runtime is only needed here
    from slurm_rl.launch.prepare import prepare_run

    path = workdir / (Path(cfg["runtime"]["run_dir"]).name + ".yaml")
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    resolved, run_dir = prepare_run(path)
    run_local(run_dir, resolved.placement.world_size, timeout_s=resolved.runtime.run_timeout_s)
    released = [e["released_at"] for e in read_events(RunPaths(run_dir), "release")]
    return [b - a for a, b in zip(released, released[1:])]


def live(ranks: list[int], iterations: int, time_scales: list[float], token_scale: float, root: Path,
         policies: list[str]) -> dict[str, Any]:
    """Emulated live runs next to the simulator's prediction for the same configs
    (``time_scales[i]`` for ``ranks[i]``; one value for all)."""
    out: dict[str, Any] = {}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i, n in enumerate(ranks):
        time_scale = time_scales[min(i, len(time_scales) - 1)]
        row: dict[str, Any] = {"time_scale": time_scale}
        for policy in policies:
            run_dir = root / f"bench-{stamp}-{n}-{policy.replace('+', '-')}"
            cfg = live_config(n, iterations, time_scale, token_scale, run_dir, policy)
            t0 = time.perf_counter()
            times = run_live(cfg, root)
            wall = time.perf_counter() - t0
            sim = simulate(cfg, policy=policy)
            sim_times = [it.time_s for it in sim.iterations]
            row[policy] = {
                "live_iteration_s": [round(t, 3) for t in times],
                "simulated_iteration_s": [round(t, 3) for t in sim_times],
                "live_total_s": round(sum(times), 3),
                "simulated_total_s": round(sum(sim_times), 3),
                "live_vs_simulated": round(sum(times) / sum(sim_times) - 1, 3),
                "live_wall_s": round(wall, 1),
                "run_dir": str(run_dir),
            }
        base = row["static"]["live_total_s"] if "static" in row else None
        for policy in policies:
            if base:
                row[policy]["live_reduction_vs_static"] = round(1 - row[policy]["live_total_s"] / base, 3)
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
    ap.add_argument("--live-time-scale", default="0.1,0.2",
                    help="cost multiplier per --live-ranks entry. The control plane's own latency "
                         "(~0.1 s per placement switch: polling, acks) does not shrink with it, so at "
                         "0.01 a switch weighs as much as 10 s of a full-scale iteration and auto loses "
                         "4 points of its gain; 0.1 (8 ranks) and 0.2 (32 ranks on 2 cores) keep it small")
    ap.add_argument("--live-token-scale", type=float, default=16.0)
    ap.add_argument("--live-policies", default=",".join(POLICIES))
    ap.add_argument("--live-dir", default="/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir(),
                    help="where the live run dirs go (tmpfs keeps fsync out of the figures)")
    ap.add_argument("--no-sim", action="store_true", help="skip the simulated half")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {
        "profile": "math_rl",
        "policies": list(POLICIES),
    }
    if not args.no_sim:
        result["simulated"] = simulated([int(g) for g in args.gpus.split(",")], args.iterations,
                                        [int(s) for s in args.seeds.split(",")])
    if args.live:
        root = Path(args.live_dir) / "slurm_rl_bench"
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        result["live"] = {
            "token_scale": args.live_token_scale,
            "switch_latency_s": LIVE_SWITCH_LATENCY_S,
            "ranks": live([int(n) for n in args.live_ranks.split(",")], args.iterations,
                          [float(x) for x in args.live_time_scale.split(",")], args.live_token_scale, root,
                          args.live_policies.split(",")),
        }
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
