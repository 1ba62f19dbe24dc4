#!/usr/bin/env python
"""Fault drill: kill runs at random points, resume them, and check they end like an uninterrupted run.

Every fault is real (SIGKILL: no cleanup, no flush); only the moment is chosen, at random:

- ``rank``: a random rank, SIGKILLed from outside at a random time;
- ``coordinator``: the coordinator process, SIGKILLed from outside at a random time;
- ``reshard`` / ``weight_sync``: a rank that kills itself inside a reshard of the actor / a weight
  sync (``slurm_rl.faults`` points; the other ranks are inside the same collective);
- ``epoch_write`` / ``checkpoint_write``: the coordinator killed while it publishes an epoch /
  seals a checkpoint;
- ``rank_checkpoint``: a rank killed while it writes its part of a checkpoint.

Each run checkpoints at every gate (``runtime.checkpoint_every: 1``); a run whose ranks failed is
resumed (``prepare_resume``, the same as ``slurm-rl run --resume``) until it finishes. Prints one
JSON document: per fault, faults injected, runs resumed, runs identical to the reference
(samples, rewards, consumed samples and per-step losses per iteration, final parameters), hangs
(a launch that neither finished nor failed within its timeout: must be 0), torn files (a control
file or checkpoint under its final name that does not parse or verify: must be 0), samples lost
or doubled (every iteration's actor batches against its requests: must be 0), and seconds from
the fault to a clear error and to resumed progress.

    python tools/fault_drill.py --runs 3
    python tools/fault_drill.py --runs 1 --backend cpu --faults reshard,weight_sync
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from slurm_rl.control.atomic import read_json  # noqa: E402
from slurm_rl.control.lease import read_lease  # noqa: E402
from slurm_rl.control.paths import RunPaths  # noqa: E402
from slurm_rl.control.progress import read_all_progress  # noqa: E402
from slurm_rl.faults import FAULT_ENV, FAULT_ONCE_ENV  # noqa: E402
from slurm_rl.launch.local import LaunchError, LocalJob  # noqa: E402
from slurm_rl.launch.prepare import prepare_run  # noqa: E402
from slurm_rl.metrics import read_metrics  # noqa: E402
from slurm_rl.resume import checkpoints  # noqa: E402
from slurm_rl.resume.restart import prepare_resume  # noqa: E402

FAULTS = ("rank", "coordinator", "reshard", "weight_sync", "epoch_write", "checkpoint_write", "rank_checkpoint")
WORLD = 4
ITERATIONS = 4
LAUNCH_TIMEOUT_S = {"emulated": 120.0, "cpu": 600.0}
MAX_INCARNATIONS = 4


def drill_config(backend: str, run_dir: Path) -> dict[str, Any]:
    """4 ranks; the actor grows to DP 2 at iteration 1 and shrinks back at 2 (reshards), checkpoints
    at every gate, all data kept (to count samples), short timeouts (a hang shows quickly)."""
    cfg: dict[str, Any] = {
        "cluster": {"num_nodes": 1, "gpus_per_node": WORLD,
                    "component_placement": {"actor": "0", "rollout": "1-2", "inference": "3"}},
        "runtime": {"device": backend, "run_dir": str(run_dir), "checkpoint_every": 1, "keep_iterations": 100,
                    "heartbeat_timeout_s": 15.0, "ack_timeout_s": 60.0, "wait_timeout_s": 60.0, "run_timeout_s": 600.0},
        "train": {"num_iterations": ITERATIONS, "rollout_batch_size": 4 if backend == "cpu" else 16, "group_size": 4,
                  "global_batch_size": 8 if backend == "cpu" else 32, "micro_batch_size": 4, "minibatch_order": "index"},
        "scheduler": {"policy": "scripted", "script": [
            {"at_iteration": 1, "placement": {"actor": "0-1", "rollout": "2", "inference": "3"}},
            {"at_iteration": 2, "placement": {"actor": "0", "rollout": "1-2", "inference": "3"}},
        ]},
    }
    if backend == "emulated":
        cfg["emulated"] = {"rollout_s_per_token": 3.0e-5, "inference_s_per_token": 1.0e-6, "actor_s_per_token": 3.0e-6,
                           "response_len_mean": 64, "response_len_max": 256, "prompt_len": 16,
                           "model_params": 10_000_000, "reshard_s_per_gb": 0.5}
    else:
        cfg.update({"model": {"hidden_size": 64, "num_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
                    "task": {"name": "add", "max_operand": 4}, "actor": {"lr": 1.0e-3},
                    "algorithm": {"clip_eps": 0.2, "kl_coef": 0.05}, "rollout": {"backend": "hf"}})
    return cfg


def outcome(run_dir: Path) -> list[dict[str, Any]]:
    keys = ("iteration", "samples", "minibatches", "reward_mean", "consumed_samples", "losses")
    return [{k: m.get(k) for k in keys} for m in read_metrics(run_dir)]


def same_outcome(got: Path, ref: Path) -> bool:
    a, b = outcome(got), outcome(ref)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if {k: v for k, v in x.items() if k != "losses"} != {k: v for k, v in y.items() if k != "losses"}:
            return False
        if any(abs(p - q) > 1e-6 * max(abs(q), 1e-6) for p, q in zip(x["losses"] or [], y["losses"] or [])):
            return False
    final = ref / "checkpoints" / "final" / "model.safetensors"
    if final.exists():
        from safetensors.torch import load_file

        want, have = load_file(str(final)), load_file(str(got / "checkpoints" / "final" / "model.safetensors"))
        return all(float((have[n] - t).abs().max()) <= 1e-6 * (float(t.abs().max()) or 1.0) for n, t in want.items())
    return True


def sample_errors(run_dir: Path, samples: int) -> tuple[int, int]:
    """(lost, doubled): every iteration's actor-batch sample ids against ``samples`` distinct ones."""
    lost = doubled = 0
    for k in range(ITERATIONS):
        ids: list[int] = []
        for shard in sorted((run_dir / "data" / f"iter-{k:06d}" / "actor_batch").glob("shard-*.arrow")):
            with pa.memory_map(str(shard)) as source:
                ids += pa.ipc.open_file(source).read_all().column("sample_id").to_pylist()
        doubled += len(ids) - len(set(ids))
        lost += max(0, samples - len(set(ids)))
    return lost, doubled


def torn_files(run_dir: Path) -> list[str]:
    """Control files and checkpoints under their final names that a reader could not take whole."""
    bad = []
    for path in (run_dir / "control").rglob("*.json"):
        if not path.name.startswith("."):
            try:
                read_json(path)
            except Exception as exc:  # noqa: BLE001 -- every failure is a finding
                bad.append(f"{path}: {exc}")
    for path in checkpoints.list_checkpoints(run_dir):
        try:
            checkpoints.verify(path)
        except checkpoints.CheckpointError as exc:
            bad.append(str(exc))
    return bad


def _progress_mark(run_dir: Path) -> tuple[int, int]:
    """(metrics rows, coordinator generation): grows when the run makes progress after a fault."""
    lease = read_lease(RunPaths(run_dir)) or {}
    return len(read_metrics(run_dir)), int(lease.get("generation") or 0)


def launch(run_dir: Path, env: dict[str, str], timeout: float, external: tuple[str, float] | None,
           rng: random.Random, record: dict[str, Any]) -> str:
    """One incarnation: 'finished', 'failed' or 'hang'. ``external``: (target, delay) of an outside kill."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        job = LocalJob(run_dir, WORLD)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    started = time.monotonic()
    kill_at: float | None = None  # external kills: counted from the first rank at work
    mark_at_fault = None
    try:
        while True:
            if external is not None and kill_at is None and "fault_at" not in record and _working(run_dir):
                kill_at = time.monotonic() + external[1]
            if kill_at is not None and time.monotonic() >= kill_at:
                kill_at, target, external = None, external[0], None
                victim = _victim(run_dir, target, job, rng)
                if victim is not None:
                    mark_at_fault = _progress_mark(run_dir)
                    os.kill(victim, signal.SIGKILL)
                    record["fault_at"] = time.time()
            if mark_at_fault is not None and "progress_after_s" not in record and \
                    _progress_mark(run_dir)[1] > mark_at_fault[1]:
                record["progress_after_s"] = time.time() - record["fault_at"]  # a new coordinator took over
            try:
                if job.poll() is not None:
                    return "finished"
            except LaunchError:
                return "failed"
            if time.monotonic() - started > timeout:
                return "hang"
            time.sleep(0.05)
    finally:
        job.kill()


def _working(run_dir: Path) -> bool:
    return any(d.state == "working" for d in read_all_progress(RunPaths(run_dir), range(WORLD)).values())


def _victim(run_dir: Path, target: str, job: LocalJob, rng: random.Random) -> int | None:
    if target == "coordinator":
        holder = (read_lease(RunPaths(run_dir)) or {}).get("holder") or {}
        return holder.get("pid")
    alive = [r for r, p in job.procs.items() if p.poll() is None]
    return job.procs[rng.choice(alive)].pid if alive else None


def internal_fault(kind: str, rng: random.Random) -> str:
    """The SLURM_RL_FAULT spec of an internal kill point, at a random place."""
    if kind == "reshard":  # iteration 1: ranks 0 -> 0,1; iteration 2: back (epochs 1 and 2)
        return f"reshard@rank={rng.choice([0, 1])},iteration={rng.choice([1, 2])}"
    if kind == "weight_sync":  # the actor's first rank and the rollout ranks (rank 1 serves the actor in iteration 1)
        k = rng.randrange(ITERATIONS)
        return f"weight_sync@rank={rng.choice([0, 2] if k == 1 else [0, 1, 2])},iteration={k}"
    if kind == "epoch_write":
        return f"epoch_write@epoch={rng.choice([1, 2])}"
    if kind == "checkpoint_write":
        return f"checkpoint_write@iteration={rng.randrange(1, ITERATIONS)}"
    if kind == "rank_checkpoint":  # the actor's DP rank 0 writes the actor part; every rank takes part
        return f"rank_checkpoint@rank={rng.randrange(WORLD)},iteration={rng.randrange(1, ITERATIONS)}"
    raise ValueError(kind)


def drill_one(kind: str, backend: str, base: Path, ref: Path, rng: random.Random, samples: int,
              expected_s: float) -> dict[str, Any]:
    run_dir = base / f"{kind}-{rng.randrange(10**9)}"
    config = base / f"{run_dir.name}.yaml"
    config.write_text(yaml.safe_dump(drill_config(backend, run_dir)))
    prepare_run(config)
    once = base / f"{run_dir.name}.fired"
    record: dict[str, Any] = {"fault": kind, "run_dir": str(run_dir)}
    env = dict(os.environ)
    external = None
    if kind in ("rank", "coordinator"):
        external = (kind, rng.uniform(0.05, 0.9) * expected_s)
        record["spec"] = f"SIGKILL {kind} after {external[1]:.1f}s"
    else:
        env.update({FAULT_ENV: internal_fault(kind, rng), FAULT_ONCE_ENV: str(once)})
        record["spec"] = env[FAULT_ENV]
    timeout = LAUNCH_TIMEOUT_S[backend]
    outcomes = []
    for incarnation in range(MAX_INCARNATIONS):
        t_launch = time.time()
        result = launch(run_dir, env, timeout, external if incarnation == 0 else None, rng, record)
        outcomes.append(result)
        if once.exists() and "fault_at" not in record:
            record["fault_at"] = once.stat().st_mtime
        if result == "failed" and "fault_at" in record and "error_after_s" not in record:
            record["error_after_s"] = time.time() - record["fault_at"]
        if result != "failed":
            break
        prepare_resume(run_dir)
        env = dict(os.environ)  # a resumed incarnation runs without the fault
        record.setdefault("resumed_at", t_launch)
        if "fault_at" in record and "progress_after_s" not in record:
            record["progress_after_s"] = _first_progress_after(run_dir, record["fault_at"], timeout)
    record["incarnations"] = outcomes
    record["injected"] = "fault_at" in record
    record["hang"] = "hang" in outcomes
    record["finished"] = outcomes[-1] == "finished"
    record["resumed"] = len(outcomes) > 1 and record["finished"]
    record["identical"] = record["finished"] and same_outcome(run_dir, ref)
    record["torn_files"] = torn_files(run_dir)
    record["samples_lost"], record["samples_doubled"] = sample_errors(run_dir, samples) if record["finished"] else (0, 0)
    if kind in ("epoch_write", "checkpoint_write") and "fault_at" in record:
        # the next coordinator generation claimed the lease: the run goes on (rank 0 restarted it)
        claim = RunPaths(run_dir).generation_claim(2)
        record["progress_after_s"] = claim.stat().st_mtime - record["fault_at"] if claim.exists() else None
    return record


def _first_progress_after(run_dir: Path, fault_at: float, timeout: float) -> float | None:
    """Seconds from the fault to the resumed incarnation's first progress (a rank working again):
    read from the metrics and events after the fact."""
    from slurm_rl.control.events import read_events

    resumed = [e["time"] for e in read_events(RunPaths(run_dir), "resumed") if e["time"] >= fault_at]
    return None if not resumed else resumed[-1] - fault_at


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per fault")
    parser.add_argument("--backend", default="emulated", choices=("emulated", "cpu"))
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated subset of {','.join(FAULTS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the run dirs (printed in the JSON)")
    args = parser.parse_args()
    kinds = [k for k in args.faults.split(",") if k]
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown:
        print(f"--faults: got {unknown}; allowed: {', '.join(FAULTS)}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="fault-drill-"))
    ref = base / "reference"
    config = base / "reference.yaml"
    config.write_text(yaml.safe_dump(drill_config(args.backend, ref)))
    prepare_run(config)
    if launch(ref, dict(os.environ), LAUNCH_TIMEOUT_S[args.backend], None, rng, {}) != "finished":
        print(json.dumps({"error": f"the reference run did not finish ({ref})"}))
        return 1
    rows = read_metrics(ref)
    expected_s = rows[-1]["time"] - rows[0]["time"] + rows[0]["seconds"]  # the iterations' span, without startup
    samples = read_metrics(ref)[0]["samples"]
    records = [drill_one(kind, args.backend, base, ref, rng, samples, expected_s) for kind in kinds for _ in range(args.runs)]

    def summary(rs: list[dict[str, Any]]) -> dict[str, Any]:
        def stat(key: str) -> dict[str, float] | None:
            values = [r[key] for r in rs if r.get(key) is not None]
            return None if not values else {"min": min(values), "median": statistics.median(values), "max": max(values)}

        return {"faults_injected": sum(r["injected"] for r in rs), "runs": len(rs),
                "runs_resumed": sum(r["resumed"] for r in rs), "runs_finished": sum(r["finished"] for r in rs),
                "runs_identical": sum(r["identical"] for r in rs), "hangs": sum(r["hang"] for r in rs),
                "torn_files_read": sum(len(r["torn_files"]) for r in rs),
                "samples_lost": sum(r["samples_lost"] for r in rs), "samples_doubled": sum(r["samples_doubled"] for r in rs),
                "seconds_fault_to_error": stat("error_after_s"), "seconds_fault_to_progress": stat("progress_after_s")}

    out = {"backend": args.backend, "runs_per_fault": args.runs, "seed": args.seed,
           "reference_seconds": round(expected_s, 2), "total": summary(records),
           "per_fault": {k: summary([r for r in records if r["fault"] == k]) for k in kinds},
           "runs": [{k: v for k, v in r.items() if k != "run_dir" or args.keep} for r in records]}
    print(json.dumps(out, indent=1, default=str))
    if not args.keep:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
