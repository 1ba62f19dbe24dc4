"""A run's time limit and GPUs as the job gives them, without a cluster: ``job_limits.run_limit`` from the
config, ``SLURM_JOB_END_TIME`` or the local default; ``gpu_request`` reading a job's GPU variables and
naming the sbatch flags; ``slurm-rl validate ... | head`` ending quietly. On the local Slurm cluster:
tests/test_job_limits_slurm.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emulated_configs import emulated_config
from slurm_rl.config import config_from_yaml_text
from slurm_rl.job_limits import LOCAL_RUN_TIMEOUT_S, job_timeout_s, run_limit
from slurm_rl.launch.gpu_request import allocation_gpus_per_node, allocation_problem, gpu_need

REPO = Path(__file__).resolve().parents[1]
CUDA = ("cluster: {num_nodes: 1, gpus_per_node: 4, component_placement: {actor: 0, rollout: 1-2, inference: 3}}\n"
        "runtime: {device: cuda}\ndata: {train_files: [p.jsonl]}\nreward: {name: exact}\n")


def test_the_configs_timeout_wins() -> None:
    limit = run_limit(600.0, 120.0, env={"SLURM_JOB_ID": "7", "SLURM_JOB_END_TIME": "2000"}, now=1000.0)
    assert (limit.deadline, limit.timeout_s, limit.source) == (1600.0, 600.0, "runtime.run_timeout_s")


def test_null_is_the_jobs_end_less_the_margin() -> None:
    limit = run_limit(None, 120.0, env={"SLURM_JOB_ID": "7", "SLURM_JOB_END_TIME": "5000"}, now=1000.0)
    assert limit.deadline == 5000.0 - 120.0 and limit.timeout_s == 3880.0
    assert "Slurm job 7 ends then (SLURM_JOB_END_TIME)" in limit.source and "checkpoint_margin_s 120s" in limit.source
    late = run_limit(None, 120.0, env={"SLURM_JOB_ID": "7", "SLURM_JOB_END_TIME": "1050"}, now=1000.0)
    assert late.timeout_s == 0.0  # less left than the margin: stop at the first gate


def test_null_outside_a_job_is_four_hours() -> None:
    limit = run_limit(None, 120.0, env={}, now=0.0)
    assert limit.timeout_s == LOCAL_RUN_TIMEOUT_S == 4 * 3600 and "not in a Slurm job" in limit.source
    assert job_timeout_s(None, 120.0) == 4 * 3600 + 120 and job_timeout_s(1800.0, 120.0) == 1920.0


def test_a_job_without_an_end_time_falls_back_to_four_hours() -> None:
    """No SLURM_JOB_END_TIME and no squeue that knows the job: the local default, saying why."""
    limit = run_limit(None, 120.0, env={"SLURM_JOB_ID": "999999", "PATH": "/nonexistent"}, now=0.0)
    assert limit.timeout_s == LOCAL_RUN_TIMEOUT_S and "squeue -j 999999" in limit.source


@pytest.mark.parametrize("env,gpus", [
    ({}, 0), ({"SLURM_GPUS_ON_NODE": "4"}, 4), ({"SLURM_JOB_GPUS": "0,1"}, 2), ({"SLURM_GPUS_PER_NODE": "a100:8"}, 8),
    ({"SLURM_TRES_PER_NODE": "gres/gpu:2"}, 2), ({"SLURM_TRES_PER_NODE": "cpu=4"}, 0)])
def test_gpus_of_the_allocation(env: dict, gpus: int) -> None:
    assert allocation_gpus_per_node(env) == gpus


def test_a_cuda_config_in_a_job_without_gpus_names_the_flags() -> None:
    cfg = config_from_yaml_text(CUDA)
    problem = allocation_problem(cfg, {"SLURM_JOB_ID": "12"})
    assert problem is not None and "Slurm job 12 holds 0 GPU(s) per node, but the config needs 4" in problem
    assert "sbatch --nodes=1 --ntasks-per-node=4 --gres=gpu:4 sbatch/train.sh CONFIG" in problem
    assert allocation_problem(cfg, {"SLURM_JOB_ID": "12", "SLURM_GPUS_ON_NODE": "4"}) is None
    assert allocation_problem(cfg, {}) is None  # outside a job: validate, run and submit decide


def test_what_needs_gpus() -> None:
    auto = config_from_yaml_text(CUDA.replace("device: cuda", "device: auto"))
    assert gpu_need(auto) is None and "500M parameters" in gpu_need(auto, parameters=500_000_000)
    vllm = config_from_yaml_text(CUDA.replace("device: cuda", "device: auto") + "rollout: {backend: vllm, max_new_tokens: 64}\n")
    assert gpu_need(vllm) == "runtime.device auto with rollout.backend vllm"
    assert gpu_need(config_from_yaml_text(CUDA.replace("device: cuda", "device: cpu"))) is None


def test_validate_into_head_ends_without_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(emulated_config(tmp_path / "run")))
    proc = subprocess.run(f"{sys.executable} -m slurm_rl.cli validate {config} | head -1", shell=True, cwd=REPO,
                          capture_output=True, text=True, timeout=120, executable="/bin/bash")
    assert proc.stdout.startswith(f"config {config}: valid"), proc.stdout
    assert proc.stderr == "", proc.stderr  # no BrokenPipeError, no "Exception ignored"
