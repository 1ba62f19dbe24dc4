"""On the local Slurm cluster, for real: a batch job preempted ahead of its end (USR1 from
``scancel --signal=USR1 --batch``), or one whose rank is SIGKILLed with
``runtime.on_rank_failure: checkpoint_and_requeue``, checkpoints, requeues itself, resumes the
same RUN_DIR and ends with what an uninterrupted run produces; likewise a submitit job."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from resume_helpers import BACKENDS, INTERRUPTIBLE, assert_same_outcome, run_config, wait_until
from slurm_rl.control.events import read_events
from slurm_rl.control.heartbeats import read_heartbeat
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.progress import read_all_progress
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]
JOB_TIMEOUT_S = 900.0

# Each test waits on real Slurm requeues (a job leaves a node, is requeued, waits for one again): 30-100 s of
# mostly waiting, so the whole module runs with the full suite, not in the quick loop
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _sbatch(cluster, config: Path, log: Path) -> str:
    proc = cluster.run("sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=4", "--gres=gpu:4",
                       "--open-mode=append", f"--output={log}", str(REPO / "sbatch" / "train.sh"), str(config))
    return proc.stdout.strip().split(";")[0]


def _config(backend: str, tmp_path: Path, **runtime) -> tuple[Path, Path]:
    run_dir = tmp_path / "run"
    cfg = run_config(backend, run_dir, reward_workers=2, **runtime)  # the pool's workers see the job's signals too
    del cfg["cluster"]["gpus_per_node"]  # from the allocation
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return config, run_dir


def _in_iteration(run_dir: Path, k: int) -> bool:
    docs = read_all_progress(RunPaths(run_dir), range(4)).values()
    return any(d.iteration == k and d.state == "working" for d in docs)


def _finish(cluster, job_id: str, run_dir: Path, log: Path) -> str:
    wait_until(f"job {job_id} to end", lambda: cluster.job_gone(job_id), timeout=JOB_TIMEOUT_S)
    text = log.read_text()
    status = read_coordinator_status(RunPaths(run_dir))
    assert status is not None and status.state == "finished", text
    return text


@pytest.mark.parametrize("backend", BACKENDS)
def test_preempted_batch_job_checkpoints_requeues_and_resumes(slurm_cluster, backend: str, reference,
                                                              tmp_path: Path) -> None:
    config, run_dir = _config(backend, tmp_path, **INTERRUPTIBLE)
    log = tmp_path / "job.out"
    job_id = _sbatch(slurm_cluster, config, log)
    wait_until("iteration 0 to start", lambda: _in_iteration(run_dir, 0), timeout=JOB_TIMEOUT_S)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job_id)  # what --signal=B:USR1@120 sends
    text = _finish(slurm_cluster, job_id, run_dir, log)
    assert "USR1 (preemption/time limit) received" in text
    gate = re.search(rf"requeueing job {job_id}: stopped at the gate of iteration (\d+)", text)
    assert gate is not None and 0 < int(gate.group(1)) < 4, text  # the next gate after the signal
    assert f"resuming at iteration {gate.group(1)} from checkpoints/iter-{int(gate.group(1)):06d}" in text
    kinds = [e["kind"] for e in read_events(RunPaths(run_dir))]
    assert kinds.count("stopped") == 1 and kinds.count("resumed") == 1
    assert_same_outcome(run_dir, reference(backend))
    if slurm_cluster.accounting:
        assert slurm_cluster.wait_sacct_state(job_id) == "COMPLETED"


def _rank_pid(run_dir: Path, rank: int) -> int:
    """The pid of rank ``rank``'s worker process, from its heartbeat (a rank forked by the node's
    task shows that task's cmdline and environ in /proc)."""
    beat = read_heartbeat(RunPaths(run_dir), rank)
    if beat is None:
        raise LookupError(f"no heartbeat of rank {rank} in {run_dir}")
    return int(beat["pid"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_job_with_a_killed_rank_requeues_from_its_last_checkpoint(slurm_cluster, backend: str, reference,
                                                                        tmp_path: Path) -> None:
    config, run_dir = _config(backend, tmp_path, checkpoint_every=1, on_rank_failure="checkpoint_and_requeue",
                              **INTERRUPTIBLE)
    log = tmp_path / "job.out"
    job_id = _sbatch(slurm_cluster, config, log)
    wait_until("iteration 2 to start", lambda: _in_iteration(run_dir, 2), timeout=JOB_TIMEOUT_S)
    os.kill(_rank_pid(run_dir, 2), signal.SIGKILL)
    text = _finish(slurm_cluster, job_id, run_dir, log)
    assert f"requeueing job {job_id}: rank failure" in text
    assert "resuming at iteration 2 from checkpoints/iter-000002" in text
    assert_same_outcome(run_dir, reference(backend))


def test_batch_job_with_a_killed_rank_fails_by_default(slurm_cluster, tmp_path: Path) -> None:
    config, run_dir = _config("emulated", tmp_path)
    log = tmp_path / "job.out"
    job_id = _sbatch(slurm_cluster, config, log)
    wait_until("iteration 1 to start", lambda: _in_iteration(run_dir, 1), timeout=JOB_TIMEOUT_S)
    os.kill(_rank_pid(run_dir, 1), signal.SIGKILL)
    wait_until(f"job {job_id} to end", lambda: slurm_cluster.job_gone(job_id), timeout=JOB_TIMEOUT_S)
    text = log.read_text()
    assert "not requeued: ranks exited with code" in text and "runtime.on_rank_failure is 'fail'" in text
    assert len(read_metrics(run_dir)) < 4


@pytest.mark.slow
def test_submitit_job_preempted_checkpoints_requeues_and_resumes(slurm_cluster, reference, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_rl.launch.submit import submit

    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(run_config("emulated", run_dir)))
    job = submit(config, executor="slurm", slurm_params={"gres": "gpu:4"})
    wait_until("iteration 0 to start", lambda: _in_iteration(run_dir, 0), timeout=JOB_TIMEOUT_S)
    slurm_cluster.run("scancel", "--signal=USR2", str(job.job_id))  # submitit's preemption / time-limit signal
    assert job.results() == [0]  # one node: its task forked the 4 ranks
    kinds = [e["kind"] for e in read_events(RunPaths(run_dir))]
    assert kinds.count("stopped") == 1 and kinds.count("resumed") == 1
    assert_same_outcome(run_dir, reference("emulated"))
    restarts = subprocess.run(["scontrol", "show", "job", str(job.job_id)], env=dict(slurm_cluster.env),
                              capture_output=True, text=True).stdout
    assert "Restarts=1" in restarts or not restarts.strip()  # purged jobs show nothing
