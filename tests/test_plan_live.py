"""``plan`` in live runs: the coordinator records the run's history from the ranks' reports and
``plan`` schedules from it; ``simulate --calibrate`` fits the cost model to the run's files.

Parametrised over both computes. The emulated ranks report their decode step time, so the
forecast is fitted and decides from the second iteration on; the real engines report no per-step
time (synchronous generation), so on ``cpu`` the forecast stays unfitted and ``plan`` keeps
RLinf's rules (its cold start) — every other behaviour is the same.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_rl.control.atomic import read_json
from slurm_rl.control.events import read_events
from slurm_rl.control.paths import RunPaths
from slurm_rl.scheduler.calibrate import calibrate
from slurm_rl.scheduler.history import History
from test_live_scheduling import COSTS, REPO
from test_scheduling_backends import check_every_sample_once, config, epochs_of, run
from cli_command import CLI

BACKENDS = ["emulated", "cpu"]


@pytest.mark.slow
@pytest.mark.parametrize("device", BACKENDS)
def test_plan_learns_from_the_run_and_schedules(tmp_path: Path, device: str) -> None:
    cfg = config(device, tmp_path / "run", "plan", iterations=2)
    run_dir = run(tmp_path, "plan", cfg)
    history = History.from_json(read_json(RunPaths(run_dir).history))
    samples = cfg["train"]["rollout_batch_size"] * cfg["train"]["group_size"]
    assert history.iterations_done == 2
    assert sum(history.lengths) == 2 * samples and history.longest > 0
    assert history.inference[0] == 2 * samples and history.inference[1] > 0
    assert len(history.curve) == 10 and history.iteration_s

    epochs = epochs_of(run_dir)
    actor0 = epochs[0].ranks_of("actor")
    starts = [e for e in epochs if e.boundary == "iteration" and e.epoch > 0]
    assert starts and all(e.ranks_of("actor") == [] and set(actor0) <= set(e.ranks_of("rollout")) for e in starts)
    reasons = [(e["iteration"], e["reason"]) for e in read_events(RunPaths(run_dir), "decision")
               if e.get("mid_iteration")]
    assert all(r.startswith("plan") for _, r in reasons), reasons
    learned = [r for k, r in reasons if k >= 1 and "forecast end" in r]
    if device == "emulated":
        assert history.decode.line() is not None and history.minibatches
        assert learned, reasons  # the forecast decides once it has measured a mini-batch
    else:
        assert history.decode.line() is None and not learned  # no decode figures: RLinf's rules
    check_every_sample_once(run_dir, cfg, leader=actor0[0])


@pytest.mark.slow
@pytest.mark.serial
def test_calibrate_recovers_the_emulated_costs(tmp_path: Path) -> None:
    """The emulated ranks follow known costs: calibration fitted from the run's files finds them,
    and the calibrated simulation predicts the run within 10 %."""
    cfg = config("emulated", tmp_path / "run", "auto", iterations=3)
    run_dir = run(tmp_path, "cal", cfg)
    report = calibrate(run_dir)
    fitted = report["fitted"]
    assert fitted["rollout_s_per_token"] == pytest.approx(COSTS["rollout_s_per_token"], rel=0.05)
    assert fitted["decode_fixed_fraction"] == pytest.approx(COSTS["decode_fixed_fraction"], rel=0.1)
    assert fitted["actor_s_per_token"] == pytest.approx(COSTS["actor_s_per_token"], rel=0.1)
    assert fitted["inference_s_per_token"] == pytest.approx(COSTS["inference_s_per_token"], rel=0.25)
    assert fitted["response_len_mean"] == pytest.approx(COSTS["response_len_mean"], rel=0.25)
    assert report["within_10pct"], report
    proc = subprocess.run([*CLI, "simulate", "--calibrate", str(run_dir)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fitted"] == fitted


def test_calibrate_refuses_a_directory_without_a_run(tmp_path: Path) -> None:
    proc = subprocess.run([*CLI, "simulate", "--calibrate", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "config.yaml" in proc.stderr
    both = subprocess.run([*CLI, "simulate", "x.yaml", "--calibrate", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert both.returncode == 2 and "takes no config" in both.stderr
