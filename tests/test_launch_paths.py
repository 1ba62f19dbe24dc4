"""The launch paths on a real Slurm (sbatch, submitit slurm executor) and submitit's local executor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from emulated_configs import emulated_config, write_config
from slurm_rl.inspect.report import report_json
from slurm_rl.launch.rank_env import RankDiscoveryError, discover_rank, port_for_job

REPO = Path(__file__).resolve().parents[1]


def _slurm_config(tmp_path: Path, run_dir: Path) -> Path:
    """2 nodes x 4 slots; gpus_per_node comes from the allocation."""
    cfg = emulated_config(run_dir, nodes=2, gpus_per_node=4)
    del cfg["cluster"]["gpus_per_node"]
    return write_config(tmp_path / "slurm.yaml", cfg)


def _check_run(run_dir: Path, world: int, hosts: set[str] | None = None) -> None:
    records = report_json(run_dir)["epochs"]
    assert len(records) == 3, records
    assert all(r["acks"] == world for r in records)
    if hosts is not None:
        seen = {json.loads(p.read_text())["host"] for p in (run_dir / "control" / "acks" / "000000").glob("rank-*.json")}
        assert seen == hosts


def test_rank_discovery_sources() -> None:
    local = discover_rank({"SLURM_RL_RANK": "3", "SLURM_RL_WORLD_SIZE": "8", "SLURM_RL_LOCAL_RANK": "3",
                           "SLURM_RL_JOB_ID": "local-1"})
    assert (local.rank, local.world_size, local.source) == (3, 8, "local")
    slurm = discover_rank({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
                           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "2",
                           "SLURMD_NODENAME": "n2", "SLURM_RL_MASTER_ADDR": "127.0.0.1"})
    assert (slurm.rank, slurm.node_rank, slurm.host, slurm.source) == (5, 1, "n2", "slurm")
    assert slurm.master_port == port_for_job("4242") != port_for_job("4243")
    with pytest.raises(RankDiscoveryError, match="SLURM_RL_RANK"):
        discover_rank({})
    with pytest.raises(RankDiscoveryError, match="SLURM_NTASKS"):
        discover_rank({"SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "localhost"})


@pytest.mark.slow
def test_submitit_local_executor(tmp_path: Path) -> None:
    from slurm_rl.launch.submit import submit

    run_dir = tmp_path / "run"
    job = submit(write_config(tmp_path / "c.yaml", emulated_config(run_dir)), executor="local")
    assert job.results() == [0] * 8
    _check_run(run_dir, 8)


@pytest.mark.slow
@pytest.mark.slurm
def test_sbatch_path_on_real_slurm(slurm_cluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "job.out"
    proc = subprocess.run(
        ["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4", f"--output={log}",
         "sbatch/train.sh", str(_slurm_config(tmp_path, run_dir))],
        cwd=REPO, env=dict(slurm_cluster.env), capture_output=True, text=True, timeout=600,
    )
    text = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + text
    assert text.splitlines()[0] == f"slurm_rl run dir: {run_dir}"
    _check_run(run_dir, 8, hosts={"n1", "n2"})
    inspected = subprocess.run([sys.executable, "-m", "slurm_rl.cli", "inspect", str(run_dir)], cwd=REPO,
                               capture_output=True, text=True, timeout=60)
    assert inspected.returncode == 0 and "placement epochs" in inspected.stdout


@pytest.mark.slow
@pytest.mark.slurm
def test_sbatch_rejects_bad_config_with_exit_2(slurm_cluster, tmp_path: Path) -> None:
    cfg = emulated_config(tmp_path / "never", nodes=2, gpus_per_node=4)
    cfg["cluster"]["component_placement"]["inference"] = "6-9"
    log = tmp_path / "job.out"
    proc = subprocess.run(
        ["sbatch", "--wait", "--nodes=1", "--ntasks-per-node=1", f"--output={log}", "sbatch/train.sh",
         str(write_config(tmp_path / "bad.yaml", cfg))],
        cwd=REPO, env=dict(slurm_cluster.env), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cluster.component_placement.inference" in log.read_text()
    assert not (tmp_path / "never").exists()


@pytest.mark.slow
@pytest.mark.slurm
def test_submitit_slurm_executor(slurm_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_rl.launch.submit import submit

    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    run_dir = tmp_path / "run"
    # Submitting happens outside the allocation, so the config states the slots per node.
    config = write_config(tmp_path / "c.yaml", emulated_config(run_dir, nodes=2, gpus_per_node=4))
    job = submit(config, executor="slurm", slurm_params={"gres": "gpu:4"})
    assert job.results() == [0] * 8
    _check_run(run_dir, 8, hosts={"n1", "n2"})
    if slurm_cluster.accounting:
        assert slurm_cluster.wait_sacct_state(str(job.job_id)) == "COMPLETED"
