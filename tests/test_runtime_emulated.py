"""End-to-end local runs with emulated compute: real processes, files, epochs, acks, Arrow batches."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulated_configs import emulated_config, write_config
from slurm_rl.control.epochs import EpochStore
from slurm_rl.control.paths import RunPaths
from slurm_rl.inspect.report import report_json
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, **kw)


def test_local_run_8_ranks_three_epochs(scripted_run: tuple[Path, str]) -> None:
    run_dir, out = scripted_run  # emulated_config(run_dir), launched with `slurm-rl run`
    assert "placement epochs" in out

    epochs = EpochStore(RunPaths(run_dir)).all()
    assert [e.epoch for e in epochs] == [0, 1, 2]
    assert epochs[1].ranks_of("actor") == [0, 1, 2, 3] and epochs[1].ranks_of("inference") == []
    assert epochs[2].ranks_of("inference") == [6, 7]
    assert (os.stat(run_dir).st_mode & 0o777) == 0o700

    report = report_json(run_dir)
    for record in report["epochs"]:
        assert record["acks"] == 8, record
        assert record["switch_latency_s"] is not None and record["switch_latency_s"] < 30
    # Ranks 2 and 3 join the actor at epoch 1: they receive actor state (emulated reshard).
    assert report["epochs"][1]["bytes_moved"] > 0
    assert [m["iteration"] for m in report["metrics"]] == [0, 1, 2]
    assert all(m["samples"] == 64 for m in report["metrics"])

    # Each rank's roles came only from the epochs it acknowledged.
    for e in epochs:
        for rank in range(8):
            ack = json.loads(RunPaths(run_dir).ack(e.epoch, rank).read_text())
            assert ack["figures"]["roles"] == e.role_of(rank)

    inspected = _cli("inspect", str(run_dir), "--json")
    assert inspected.returncode == 0, inspected.stderr
    rows = json.loads(inspected.stdout)["epochs"]
    assert {"epoch", "published_at", "reason", "placement", "switch_latency_s"} <= set(rows[0])
    assert len(rows) == 3


@pytest.mark.slow
@pytest.mark.serial(seconds=5, slots=2)  # 64 ranks keep more than a core busy: beside no other serial test
def test_local_run_64_emulated_ranks(run_64: Path) -> None:
    records = report_json(run_64)["epochs"]
    assert len(records) == 3 and all(r["acks"] == 64 for r in records)


def test_bad_config_exits_2_and_launches_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "never"
    cfg = emulated_config(run_dir)
    cfg["cluster"]["component_placement"]["actor"] = "3-1"
    cfg["runtime"]["device"] = "tpu"
    proc = _cli("run", str(write_config(tmp_path / "bad.yaml", cfg)))
    assert proc.returncode == 2
    assert "cluster.component_placement.actor" in proc.stderr and "'3-1'" in proc.stderr
    assert "runtime.device" in proc.stderr and "tpu" in proc.stderr
    assert not run_dir.exists()


def test_stalled_rank_fails_run_naming_it(tmp_path: Path) -> None:
    """A rank that stops (SIGSTOP: alive but silent) is declared dead by its stale heartbeat."""
    run_dir = tmp_path / "run"
    cfg = emulated_config(run_dir, iterations=30, heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0, wait_timeout_s=60.0)
    cfg["emulated"]["rollout_s_per_token"] = 2.0e-4  # slow enough to stop a rank mid-run
    path = write_config(tmp_path / "c.yaml", cfg)
    proc = subprocess.Popen([*CLI, "run", str(path), "--no-inspect"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = None
    deadline = time.monotonic() + 120
    while victim is None and time.monotonic() < deadline:
        hb = RunPaths(run_dir).heartbeat(5)
        if hb.exists() and RunPaths(run_dir).ack(0, 5).exists():
            victim = json.loads(hb.read_text())["pid"]
        time.sleep(0.1)
    assert victim is not None, "rank 5 never started"
    os.kill(victim, signal.SIGSTOP)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 1, out + err
    coordinator_log = (run_dir / "logs" / "coordinator.log").read_text()
    # on a failure, everything that says who stopped the run (an empty coordinator log was seen once)
    said = {f.name: f.read_text()[-1500:] for f in sorted((run_dir / "logs").glob("*.log"))}
    assert "rank 5" in coordinator_log and "heartbeat" in coordinator_log, (out[-2000:], err[-2000:], said)


@pytest.mark.slow
def test_sigusr1_from_slurm_stops_the_run_at_a_gate_with_a_checkpoint(tmp_path: Path) -> None:
    """sbatch/train.sh forwards Slurm's USR1 (time limit ahead) to the ranks: the rank that gets it
    is not killed; it asks for a checkpoint and a stop at the next iteration gate."""
    run_dir = tmp_path / "run"
    cfg = emulated_config(run_dir, iterations=6)  # time enough for the stop to land before the end
    cfg["emulated"]["rollout_s_per_token"] = 5.0e-5
    proc = subprocess.Popen([*CLI, "run", str(write_config(tmp_path / "c.yaml", cfg)),
                             "--no-inspect"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ack = RunPaths(run_dir).ack(0, 3)
    deadline = time.monotonic() + 120
    while not ack.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ack.exists(), "rank 3 never acknowledged epoch 0"
    os.kill(json.loads(RunPaths(run_dir).heartbeat(3).read_text())["pid"], signal.SIGUSR1)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, out + err  # stopped with a checkpoint, resumable
    assert "SIGUSR1 received; stop requested" in (run_dir / "logs" / "rank-0003.log").read_text()
    status = json.loads((run_dir / "control" / "coordinator.json").read_text())
    gate = status["stopped_at_iteration"]
    assert status["state"] == "stopped" and 0 <= gate < 6
    if gate > 0:  # a stop at gate 0 (before any work) needs no checkpoint: the run resumes from the start
        assert (run_dir / "checkpoints" / f"iter-{gate:06d}" / "run.json").exists()
    else:
        assert status["checkpoint"] is None
