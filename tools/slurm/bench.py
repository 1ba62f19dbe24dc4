#!/usr/bin/env python3
"""Time the local Slurm test cluster and print one JSON object.

Figures (seconds): warm start.sh, submit-to-completed of a 1-task job and of an N-node x G-task
srun job (polling `scontrol show job`, not `sbatch --wait`), sacct lag after completion, and
requeue-to-running with `scontrol update StartTime=now`. Usage: python tools/slurm/bench.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent


def client_env() -> dict[str, str]:
    """Environment exported by env.sh."""
    out = subprocess.run(
        ["bash", "-c", f"source {TOOLS / 'env.sh'} && env -0"], capture_output=True, check=True, timeout=30
    ).stdout
    return dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)


def run(env: dict[str, str], *args: str) -> str:
    """Run a client command, return stdout; raise naming the command on failure."""
    proc = subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def job_state(env: dict[str, str], job_id: str) -> str:
    """JobState of job_id from slurmctld."""
    match = re.search(r"JobState=(\S+)", run(env, "scontrol", "show", "job", "-o", job_id))
    if match is None:
        raise RuntimeError(f"no JobState for job {job_id}")
    return match.group(1)


def wait_state(env: dict[str, str], job_id: str, states: set[str], timeout: float = 60.0) -> float:
    """Poll until job_id reaches one of states; return the monotonic time it was seen."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = job_state(env, job_id)
        if state in states:
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError(f"job {job_id} did not reach {sorted(states)} within {timeout}s (last {state})")


def submit(env: dict[str, str], *args: str) -> tuple[str, float]:
    """sbatch --parsable ARGS; return (job id, submit time)."""
    t0 = time.monotonic()
    return run(env, "sbatch", "--parsable", "-o", "/dev/null", *args).strip().split(";")[0], t0


def main() -> int:
    t0 = time.monotonic()
    subprocess.run(["bash", str(TOOLS / "start.sh")], check=True, capture_output=True, timeout=600)
    figures: dict[str, object] = {"start_sh_s": round(time.monotonic() - t0, 3)}
    env = client_env()
    nodes = int(os.environ.get("SLURM_TEST_NODES", "2"))
    gpus = int(os.environ.get("SLURM_TEST_GPUS", "4"))

    job, t0 = submit(env, "-n1", "--wrap", "true")
    figures["job_1task_submit_to_completed_s"] = round(wait_state(env, job, {"COMPLETED"}) - t0, 3)
    if os.environ.get("SLURM_TEST_ACCOUNTING", "1") == "1":
        t_done = time.monotonic()
        while run(env, "sacct", "-n", "-X", "-P", "-j", job, "-o", "State").strip() != "COMPLETED":
            if time.monotonic() - t_done > 30:
                raise TimeoutError(f"sacct shows no COMPLETED for job {job} after 30s")
            time.sleep(0.05)
        figures["sacct_lag_s"] = round(time.monotonic() - t_done, 3)

    job, t0 = submit(env, f"-N{nodes}", f"--ntasks-per-node={gpus}", f"--gres=gpu:{gpus}", "--wrap", "srun true")
    figures[f"job_{nodes}x{gpus}_srun_submit_to_completed_s"] = round(wait_state(env, job, {"COMPLETED"}) - t0, 3)

    job, _ = submit(env, "-n1", "--requeue", "--wrap", "sleep 300")
    wait_state(env, job, {"RUNNING"})
    t0 = time.monotonic()
    run(env, "scontrol", "requeue", job)
    wait_state(env, job, {"PENDING"})
    run(env, "scontrol", "update", f"jobid={job}", "StartTime=now")
    figures["requeue_to_running_s"] = round(wait_state(env, job, {"RUNNING"}) - t0, 3)
    run(env, "scancel", job)

    figures["load_avg_1m"] = os.getloadavg()[0]
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
