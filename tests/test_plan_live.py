"""``plan`` in live runs: the coordinator records the run's history from the ranks' reports and
``plan`` schedules from it; ``simulate --calibrate`` fits the cost model to the run's files.

Parametrised over both computes. The first iteration runs collocated (``scheduler.time_slicing``), the
second disaggregated. The emulated ranks report their decode step time, so the
forecast is fitted and decides from the second iteration on; the real engines report no per-step
time (synchronous generation), so on ``cpu`` the forecast stays unfitted and ``plan`` keeps
RLinf's rules (its cold start) — every other behaviour is the same.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from slurm_rl.control.atomic import read_json
from slurm_rl.control.events import read_events
from slurm_rl.control.paths import RunPaths
from slurm_rl.scheduler.calibrate import calibrate
from slurm_rl.inspect.report import read_metrics
from slurm_rl.scheduler import defaults
from slurm_rl.inspect.summary import format_summary, run_report_json
from slurm_rl.scheduler.history import History
from identity import assert_losses_match, assert_params_match
from test_live_scheduling import COSTS, REPO
from test_scheduling_backends import check_every_sample_once, config, epochs_of, run
from cli_command import CLI
from emulated_configs import write_config
from resume_helpers import run_until_stopped
from shared_runs import shared_root, shared_run

BACKENDS = ["emulated", "cpu"]


def static_cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The finished 4-iteration static cpu run of the config the plan runs train (made once per session)."""
    def make(base: Path) -> tuple[Path, str]:
        return run(base, "static", config("cpu", base / "static", "static", iterations=4)), ""

    return shared_run(shared_root(tmp_path_factory), "plan-live-static-cpu", make)[0]


@pytest.mark.slow
@pytest.mark.parametrize("device", BACKENDS)
def test_plan_learns_from_the_run_and_schedules(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                device: str) -> None:
    """Four iterations under ``plan`` with ``scheduler.time_slicing`` (the default): the first collocated
    (epoch 0 puts every component on every rank, the actor built there), the second disaggregated from
    plan's iteration-start placement, the third collocated again (the first measured the start) unless the
    forecast of a collocated iteration rules it out, the fourth in the mode whose measured iterations were
    faster; on cpu the run trains as the static run of the same config."""
    cfg = config(device, tmp_path / "run", "plan", iterations=4)
    cfg["runtime"]["keep_iterations"] = 4
    run_dir = run(tmp_path, "plan", cfg)
    history = History.from_json(read_json(RunPaths(run_dir).history))
    samples = cfg["train"]["rollout_batch_size"] * cfg["train"]["group_size"]
    assert history.iterations_done == 4
    assert sum(history.lengths) == 4 * samples and history.longest > 0
    # the collocated iteration 0 leaves more decode idle than the work a disaggregated one overlaps with it (1.4-1.8
    # times, measured over six runs, also beside three busy loops): iteration 1 tries disaggregation; a gate that
    # keeps co-location says why in a "kept" event
    kept = {e["iteration"]: e["reason"] for e in read_events(RunPaths(run_dir), "kept")}
    assert history.time_sliced[:2] == (True, False), (history.time_sliced, kept)
    assert "the first iteration" in kept[0] and 1 not in kept, kept
    # ... and the run's summary shows it under the epochs (`slurm-rl inspect`)
    report = run_report_json(run_dir)
    assert [k["iteration"] for k in report["kept"]] == sorted(kept), report["kept"]
    assert "placement kept at the gate of iteration 0 (no epoch): plan: iteration 0 collocated" in \
        format_summary(run_dir, report=report)
    # iteration 2 tries co-location again (the first iteration measured the start), unless its forecast says
    # it cannot pay; iteration 3 runs the mode its measured iterations chose
    starts = {}  # the iteration-start epoch in force at each iteration (none is published for one that keeps it)
    for e in epochs_of(run_dir):
        if e.boundary == "iteration" and e.epoch > 0:
            starts.update({k: e for k in range(e.iteration, cfg["train"]["num_iterations"])})
    skipped = "collocated not tried" in starts[2].reason
    assert history.time_sliced[2] == (not skipped), (history.time_sliced, starts[2].reason)
    if not skipped:
        sliced, apart = history.iteration_s[2], history.iteration_s[1]
        assert history.time_sliced[3] == (sliced < apart * (1 - defaults.TIME_SLICING_MARGIN)), history.iteration_s
    for k in (2, 3):
        assert history.time_sliced[k] == ("collocated (every component" in starts[k].reason), starts[k].reason
    # the pace inference keeps: the collocated iteration 0's until a disaggregated one measured it
    assert history.inference[0] == (1 + history.time_sliced.count(False)) * samples and history.inference[1] > 0
    assert len(history.curve) == 10

    epochs = epochs_of(run_dir)
    world = list(range(cfg["cluster"]["gpus_per_node"]))
    # epoch 0 puts every component on every rank: the actor builds there (no reshard when it first trains),
    # and plan keeps it at gate 0
    assert epochs[0].reason.startswith("initial placement: every component on every rank"), epochs[0].reason
    assert all(epochs[0].ranks_of(c) == world for c in ("actor", "rollout", "inference"))
    assert not [e for e in epochs if e.iteration == 0 and e.epoch > 0], epochs
    actor0 = [int(r) for r in str(cfg["cluster"]["component_placement"]["actor"]).split("-")]
    start1 = [e for e in epochs if e.boundary == "iteration" and e.iteration == 1]
    assert start1 and start1[0].ranks_of("actor") == [] and set(actor0) <= set(start1[0].ranks_of("rollout"))
    decisions = [e for e in read_events(RunPaths(run_dir), "decision") if e.get("mid_iteration")]
    reasons = [(e["iteration"], e["reason"]) for e in decisions]
    # a decision that forecast the iteration's end records it, in seconds after the iteration's release (the
    # history's iteration times count from there too); the rules' decisions forecast nothing. Measured misses
    # over three emulated runs: +24..+28 % in iteration 1 (the one after the collocated start), within 10 % later
    for e in decisions:
        assert (e["forecast_end_s"] is not None) == ("forecast end in" in e["reason"]), e
        if e["forecast_end_s"] is not None:
            actual = history.iteration_s[e["iteration"]]
            assert abs(e["forecast_end_s"] - actual) < 0.5 * actual, (e, history.iteration_s)
    assert all(r.startswith("plan") for _, r in reasons), reasons
    assert not any(k == 0 for k, _ in reasons), reasons  # a collocated iteration's ranks switch on their own
    learned = [r for k, r in reasons if k >= 1 and "forecast end" in r]
    if device == "emulated":
        assert history.decode.line() is not None and history.minibatches
        assert learned, reasons  # the forecast decides once it has measured a mini-batch
    else:
        assert history.decode.line() is None and not learned  # no decode figures: RLinf's rules
        static = static_cpu_run(tmp_path_factory)
        losses = {name: [x for m in read_metrics(d) for x in m["losses"]] for name, d in
                  (("plan", run_dir), ("static", static))}
        assert len(losses["static"]) == 16
        assert_losses_match(losses["plan"], losses["static"])
        # the collocated iteration's DP 4 sums the gradients in another order than DP 1 (measured: 3.6e-5 of
        # the embedding's largest entry after Adam's 16 steps; the losses agree within the identity tolerance)
        assert_params_match(run_dir, static, rtol=1e-4)
    check_every_sample_once(run_dir, cfg, leader=0)


@pytest.mark.slow
@pytest.mark.parametrize("device", BACKENDS)
def test_plan_run_stopped_at_a_gate_resumes_collocated(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                       device: str) -> None:
    """A ``plan`` run (time slicing on) stopped at the gate of iteration 2 and resumed: the resumed incarnation's
    first epoch puts every component on every rank again (its ranks rebuild the actor there and load the
    checkpoint), plan goes on from the history the run recorded, every sample trains once; on cpu the run
    trains as the static run of the same config."""
    run_dir = tmp_path / "run"
    cfg = config(device, run_dir, "plan", iterations=4)
    cfg["runtime"]["keep_iterations"] = 4
    out = run_until_stopped(write_config(tmp_path / "c.yaml", cfg), run_dir, at_iteration=2)
    assert "resume with: slurm-rl run --resume" in out, out
    resumed = subprocess.run([*CLI, "run", "--resume", str(run_dir), "--no-inspect"], cwd=REPO,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    world = list(range(cfg["cluster"]["gpus_per_node"]))
    again = [e for e in epochs_of(run_dir) if e.reason.startswith("resumed at iteration 2")]
    assert len(again) == 1 and all(again[0].ranks_of(c) == world for c in ("actor", "rollout", "inference"))
    history = History.from_json(read_json(RunPaths(run_dir).history))
    assert history.iterations_done == 4 and history.time_sliced[:2] == (True, False), history.time_sliced
    assert [m["iteration"] for m in read_metrics(run_dir)] == [0, 1, 2, 3]
    check_every_sample_once(run_dir, cfg, leader=0)
    if device == "cpu":
        static = static_cpu_run(tmp_path_factory)
        assert_losses_match([x for m in read_metrics(run_dir) for x in m["losses"]],
                            [x for m in read_metrics(static) for x in m["losses"]])
        assert_params_match(run_dir, static, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.serial(seconds=7)
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
