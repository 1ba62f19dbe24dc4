"""The live part of ``tools/bench_mux.py --live``: a group run for real (emulated) against its jobs
run alone one after another, and against the simulator's prediction of the same group.

Times exclude process start-up on both sides: a group's span runs from the first phase start to
the last release (``slurm-rl inspect GROUP_DIR``), a solo run's from the release of its first
iteration to its final gate. GPU-seconds = slots of the group x span (the same slots, held by the
group for its span, or by each solo run in turn).
"""

from __future__ import annotations

import math
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


# -- a group on the weave profile ---------------------------------------------------------------------

#: tokens of a weave job per emulated token (a 32k budget becomes 512 emulated tokens)
WEAVE_TOKEN_SCALE = 64
#: seconds of an emulated iteration alone (rollout + training), so a small group runs in under a minute
WEAVE_ITERATION_S = 8.0


def _weave_costs(job: Any, rollout_s_per_token: float, actor_s_per_token: float) -> dict[str, Any]:
    from slurm_rl.mux.trace_weave import WEAVE_TYPES, mu_for_capped_mean

    sigma = WEAVE_TYPES[job.kind].sigma
    max_len = max(8, job.max_response_len // WEAVE_TOKEN_SCALE)
    mu = mu_for_capped_mean(job.mean_response_len, sigma, job.max_response_len)
    mean = min(max_len, max(1, round(math.exp(mu + sigma ** 2 / 2) / WEAVE_TOKEN_SCALE)))
    return {"rollout_s_per_token": rollout_s_per_token, "inference_s_per_token": actor_s_per_token / 3,
            "actor_s_per_token": actor_s_per_token, "response_len_mean": mean, "response_len_max": max_len,
            "response_len_dist": "lognormal", "response_len_sigma": sigma, "prompt_len": 32,
            "model_params": 10_000_000}


def weave_job_config(job: Any, run_dir: str, iterations: int = 3) -> dict[str, Any]:
    """An emulated run config shaped like weave job ``job``: its budget and length distribution (tokens
    / :data:`WEAVE_TOKEN_SCALE`), its rollout/training ratio, :data:`WEAVE_ITERATION_S` an iteration alone;
    actor 0-1, inference 2-3, rollout 4-7 (the group's pools: rollout 0-3, train 4-7)."""
    from slurm_rl.config import config_from_mapping
    from slurm_rl.mux.predict import job_profile

    target = job.expected_rollout_s() / job.expected_train_s()
    roll, act = 2.0e-4, 2.0e-4
    doc: dict[str, Any] = {}
    for _ in range(3):  # rollout and training seconds are linear in their per-token costs
        doc = {"cluster": {"num_nodes": 1, "gpus_per_node": 8,
                           "component_placement": {"actor": "0-1", "inference": "2-3", "rollout": "4-7"}},
               "runtime": {"device": "emulated", "run_dir": run_dir, "heartbeat_timeout_s": 20.0,
                           "wait_timeout_s": 120.0, "run_timeout_s": 600.0, "seed": 1, "keep_iterations": 10},
               "train": {"num_iterations": iterations, "rollout_batch_size": 16, "group_size": 4,
                         "global_batch_size": 32, "micro_batch_size": 4},
               "scheduler": {"policy": "static"}, "emulated": _weave_costs(job, roll, act)}
        prof, _ = job_profile(config_from_mapping(doc), job.name)
        r, t = prof.expected_rollout_s(), prof.expected_train_s()
        roll *= (WEAVE_ITERATION_S * target / (1 + target)) / r
        act *= (WEAVE_ITERATION_S / (1 + target)) / t
    return doc


def weave_group_file(out_dir: Path, seed: int = 0, iterations: int = 3, park_s: float = 0.05) -> Path:
    """A group file of two emulated jobs shaped like the first reasoning and the first agentic
    one-node job of the weave trace of ``seed`` (rollout pool 0-3, train 4-7, tail migration at 80 %)."""
    import yaml

    from slurm_rl.mux.trace_weave import WeaveSpec, generate_weave

    jobs = generate_weave(WeaveSpec(seed=seed))
    picked = [next(j for j in jobs if j.kind == kind and j.train_slots == 1) for kind in ("reasoning", "agentic")]
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = {}
    for j in picked:
        name = f"{j.kind}-{j.name}"
        doc = weave_job_config(j, str(out_dir / "unused"), iterations)
        (out_dir / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        entries[name] = {"config": f"{name}.yaml", "slo": 3.0,
                         "max_response_length": doc["emulated"]["response_len_max"]}
    group = {"group": {"dir": str(out_dir / "group"), "pools": {"rollout": "0-3", "train": "4-7"},
                       "tail_fraction": 0.8, "tail_slots": 1, "poll_interval_s": 0.02, "timeout_s": 600,
                       "park_s": park_s},
             "jobs": entries}
    path = out_dir / "group.yaml"
    path.write_text(yaml.safe_dump(group, sort_keys=False))
    return path
