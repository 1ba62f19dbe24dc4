#!/usr/bin/env python3
"""Scheduling benchmark: end-to-end time per iteration under each policy, printed as JSON.

Simulated half (default): every workload profile (``slurm_rl.scheduler.profiles``: math-RL,
agentic, training-heavy, short-response) at 8, 64 and 256 GPUs under ``static``, ``auto``,
``auto+pre_process``, ``auto+wait_before_last_iter`` and ``plan`` (which may run iterations collocated:
``scheduler.time_slicing``; ``plan+disaggregated`` without it), and co-located (``collocated``:
every GPU time-slices rollout, inference and training; ``collocated+offload``: the actor's state parked
in host memory between phases), each over several seeds. Per
policy: seconds per iteration, speed-up and reduction versus static, the bubble fraction (GPU
time not computing) split by component (held but idle, or held by none), when each phase ended,
the iteration's lower bounds (``tail_s``: the longest response decoded alone plus its inference
and the last mini-batch on every GPU; ``work_s``: busy GPU-seconds over all GPUs), and the
policy's decision time (wall milliseconds per call), and for ``plan`` how far its forecasts of the
iteration's end missed (``forecast_error``: (forecast - actual end) / actual over the decisions it
carried out, those made in the first and the second half of the iteration apart). Per profile and
scale: ``plan`` against the best of ``auto`` / ``auto+pre_process`` in points of reduction, ``plan``
against the best static mode (disaggregated or co-located), and the targets.

Asynchronous rows (at 64 and more GPUs, unless ``--no-async``): staleness 1 and 2 against the best synchronous
mode (static, co-located, co-located with offload, ``plan``), each on its best split (the rollout on GPUs of its
own); target 1.4x on
math-RL with staleness 1. ``gate``: the rollout runs one version ahead and waits at each gate for its requests
(``slurm_rl.scheduler.async_pipeline``, over ``--iterations``); ``partial``: with partial rollout its requests
carry over the gates (``slurm_rl.scheduler.async_stream``, over ``--async-iterations``), measured after the first
iteration (which fills the pipeline) against the synchronous modes after theirs; ``plan``: what ``plan`` runs
for such a config (``slurm_rl.scheduler.async_plan``), the faster of that and its own synchronous schedule.

Live half (``--live``): the same profile as emulated live runs at 8 and 32 ranks (one local
process per rank, real epochs, acks, Arrow hand-off, mid-iteration decisions), with every cost
scaled by ``--live-time-scale`` so an iteration takes seconds and token counts divided by
``--live-token-scale`` (per-token costs multiplied: same seconds), next to the simulator's
prediction for the very same config (the calibration target is agreement within 10 %).
Per-iteration live times are gate-to-gate (``release`` events of the coordinator).

    python tools/bench_scheduling.py [--profiles math_rl,agentic] [--gpus 8,64,256]
        [--iterations 3] [--seeds 0,1,2] [--jobs 2] [--live]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from slurm_rl.config import config_from_mapping
from slurm_rl.placement import COMPONENTS
from slurm_rl.scheduler.profiles import PROFILES, math_rl, scaled_for_live
from slurm_rl.scheduler.async_pipeline import simulate_async
from slurm_rl.scheduler.simulate import ASYNC_STALENESS, simulate

#: plan with ``scheduler.time_slicing: false``: its disaggregated schedule alone (``plan`` may run iterations collocated)
PLAN_DISAGGREGATED = "plan+disaggregated"
POLICIES = ("static", "auto", "auto+pre_process", "auto+wait_before_last_iter", "plan", PLAN_DISAGGREGATED,
            "collocated", "collocated+offload")
#: The static modes plan is also measured against: the disaggregated placement and co-location (every GPU
#: time-slices rollout, inference and training), with and without the actor parked in host memory.
STATIC_MODES = ("static", "collocated", "collocated+offload")
TARGET_VS_BEST_STATIC = 1.2  # plan over the best static mode, math-RL at 64 and 256 GPUs
RULES = ("auto", "auto+pre_process")  # the rules plan is measured against
#: Publish-to-all-acked latency of a live epoch as measured on the emulated runs (about 0.1 s);
#: the simulator is told the same, so the two model one system.
LIVE_SWITCH_LATENCY_S = 0.1
TARGET_SPEEDUP = 1.5  # plan over static, math-RL at 64 and 256 GPUs
TARGET_POINTS = 0.05  # plan's reduction over the best rule's, every profile and scale


def _one(task: tuple[str, int, int, str, int]) -> tuple[tuple[str, int, str], dict[str, Any]]:
    profile, gpus, iterations, policy, seed = task
    t0 = time.perf_counter()
    report = simulate(config_from_mapping(PROFILES[profile](gpus, num_iterations=iterations)), policy=policy, seed=seed)
    # (when in the iteration, how far off) of every decision that forecast the iteration's end
    misses = [(d["t"] / it.time_s, (d["forecast_end_s"] - it.time_s) / it.time_s)
              for it in report.iterations for d in it.decisions if d.get("forecast_end_s") is not None]
    return (profile, gpus, policy), {"report": report.as_dict(with_decisions=False), "forecast_misses": misses,
                                     "decide_s": report.decide_s, "wall_s": time.perf_counter() - t0}


def _mean(values: list[float]) -> float:
    return round(statistics.mean(values), 3) if values else 0.0


def _summary(gpus: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    its = [it for r in runs for it in r["report"]["iterations"]]
    n_iter = len(runs[0]["report"]["iterations"])
    comps = COMPONENTS
    decide = sorted(x for r in runs for x in r["decide_s"])
    row: dict[str, Any] = {
        "iteration_s": [_mean([r["report"]["iterations"][i]["time_s"] for r in runs]) for i in range(n_iter)],
        "mean_iteration_s": _mean([r["report"]["mean_iteration_s"] for r in runs]),
        "placement_changes_per_iteration": _mean([it["placement_changes"] for it in its]),
        "bubble_fraction": _mean([it["bubble_gpu_s"] / (gpus * it["time_s"]) for it in its]),
        "bubble_by_component": {
            **{c: _mean([it["idle_gpu_s"][c] / (gpus * it["time_s"]) for it in its]) for c in comps},
            "unassigned": _mean([it["unassigned_gpu_s"] / (gpus * it["time_s"]) for it in its]),
        },
        "busy_fraction": {c: _mean([it["busy_gpu_s"][c] / (gpus * it["time_s"]) for it in its]) for c in comps},
        "phases_s": {k: _mean([it["phases"].get(k, 0.0) for it in its])
                     for k in ("rollout_end_s", "inference_end_s", "last_minibatch_start_s")},
        "bounds_s": {k: _mean([it["bounds"][k] for it in its]) for k in ("tail_s", "work_s")},
        "decide_ms": ({"calls": len(decide), "median": round(1e3 * decide[len(decide) // 2], 3),
                       "p99": round(1e3 * decide[min(len(decide) - 1, int(0.99 * len(decide)))], 3),
                       "max": round(1e3 * decide[-1], 3)} if decide else {"calls": 0}),
        "sim_wall_s": round(sum(r["wall_s"] for r in runs), 2),
    }
    misses = [m for r in runs for m in r["forecast_misses"]]
    if misses:
        row["forecast_error"] = {"decisions": len(misses), "all": _spread([e for _, e in misses]),
                                 "first_half": _spread([e for at, e in misses if at < 0.5]),
                                 "second_half": _spread([e for at, e in misses if at >= 0.5])}
    return row


def _spread(errors: list[float]) -> dict[str, float] | None:
    """Median, 10th and 90th percentile of relative errors, in per cent (None: no error)."""
    if not errors:
        return None
    e = sorted(errors)
    pick = lambda q: round(100 * e[min(len(e) - 1, int(q * len(e)))], 1)  # noqa: E731
    return {"median_pct": pick(0.5), "p10_pct": pick(0.1), "p90_pct": pick(0.9)}


def _steady(row: dict[str, Any]) -> float:
    """Mean seconds per iteration after the first (all of them for a one-iteration run)."""
    later = row["iteration_s"][1:] or row["iteration_s"]
    return statistics.mean(later)


def _critical_path(row: dict[str, Any]) -> dict[str, Any]:
    """Which phase ends the iteration and how far it is from its bound."""
    ph, b, t = row["phases_s"], row["bounds_s"], row["mean_iteration_s"]
    data_end = max(ph["rollout_end_s"], ph["inference_end_s"])
    if ph["last_minibatch_start_s"] > data_end + 0.05 * t:
        critical = "actor (its mini-batches before the last end after the data is in)"
    elif ph["inference_end_s"] > ph["rollout_end_s"] + 0.02 * t:
        critical = "inference (it finishes after the rollout)"
    else:
        critical = "rollout tail (the last responses)"
    return {"critical": critical, "data_end_s": round(data_end, 2),
            "after_data_s": round(t - data_end, 2),
            "vs_tail_bound": round(t / b["tail_s"], 3) if b["tail_s"] else None,
            "vs_work_bound": round(t / b["work_s"], 3) if b["work_s"] else None}


def simulated(profiles: list[str], gpus: list[int], iterations: int, seeds: list[int],
              jobs: int = 1) -> dict[str, Any]:
    """Per profile, GPU count and policy: the summary over ``seeds`` (see the module docstring)."""
    tasks = [(p, g, iterations, pol, s) for p in profiles for g in gpus for pol in POLICIES for s in seeds]
    runs: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            done = list(pool.map(_one, tasks))
    else:
        done = [_one(t) for t in tasks]
    for key, run in done:
        runs.setdefault(key, []).append(run)
    out: dict[str, Any] = {}
    for p in profiles:
        out[p] = {}
        for g in gpus:
            row = {pol: _summary(g, runs[(p, g, pol)]) for pol in POLICIES}
            base = row["static"]["mean_iteration_s"]
            for pol in POLICIES:
                row[pol]["speedup_vs_static"] = round(base / row[pol]["mean_iteration_s"], 3)
                row[pol]["reduction_vs_static"] = round(1 - row[pol]["mean_iteration_s"] / base, 3)
            best = min(RULES, key=lambda r: row[r]["mean_iteration_s"])
            points = row["plan"]["reduction_vs_static"] - row[best]["reduction_vs_static"]
            steady = [row["plan"]["iteration_s"][i] for i in range(1, iterations)] or row["plan"]["iteration_s"]
            best_static = min(STATIC_MODES, key=lambda m: row[m]["mean_iteration_s"])
            best_steady = min(STATIC_MODES, key=lambda m: _steady(row[m]))
            row["plan_vs_best_static_mode"] = {
                "best_static_mode": best_static,
                "speedup": round(row[best_static]["mean_iteration_s"] / row["plan"]["mean_iteration_s"], 3),
                # without iteration 0, which plan starts on RLinf's rules (no forecast yet): a long run's figure
                "best_static_mode_after_first_iteration": best_steady,
                "speedup_after_first_iteration": round(_steady(row[best_steady]) / _steady(row["plan"]), 3)}
            row["plan_vs_rules"] = {
                "best_rule": best,
                "points": round(points, 3),
                "points_after_first_iteration": round(
                    (row[best]["mean_iteration_s"] - statistics.mean(steady)) / base, 3),
                "critical_path": {pol: _critical_path(row[pol]) for pol in ("plan", best)},
            }
            out[p][str(g)] = row
    return out


def targets(sim: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, each with its figure and whether it is met."""
    out: dict[str, Any] = {"speedup_math_rl": {}, "vs_best_static_mode_math_rl": {}, "never_below_best_static_mode": {},
                           "points_over_rules": {}}
    for g, row in sim.get("math_rl", {}).items():
        if int(g) >= 64:
            x = row["plan"]["speedup_vs_static"]
            out["speedup_math_rl"][g] = {"plan_speedup": x, "target": TARGET_SPEEDUP, "met": x >= TARGET_SPEEDUP}
            y = row["plan_vs_best_static_mode"]
            out["vs_best_static_mode_math_rl"][g] = {**y, "target": TARGET_VS_BEST_STATIC,
                                                     "met": y["speedup"] >= TARGET_VS_BEST_STATIC}
    for p, rows in sim.items():
        for g, row in rows.items():
            y = row["plan_vs_best_static_mode"]
            out["never_below_best_static_mode"][f"{p}@{g}"] = {**y, "met": y["speedup"] >= 1.0}
    for p, rows in sim.items():
        for g, row in rows.items():
            pts = row["plan_vs_rules"]["points"]
            out["points_over_rules"][f"{p}@{g}"] = {"points": pts, "target": TARGET_POINTS,
                                                    "met": pts >= TARGET_POINTS}
    return out


TARGET_ASYNC = 1.4  # staleness 1 over the best synchronous mode, math-RL at 64 and 256 GPUs
SYNC_MODES = (*STATIC_MODES, "plan")  # the synchronous modes an asynchronous run is measured against


def _async_one(task: tuple[str, int, int, int, bool]) -> tuple[tuple[str, int, bool], dict[int, Any]]:
    profile, gpus, iterations, seed, partial = task
    reports = simulate_async(PROFILES[profile](gpus, num_iterations=iterations), ASYNC_STALENESS, seed=seed,
                             partial=partial)
    return (profile, gpus, partial), {k: r.as_dict() for k, r in reports.items()}


def asynchronous(sim: dict[str, Any], profiles: list[str], gpus: list[int], iterations: int, seeds: list[int],
                 jobs: int, partial_iterations: int) -> dict[str, Any]:
    """Staleness 1 and 2, the rollout waiting at the gates (``gate``: ``slurm_rl.scheduler.async_pipeline``,
    ``iterations``) and with partial rollout (``partial``: ``slurm_rl.scheduler.async_stream``,
    ``partial_iterations``, after the first iteration), each on its best split (the rollout on GPUs of its own),
    against the best synchronous mode of the simulated half (after its first iteration for ``partial``), per
    profile and scale, with the target."""
    tasks = [(p, g, iterations, s, False) for p in profiles for g in gpus for s in seeds]
    tasks += [(p, g, partial_iterations, s, True) for p in profiles for g in gpus for s in seeds]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        done = list(pool.map(_async_one, tasks)) if jobs > 1 else [_async_one(t) for t in tasks]
    out: dict[str, Any] = {}
    for p in profiles:
        for g in gpus:
            row = sim[p][str(g)]
            entry: dict[str, Any] = {}
            for kind, partial, figure, sync_figure in (("gate", False, "mean_iteration_s", _mean_row),
                                                       ("partial", True, "steady_iteration_s", _steady)):
                best = min(SYNC_MODES, key=lambda m: sync_figure(row[m]))
                part: dict[str, Any] = {"best_sync_mode": best, "best_sync_s": round(sync_figure(row[best]), 3),
                                        "figure": figure}
                for k in ASYNC_STALENESS:
                    runs = [r[k] for key, r in done if key == (p, g, partial)]
                    mean = _mean([r[figure] for r in runs])
                    part[f"k{k}"] = {figure: mean, "vs_best_sync": round(part["best_sync_s"] / mean, 3),
                                     "max_staleness_seen": max(max(r["staleness"]) for r in runs),
                                     "placement_gpus": [{c: len(v) for c, v in r["placement"].items()} for r in runs]}
                    if partial:  # how much of the time the rollout's slots decode (the rest: waiting for a version)
                        part[f"k{k}"]["rollout_occupancy"] = _mean([r["rollout_occupancy"] for r in runs])
                if p == "math_rl" and g in (64, 256):
                    part["target_k1"] = {"target": TARGET_ASYNC, "met": part["k1"]["vs_best_sync"] >= TARGET_ASYNC}
                part["never_below_best_sync"] = all(part[f"k{k}"]["vs_best_sync"] >= 1.0 for k in ASYNC_STALENESS)
                entry[kind] = part
            entry["plan"] = _plan_rows(row, entry["partial"])
            out.setdefault(p, {})[str(g)] = entry
    return out


def _plan_rows(row: dict[str, Any], partial: dict[str, Any]) -> dict[str, Any]:
    """``plan`` for a run with bound ``k`` and partial rollout (``scheduler.async_plan``): the faster, after the first
    iteration, of the async split and plan's own synchronous schedule, against the best synchronous mode."""
    best_s = partial["best_sync_s"]
    sync_s = _steady(row["plan"])
    out: dict[str, Any] = {}
    for k in ASYNC_STALENESS:
        async_s = partial[f"k{k}"]["steady_iteration_s"]
        s = min(async_s, sync_s)
        out[f"k{k}"] = {"steady_iteration_s": round(s, 3), "schedule": "async" if async_s < sync_s else "synchronous",
                        "vs_best_sync": round(best_s / s, 3)}
    out["never_below_best_sync"] = all(out[f"k{k}"]["vs_best_sync"] >= 1.0 for k in ASYNC_STALENESS)
    return out


def _mean_row(row: dict[str, Any]) -> float:
    return row["mean_iteration_s"]


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
            sim = simulate(config_from_mapping(cfg), policy=policy)
            sim_times = [it.time_s for it in sim.iterations]
            row[policy] = {
                "live_iteration_s": [round(t, 3) for t in times],
                "simulated_iteration_s": [round(t, 3) for t in sim_times],
                "live_total_s": round(sum(times), 3),
                "simulated_total_s": round(sum(sim_times), 3),
                "live_vs_simulated": round(sum(times) / sum(sim_times) - 1, 3),
                "within_10pct": abs(sum(times) / sum(sim_times) - 1) <= 0.10,
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
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--gpus", default="8,64,256")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=1, help="simulations run in this many processes")
    ap.add_argument("--live", action="store_true", help="also run emulated live runs")
    ap.add_argument("--live-ranks", default="8,32")
    ap.add_argument("--live-time-scale", default="0.1,0.2",
                    help="cost multiplier per --live-ranks entry. The control plane's own latency "
                         "(~0.1 s per placement switch: polling, acks) does not shrink with it, so at "
                         "0.01 a switch weighs as much as 10 s of a full-scale iteration and auto loses "
                         "4 points of its gain; 0.1 (8 ranks) and 0.2 (32 ranks on 2 cores) keep it small")
    ap.add_argument("--live-token-scale", type=float, default=16.0)
    ap.add_argument("--live-policies", default="static,auto,plan")
    ap.add_argument("--live-dir", default="/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir(),
                    help="where the live run dirs go (tmpfs keeps fsync out of the figures)")
    ap.add_argument("--no-sim", action="store_true", help="skip the simulated half")
    ap.add_argument("--no-async", action="store_true", help="skip the asynchronous rows (64 and more GPUs)")
    ap.add_argument("--async-iterations", type=int, default=12,
                    help="iterations of the partial-rollout rows (the first fills the pipeline and is left out)")
    args = ap.parse_args(argv)
    profiles = args.profiles.split(",")
    unknown = sorted(set(profiles) - set(PROFILES))
    if unknown:
        print(f"error: --profiles: unknown {unknown}, allowed {sorted(PROFILES)}", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"profiles": profiles, "policies": list(POLICIES),
                              "seeds": [int(x) for x in args.seeds.split(",")], "iterations": args.iterations}
    if not args.no_sim:
        result["simulated"] = simulated(profiles, [int(g) for g in args.gpus.split(",")], args.iterations,
                                        result["seeds"], args.jobs)
        result["targets"] = targets(result["simulated"])
        if not args.no_async:
            result["asynchronous"] = asynchronous(result["simulated"], profiles,
                                                  [g for g in (int(x) for x in args.gpus.split(",")) if g >= 64],
                                                  args.iterations, result["seeds"], args.jobs,
                                                  args.async_iterations)
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
