"""What a user sees of a run: live progress, the one-screen summary, the placement timeline (Gantt),
--follow on a live run, --compare, TensorBoard files, and inspection of failed or half-written runs.
Every test runs real emulated runs and reads their files."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from emulated_configs import emulated_config, write_config
from slurm_rl.control.acks import read_ack
from slurm_rl.control.activity import activity_file, read_spans
from slurm_rl.control.epochs import EpochStore
from slurm_rl.control.paths import RunPaths
from slurm_rl.inspect.run_gantt import text_gantt, write_run_gantt
from slurm_rl.inspect.run_timeline import build_timeline, component_seconds
from slurm_rl.inspect.summary import collapse_epochs, run_report_json, sparkline
from slurm_rl.inspect.epoch_log import epoch_records
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def _run(tmp: Path, name: str, policy: str = "scripted", iterations: int = 3, **runtime) -> tuple[Path, str]:
    """A finished 8-rank emulated run (``scripted``: two placement changes); its dir and stdout."""
    run_dir = tmp / name
    cfg = emulated_config(run_dir, iterations=iterations, **runtime)
    if policy == "static":
        cfg["scheduler"] = {"policy": "static"}
    proc = _cli("run", str(write_config(tmp / f"{name}.yaml", cfg)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir, proc.stdout


def test_run_prints_progress_summary_and_next_steps(scripted_run: tuple[Path, str]) -> None:
    run_dir, out = scripted_run
    # live lines (plain: stdout is not a terminal), one per iteration, in order
    assert "epoch 0 published (actor 0-1, rollout 2-5, inference 6-7)" in out
    positions = [out.index(f"iteration {k}/3 · reward ") for k in (1, 2, 3)]
    assert positions == sorted(positions)
    assert "iteration 3/3 · " in out and "last iteration" in out
    # no silence at startup: a startup phase was named (for all ranks or for the groups of ranks that
    # reached it together), or the ranks were up so fast that the first line says epoch 0 is out
    first = next(line for line in out.splitlines() if line.startswith("["))
    assert re.search(r"\branks? [0-9,-]+: \w", out.split("epoch 0 published")[0]) or "epoch 0 published" in first
    # the summary, then where things are
    assert "placement epochs (3;" in out and "GPU-seconds" in out and "placement timeline" in out
    assert f"slurm-rl inspect {run_dir}" in out and str(run_dir / "timeline.png") in out
    assert (run_dir / "timeline.png").read_bytes()[:8] == PNG_MAGIC


def test_gantt_bars_match_epochs_and_acks(scripted_run: tuple[Path, str]) -> None:
    run_dir, _ = scripted_run
    paths = RunPaths(run_dir)
    tl = build_timeline(run_dir)
    epochs = EpochStore(paths).all()
    assert tl.state == "finished" and tl.missing == []
    assert [e["epoch"] for e in tl.epochs] == [e.epoch for e in epochs] == [0, 1, 2]
    for e in epochs:
        for rank in range(8):
            (bar,) = [b for b in tl.bars if b.rank == rank and b.epoch == e.epoch]
            assert bar.start == read_ack(paths, e.epoch, rank)["applied_at"]
            assert list(bar.roles) == e.role_of(rank)  # the bar's colour is the epoch's rank set
    for rank in range(8):  # a rank's bars tile its time: each ends where the next begins
        bars = sorted((b for b in tl.bars if b.rank == rank), key=lambda b: b.start)
        assert all(a.end == b.start for a, b in zip(bars, bars[1:]))
        assert not bars[-1].open
    # the actor grows 2 -> 4 at epoch 1 (a reshard) and every iteration gate was logged
    assert [k for k, _ in tl.gates] == [0, 1, 2, 3]
    assert any(r["epoch"] == 1 and r["old"] == [0, 1] and r["new"] == [0, 1, 2, 3] for r in tl.reshards)
    # busy time from the activity spans: rollout ranks decoded, actor ranks trained, all inside the run
    spans = {rank: read_spans(paths, rank) for rank in range(8)}
    assert any(s["kind"] == "rollout" for r in (2, 3, 4, 5) for s in spans[r])
    assert all(any(s["kind"] == "actor" for s in spans[r]) for r in (0, 1))
    assert all(tl.t0 - 1 <= s["start"] <= s["end"] <= tl.end + 1 for ss in spans.values() for s in ss)
    comps = component_seconds(tl)
    lo, hi = tl.window
    assert sum(c["held_s"] for c in comps.values()) == pytest.approx(8 * (hi - lo), rel=0.02)
    for c in comps.values():
        assert 0 <= c["busy_s"] <= c["held_s"] + 1e-6
        assert c["busy_s"] + c["switch_s"] + c["bubble_s"] == pytest.approx(c["held_s"], abs=1e-6)
    assert comps["rollout"]["busy_s"] > 0 and comps["actor"]["busy_s"] > 0
    png = write_run_gantt(tl, run_dir / "check.png")
    assert png.read_bytes()[:8] == PNG_MAGIC
    rows = text_gantt(tl)
    assert rows[0].strip().startswith("gates/epochs") and "0" in rows[0] and "3" in rows[0]
    assert any(r.strip().startswith("rank 0 ") or r.strip().startswith("ranks 0-") for r in rows)
    assert len(rows) <= 2 + 8


@pytest.fixture(scope="module")
def followed_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A live 4-iteration run, followed by ``inspect --follow`` while it runs: the same two placements
    in every iteration (the second from half-way through each rollout), about a second per iteration.
    Its dir, the follower's lines (all, and those read while the run still ran) and exit code."""
    tmp = tmp_path_factory.mktemp("followed")
    run_dir = tmp / "repeat"
    cfg = emulated_config(run_dir, iterations=4)
    cfg["emulated"]["rollout_s_per_token"] = 4.0e-5
    start = {"actor": "0-1", "rollout": "2-5", "inference": "6-7"}
    cfg["scheduler"] = {"policy": "scripted", "script": [
        step for k in range(4) for step in (
            {"at_iteration": k, "placement": start},
            {"at_iteration": k, "at_phase": "rollout", "at_rollout_fraction": 0.5,
             "placement": {"actor": "0-1", "rollout": "2-3", "inference": "6-7"}})]}
    run = subprocess.Popen([*CLI, "run", str(write_config(tmp / "r.yaml", cfg)), "--no-inspect"], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    follow = None
    seen_all: list[str] = []
    seen_while_running: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "config.yaml").exists():
            assert time.monotonic() < deadline, "the run dir was never prepared"
            time.sleep(0.05)
        follow = subprocess.Popen([*CLI, "inspect", "--follow", str(run_dir), "--interval", "0.3"], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def read() -> None:
            assert follow is not None and follow.stdout is not None
            for line in follow.stdout:
                if "iterations " in line and run.poll() is None:
                    seen_while_running.append(line)
                seen_all.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        run_out, _ = run.communicate(timeout=300)
        assert run.returncode == 0, run_out
        follow.wait(timeout=60)  # it ends by itself once the coordinator says finished
        reader.join(timeout=10)
    finally:
        for p in (run, follow):
            if p is not None and p.poll() is None:
                p.kill()
    return {"run_dir": run_dir, "all": seen_all, "while_running": seen_while_running, "code": follow.returncode,
            "stderr": follow.stderr.read() if follow.stderr else ""}


def test_follow_shows_progress_of_a_live_run_and_exits_when_it_ends(followed_run: dict) -> None:
    assert followed_run["code"] == 0, "".join(followed_run["all"][-20:]) + followed_run["stderr"]
    progressing = [ln for ln in followed_run["while_running"] if "state running" in ln and "iterations 4/4" not in ln]
    assert any(f"iterations {k}/4" in ln for ln in progressing for k in range(1, 4)), "".join(
        followed_run["while_running"])
    assert "the run finished; stopped following" in "".join(followed_run["all"][-3:])


def test_summary_collapses_repeated_iterations_and_json_keeps_everything(followed_run: dict) -> None:
    """The same two placements in every iteration: the summary shows them once."""
    run_dir = followed_run["run_dir"]
    records = epoch_records(run_dir)
    groups = collapse_epochs(records)
    assert len(records) == 2 * 4 and [its for its, _ in groups] == [[0, 1, 2, 3]]  # two epochs per iteration
    short = _cli("inspect", str(run_dir))
    full = _cli("inspect", str(run_dir), "--all")
    assert short.returncode == full.returncode == 0, short.stderr + full.stderr
    assert "the same 2 epoch(s) in 3 more iteration(s): 1-3" in short.stdout and "the same" not in full.stdout
    assert len(short.stdout.splitlines()) < 60  # one screen
    doc = json.loads(_cli("inspect", str(run_dir), "--json").stdout)
    assert len(doc["epochs"]) == len(records) and len(doc["metrics"]) == 4
    assert {"facts", "components", "switch", "timeline", "metrics_summary", "missing"} <= set(doc)
    assert doc["switch"]["latency_s"]["p50"] is not None
    # every rank's peak host memory from its last heartbeat (written when it stopped), the largest named
    peaks = {int(r): v for r, v in doc["memory"]["peak_rss_bytes"].items()}
    assert sorted(peaks) == list(range(doc["facts"]["world_size"])) and all(v > 10 * 2**20 for v in peaks.values())
    assert peaks[doc["memory"]["max_rank"]] == max(peaks.values())
    assert f"peak host memory (RSS) per rank: max {max(peaks.values()) / 2**30:.2f} GiB" in short.stdout


def test_compare_static_and_scripted(tmp_path: Path, scripted_run: tuple[Path, str]) -> None:
    static, _ = _run(tmp_path, "static", policy="static")
    scripted, _ = scripted_run
    png = tmp_path / "cmp.png"
    proc = _cli("inspect", "--compare", str(static), str(scripted), "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "static (static)" in proc.stdout and "scripted (scripted)" in proc.stdout
    assert "seconds per iteration" in proc.stdout and "rollout bubble GPU-s" in proc.stdout
    assert png.read_bytes()[:8] == PNG_MAGIC
    doc = json.loads(_cli("inspect", "--compare", str(static), str(scripted), "--json").stdout)
    assert len(doc["a"]["seconds_per_iteration"]) == len(doc["b"]["seconds_per_iteration"]) == 3
    assert doc["a"]["facts"]["epochs"] == 1 and doc["b"]["facts"]["epochs"] == 3
    # static never moves a rank: no idle label, no reshard; scripted has an inference-less epoch
    assert doc["a"]["switch"]["bytes_moved"] == 0 and doc["b"]["switch"]["bytes_moved"] > 0
    assert _cli("inspect", "--compare", str(static)).returncode == 2


def test_tensorboard_event_files_hold_the_scalars(scripted_run: tuple[Path, str]) -> None:
    pytest.importorskip("tensorboardX")
    from tensorboardX.proto import event_pb2

    run_dir, _ = scripted_run
    files = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    data, tags, pos = files[0].read_bytes(), {}, 0
    while pos < len(data):  # TFRecord: length, crc, payload, crc
        (n,) = struct.unpack("<Q", data[pos:pos + 8])
        event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
        pos += 12 + n + 4
        for v in event.summary.value:
            tags.setdefault(v.tag, []).append((event.step, v.simple_value))
    assert [s for s, _ in tags["train/reward_mean"]] == [0, 1, 2]
    assert [v for _, v in tags["placement/actor_ranks"]] == [2, 4, 2]
    assert "switch/latency_s" in tags


def test_inspect_failed_run_names_what_is_missing(tmp_path: Path) -> None:
    """A rank killed mid-run: the launcher stops the others; inspection shows what there is."""
    run_dir = tmp_path / "killed"
    cfg = emulated_config(run_dir, iterations=20)
    cfg["emulated"]["rollout_s_per_token"] = 4.0e-5
    run = subprocess.Popen([*CLI, "run", str(write_config(tmp_path / "k.yaml", cfg))],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.jsonl").exists():
        assert time.monotonic() < deadline and run.poll() is None, "no iteration finished"
        time.sleep(0.05)
    os.kill(json.loads(RunPaths(run_dir).heartbeat(3).read_text())["pid"], signal.SIGKILL)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 1
    assert "run failed" in err and f"slurm-rl inspect {run_dir}" in out and "rank logs" in out
    proc = _cli("inspect", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "missing / incomplete" in proc.stdout and "of 20 iterations released and done" in proc.stdout
    report = run_report_json(run_dir)
    assert 1 <= report["facts"]["iterations_done"] < 20


def test_inspect_half_written_run_dir(tmp_path: Path, scripted_run: tuple[Path, str]) -> None:
    # prepared, never started: no epochs
    cfg = write_config(tmp_path / "p.yaml", emulated_config(tmp_path / "prepared"))
    prepared = Path(_cli("prepare", str(cfg)).stdout.strip())
    proc = _cli("inspect", str(prepared))
    assert proc.returncode == 0, proc.stderr
    assert "no epoch published" in proc.stdout and "nothing to draw" in proc.stdout
    # a copy of a finished run with files cut: a torn metrics line, an activity line cut short,
    # one ack and the coordinator status gone
    src, _ = scripted_run
    cut = tmp_path / "cut"
    shutil.copytree(src, cut, ignore=shutil.ignore_patterns("tensorboard", "*.png"))
    with open(cut / "metrics.jsonl", "a") as f:
        f.write('{"iteration": 3, "rew')
    with open(activity_file(RunPaths(cut), 2), "a") as f:
        f.write('{"kind": "rollout", "sta')
    RunPaths(cut).ack(1, 5).unlink()
    (cut / "control" / "coordinator.json").unlink()
    proc = _cli("inspect", str(cut))
    assert proc.returncode == 0, proc.stderr
    assert "epoch 1 by ranks 5" in proc.stdout and "no coordinator status" in proc.stdout
    doc = json.loads(_cli("inspect", str(cut), "--json").stdout)
    assert len(doc["metrics"]) == 3  # the torn line is skipped
    assert _cli("inspect", str(tmp_path / "nothing")).returncode == 2


def test_sparkline() -> None:
    assert sparkline([0, 1, 2, 3]) == "▁▃▆█"  # (x - min) / (max - min) * 8 cells, the top one capped
    assert len(sparkline(list(range(300)), width=32)) == 32
    assert sparkline([]) == ""


@pytest.mark.slow
@pytest.mark.serial(seconds=5, slots=2)  # it may be the one that runs the 64 ranks: beside no other
def test_gantt_of_64_ranks_collapses_identical_rows(run_64: Path) -> None:
    tl = build_timeline(run_64)
    assert len({b.rank for b in tl.bars}) == 64
    rows = text_gantt(tl)
    assert len(rows) < 64 // 2  # ranks with identical rows share one line
    assert write_run_gantt(tl).read_bytes()[:8] == PNG_MAGIC


def test_job_log_follower_prints_the_iterations_and_ends(scripted_run: tuple[Path, str]) -> None:
    """``python -m slurm_rl.inspect.live RUN_DIR``: what sbatch/train.sh runs beside the ranks."""
    run_dir, _ = scripted_run
    proc = subprocess.run([sys.executable, "-m", "slurm_rl.inspect.live", str(run_dir), "--interval", "0.2",
                           "--timeout", "60"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "iteration 1/3 · reward" in proc.stdout and "iteration 3/3 · reward" in proc.stdout
    assert "run finished: 3/3 iterations" in proc.stdout


def test_staleness_summary_counts_samples_per_policy_version_gap() -> None:
    """Rows of an asynchronous run (as the simulator's pipeline models them): the samples per staleness,
    per iteration and over the run, and the text line naming each share."""
    from slurm_rl.inspect.summary import _staleness_lines, staleness_summary

    rows = [{"iteration": 0, "staleness/counts": {"0": 8}}, {"iteration": 1, "staleness/counts": {"0": 2, "1": 6}},
            {"iteration": 2, "staleness/counts": {"1": 4, "2": 4}}, {"iteration": 3}]
    st = staleness_summary(rows)
    assert st == {"per_iteration": {"0": {"0": 8}, "1": {"0": 2, "1": 6}, "2": {"1": 4, "2": 4}},
                  "total": {"0": 10, "1": 10, "2": 4}, "max": 2}
    assert _staleness_lines(st) == [
        "  staleness (iteration - policy version of the samples' rollout), samples over 3 iterations: "
        "0: 10 (42%), 1: 10 (42%), 2: 4 (17%); max 2 (per iteration: --json)"]
    assert staleness_summary([{"iteration": 0, "reward_mean": 1.0}]) is None and _staleness_lines(None) == []
