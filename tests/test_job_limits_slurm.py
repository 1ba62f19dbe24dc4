"""On the local Slurm cluster (fake GPUs through GRES): a job's GPUs and time limit as the run sees them.

``slurm-rl submit`` under ``runtime.device: auto`` asks for the partition's GPUs; ``sbatch sbatch/train.sh``
of a cuda config in a job without GPUs ends in its first lines with exit 2 and the flags that would work;
``validate`` inside a job prints the time limit it took from the job; a run in a 4-minute job with
``runtime.run_timeout_s`` unset stops with a checkpoint before Slurm ends the job."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from emulated_configs import emulated_config
from resume_helpers import wait_until
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.job_limits import job_end_time
from slurm_rl.resume.stop import read_stop

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "add_4.jsonl"

pytestmark = [pytest.mark.slurm]
MARGIN_S = 200.0  # checkpoint_margin_s of the 4-minute job: its run stops about 40 s into the job


def _real_config(tmp_path: Path, device: str) -> Path:
    """A small random-model config on ``device`` with 4 ranks; cluster.gpus_per_node from the job."""
    doc = {"cluster": {"num_nodes": 1, "component_placement": {"actor": 0, "rollout": "1-2", "inference": 3}},
           "runtime": {"device": device, "run_dir": str(tmp_path / "run")},
           "train": {"num_iterations": 1, "rollout_batch_size": 4, "group_size": 2, "global_batch_size": 8,
                     "micro_batch_size": 2},
           "model": {"hidden_size": 64, "num_attention_heads": 2}, "rollout": {"max_new_tokens": 8},
           "data": {"train_files": [str(DATA)]}, "reward": {"name": "gsm8k"}}
    path = tmp_path / f"{device}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_submit_under_auto_asks_for_the_partitions_gpus(slurm_cluster, tmp_path: Path) -> None:
    config = _real_config(tmp_path, "auto")
    proc = subprocess.run([sys.executable, "-m", "slurm_rl.cli", "submit", str(config), "cluster.gpus_per_node=4"],
                          cwd=tmp_path, env=dict(slurm_cluster.env), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    job = re.search(r"submitted slurm job (\d+)", proc.stdout)
    assert job, proc.stdout
    try:
        shown = slurm_cluster.run("scontrol", "show", "job", job.group(1)).stdout
    finally:
        slurm_cluster.run("scancel", job.group(1), check=False)
    assert re.search(r"TresPerNode=gres:gpu:4\b", shown), shown


def test_sbatch_of_a_cuda_config_without_gpus_ends_at_once(slurm_cluster, tmp_path: Path) -> None:
    config = _real_config(tmp_path, "cuda")
    log = tmp_path / "job.out"
    t0 = time.monotonic()
    code, job = slurm_cluster.sbatch_wait("--nodes=1", "--ntasks-per-node=4", f"--output={log}",
                                          str(REPO / "sbatch" / "train.sh"), str(config), cwd=REPO, timeout=300)
    seconds = time.monotonic() - t0
    text = log.read_text()
    assert code == 2, text
    assert f"Slurm job {job} holds 0 GPU(s) per node, but the config needs 4 per node (runtime.device is cuda)" in text
    assert "sbatch --nodes=1 --ntasks-per-node=4 --gres=gpu:4 sbatch/train.sh CONFIG" in text
    assert "nothing launched" in text and not (tmp_path / "run").exists()
    assert seconds < 120, f"the job took {seconds:.0f}s"  # validation only: no rank started


def test_validate_in_a_job_prints_the_jobs_time_limit(slurm_cluster, tmp_path: Path) -> None:
    config = _real_config(tmp_path, "cpu")
    log = tmp_path / "validate.out"
    cmd = f"{sys.executable} -m slurm_rl.cli validate {config} cluster.gpus_per_node=4"
    code, job = slurm_cluster.sbatch_wait("--time=4", "--ntasks=1", f"--output={log}", "--wrap", cmd,
                                          cwd=tmp_path, timeout=300)
    text = log.read_text()
    assert code == 0, text
    line = next(x for x in text.splitlines() if "run time limit:" in x)
    seconds = float(re.search(r"run time limit: (\d+)s", line).group(1))
    assert 60 < seconds <= 240 - 120, line  # the 4-minute limit less runtime.checkpoint_margin_s, less start-up
    assert f"Slurm job {job} ends then" in line and "checkpoint_margin_s 120s" in line


@pytest.mark.slow
def test_run_in_a_4_minute_job_stops_with_a_checkpoint_before_its_end(slurm_cluster, tmp_path: Path) -> None:
    """runtime.run_timeout_s unset: the run's deadline is the job's end less checkpoint_margin_s (200 s, so
    that it comes before train.sh's own USR1 at 120 s, about 40 s into the job): the coordinator stops the run
    at its next gate with a checkpoint; Slurm has not ended the job by then."""
    run_dir = tmp_path / "run"
    doc = emulated_config(run_dir, gpus_per_node=4, iterations=10_000, checkpoint_margin_s=MARGIN_S)
    del doc["runtime"]["run_timeout_s"]
    del doc["cluster"]["gpus_per_node"]
    doc["scheduler"] = {"policy": "static"}
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(doc))
    log = tmp_path / "job.out"
    proc = slurm_cluster.run("sbatch", "--parsable", "--time=4", "--nodes=1", "--ntasks-per-node=4",
                             f"--output={log}", str(REPO / "sbatch" / "train.sh"), str(config))
    job = proc.stdout.strip().split(";")[0]
    env = {**slurm_cluster.env, "SLURM_JOB_ID": job}
    try:
        wait_until(f"job {job} to start", lambda: job_end_time(env)[0] is not None, timeout=60)
        end, _ = job_end_time(env)
        paths = RunPaths(run_dir)
        wait_until("the run to stop", lambda: (s := read_coordinator_status(paths)) is not None
                   and s.state in ("stopped", "failed", "finished"), timeout=230)
        stopped_at = time.time()
        status = read_coordinator_status(paths)
    finally:
        slurm_cluster.run("scancel", job, check=False)
    assert status.state == "stopped" and status.checkpoint, (status, log.read_text()[-3000:])
    stop = read_stop(run_dir)
    assert stop is not None and stop["reason"].startswith("run time limit reached"), stop
    assert "squeue %e" in stop["reason"] and f"checkpoint_margin_s {MARGIN_S:.0f}s" in stop["reason"]
    assert stop["requested_at"] >= end - MARGIN_S - 2  # the deadline, not earlier (clock of one host, whole seconds)
    assert stopped_at < end - 60, f"stopped {end - stopped_at:.0f}s before the job's end"  # Slurm's kill is far off
