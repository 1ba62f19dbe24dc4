"""``slurm-rl inspect`` of a long run (300 iterations): the timeline PNG is an overview of every
iteration over the last ones in detail, ``--iterations A:B`` picks a window, the reward curve (text
and PNG) stays readable and shows the validation figures.

An emulated run of 300 iterations takes minutes, so the run dir is written here with the control
plane's own writers (epochs, acks, reshard records, the decision log, activity spans, coordinator
status, progress, metrics) in the layout a real run leaves: 4 ranks (actor 0, rollout 1-2,
inference 3); every 10th iteration the actor grows onto rank 1 mid-iteration and the next
iteration starts from the initial placement again; every 50th iteration evaluates."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from emulated_configs import emulated_config, write_config
from slurm_rl.cli import main
from slurm_rl.control.acks import write_ack, write_reshard
from slurm_rl.control.activity import append_span
from slurm_rl.control.atomic import atomic_write_json
from slurm_rl.control.epochs import Epoch, EpochStore
from slurm_rl.control.events import append_event
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.progress import RankProgress
from slurm_rl.control.status import write_coordinator_status
from slurm_rl.inspect.report import reward_curve_text
from slurm_rl.inspect.run_gantt import draw_run_gantt
from slurm_rl.inspect.run_timeline import build_timeline, clip_timeline
from slurm_rl.metrics import read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ITERATIONS = 300
T0 = 1_700_000_000.0
START = {"actor": [0], "rollout": [1, 2], "inference": [3]}
GROWN = {"actor": [0, 1], "rollout": [2], "inference": [3]}
VAL_EVERY = 50


def _placement(ranks: dict[str, list[int]]) -> dict[str, dict]:
    return {c: {"ranks": r, "dp": len(r), "tp": 1, "pp": 1} for c, r in ranks.items()}


def _publish(paths: RunPaths, n: int, at: float, iteration: int, boundary: str, ranks: dict[str, list[int]],
             reason: str) -> None:
    EpochStore(paths).publish(Epoch(epoch=n, generation=0, created_at=at, reason=reason, iteration=iteration,
                                    boundary=boundary, placement=_placement(ranks),
                                    previous=n - 1 if n else None), 0)
    append_event(paths, "decision", {"epoch": n, "published_at": at, "time": at})
    for rank in range(4):
        roles = [c for c, r in ranks.items() if rank in r]
        write_ack(paths, n, rank, "node0", at + 0.005, at + 0.01, {"roles": roles})


def _seconds(k: int) -> float:
    return 0.4 + 0.05 * ((k * 7) % 5)


def _reward(k: int) -> float:
    return round(1 / (1 + math.exp(-(k - 100) / 30)) + 0.05 * ((k * 13) % 7 - 3) / 3, 4)


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 300-iteration run dir (see the module docstring)."""
    run_dir = tmp_path_factory.mktemp("long") / "long"
    run_dir.mkdir()
    cfg = emulated_config(run_dir, gpus_per_node=4, iterations=ITERATIONS)
    cfg["scheduler"] = {"policy": "auto"}
    cfg["cluster"]["auto_scheduler"] = True
    write_config(run_dir / "config.yaml", cfg)
    paths = RunPaths(run_dir).ensure()
    _publish(paths, 0, T0, 0, "iteration", START, "initial placement")
    epoch, t, rows = 1, T0 + 1.0, []
    for k in range(ITERATIONS):
        d = _seconds(k)
        append_event(paths, "release", {"iteration": k, "released_at": t, "time": t})
        append_span(paths, 1, "rollout", t, t + 0.5 * d, iteration=k)
        append_span(paths, 2, "rollout", t, t + 0.55 * d, iteration=k)
        append_span(paths, 3, "inference", t + 0.2 * d, t + 0.6 * d, iteration=k)
        append_span(paths, 0, "actor", t + 0.6 * d, t + 0.95 * d, iteration=k)
        if k % 10 == 5:  # the actor grows onto rank 1 once it has finished decoding, and back next iteration
            _publish(paths, epoch, t + 0.55 * d, k, "minibatch", GROWN, "actor grows to 2 ranks (DP 2)")
            write_reshard(paths, epoch, 1, "node0", {"started_at": t + 0.56 * d, "done_at": t + 0.58 * d,
                                                     "seconds": 0.02 * d, "old": [0], "new": [0, 1],
                                                     "bytes_moved": 1_000_000, "iteration": k})
            append_span(paths, 1, "reshard", t + 0.56 * d, t + 0.58 * d, iteration=k)
            append_span(paths, 1, "actor", t + 0.6 * d, t + 0.95 * d, iteration=k)
            _publish(paths, epoch + 1, t + d - 0.02, k + 1, "iteration", START,
                     f"return to the initial placement for iteration {k + 1}")
            epoch += 2
        row = {"iteration": k, "reward_mean": _reward(k), "seconds": d, "actor_dp": 2 if k % 10 == 5 else 1}
        if k % VAL_EVERY == 0 or k == ITERATIONS - 1:
            row.update({"val/reward_mean": _reward(k) + 0.02, "val/pass@1": _reward(k) * 0.9,
                        "val/mean@n": _reward(k)})
        rows.append(row)
        t += d
    append_event(paths, "release", {"iteration": ITERATIONS, "released_at": t, "time": t})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for rank in range(4):
        atomic_write_json(paths.progress(rank), RankProgress(rank=rank, time=t + 0.05, state="finished").to_json())
    write_coordinator_status(paths, {"generation": 0, "state": "finished", "time": t + 0.1,
                                     "released_iteration": ITERATIONS})
    return run_dir


def _inspect(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["inspect", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list:
    """What ``slurm-rl inspect`` drew: the return values of the PNG functions, in order."""
    from slurm_rl.inspect import report, run_gantt

    out: list = []
    for module, name in ((run_gantt, "draw_run_gantt"), (report, "draw_reward_curve")):
        def spy(*args, _real=getattr(module, name), **kwargs):
            out.append(_real(*args, **kwargs))
            return out[-1]
        monkeypatch.setattr(module, name, spy)
    return out


def _curve(out: str) -> list[str]:
    """The text reward curve of ``inspect``'s output: its heading and lines."""
    return out[out.index("reward curve ("):].split("\n\n")[0].splitlines()


def test_inspect_of_a_long_run(long_run: Path, capsys: pytest.CaptureFixture[str], drawn: list) -> None:
    code, out, err = _inspect(capsys, str(long_run))
    assert code == 0, err
    assert "iterations 300/300" in out and "val/reward_mean" in out  # the summary's metric lines
    assert len(_curve(out)) <= 51
    timeline, curve = drawn
    # timeline.png: every iteration in an overview strip, the last 20 in detail below
    assert timeline.path == long_run / "timeline.png" and timeline.path.read_bytes()[:8] == PNG_MAGIC
    assert timeline.layout == "overview+detail" and timeline.iterations == ITERATIONS
    assert timeline.axes == ["roles per iteration", "seconds per iteration", "gantt"]
    assert timeline.detail == (ITERATIONS - 20, ITERATIONS)
    # reward_curve.png: light points, the moving average, the validation markers
    assert curve.path == long_run / "reward_curve.png" and curve.path.read_bytes()[:8] == PNG_MAGIC
    evals = ITERATIONS // VAL_EVERY + 1
    assert curve.series == {"reward_mean": ITERATIONS, "moving_average": ITERATIONS, "val/reward_mean": evals,
                            "val/pass@1": evals}


def test_a_short_timeline_keeps_one_gantt_chart(long_run: Path) -> None:
    tl = build_timeline(long_run)
    assert tl.missing == [] and tl.state == "finished"
    short = draw_run_gantt(clip_timeline(tl, 10, 30), long_run / "check-short.png")
    assert short.layout == "single" and short.axes == ["gantt"] and short.iterations == 20 and short.detail is None
    assert short.path.read_bytes()[:8] == PNG_MAGIC


def test_reward_curve_text_is_bounded_and_shows_validation(long_run: Path) -> None:
    rows = read_metrics(long_run)
    lines = reward_curve_text(rows).splitlines()
    assert len(lines) <= 51  # a heading and at most 50 buckets
    spans = [tuple(map(int, ln.split()[0].split("-"))) for ln in lines[1:]]  # each line: the iterations it covers
    assert spans[0][0] == 0 and spans[-1][1] == ITERATIONS - 1
    assert all(b[0] == a[1] + 1 for a, b in zip(spans, spans[1:]))
    vals = [ln for ln in lines if "val reward" in ln]
    assert len(vals) == ITERATIONS // VAL_EVERY + 1 and all("pass@1" in ln and "mean@n" in ln for ln in vals)
    assert "(it 150)" in "".join(vals)
    short = reward_curve_text(rows[:12]).splitlines()  # a short run: one line per iteration
    assert len(short) == 13 and short[1].split()[0] == "0" and "val reward" in short[1]
    assert "val reward" not in reward_curve_text([{"iteration": 0, "reward_mean": 0.5}])


def test_iterations_window_covers_only_those_iterations(long_run: Path, capsys: pytest.CaptureFixture[str],
                                                        drawn: list) -> None:
    code, out, err = _inspect(capsys, str(long_run), "--json", "--iterations", "100:130")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["window"]["iterations"] == [100, 130] and doc["window"]["iterations_done"] == 30
    assert [r["iteration"] for r in doc["metrics"]] == list(range(100, 130))
    assert doc["epochs"] and all(100 <= e["iteration"] < 130 for e in doc["epochs"])
    assert doc["facts"]["iterations_done"] == ITERATIONS  # the facts stay the whole run's
    assert [k for k, _ in doc["timeline"]["gates"]] == list(range(100, 131))  # 130 closes the window
    lo, hi = doc["timeline"]["t0"], doc["timeline"]["end"]
    assert all(lo <= b["start"] <= b["end"] <= hi for b in doc["timeline"]["bars"])
    held = sum(c["held_s"] for c in doc["components"].values())
    assert held == pytest.approx(4 * sum(_seconds(k) for k in range(100, 130)), rel=1e-6)

    code, out, err = _inspect(capsys, str(long_run), "--iterations", "100:130")
    assert code == 0, err
    assert "--iterations 100:130: only iterations 100-129" in out
    table = out[out.index("placement epochs ("):out.index("metric ")]
    iters = [int(ln.split()[1]) for ln in table.splitlines()[2:] if ln.split() and ln.split()[0].isdigit()]
    assert iters and all(100 <= k < 130 for k in iters)
    curve = _curve(out)[1:]
    assert [int(ln.split()[0]) for ln in curve] == list(range(100, 130))  # one line per iteration
    assert "val reward" in curve[0] and not any("val reward" in ln for ln in curve[1:])  # 100 evaluated
    timeline, reward = drawn
    assert timeline.path == long_run / "timeline-iterations-100-129.png" and timeline.iterations == 30
    assert timeline.layout == "single" and timeline.path.read_bytes()[:8] == PNG_MAGIC
    assert reward.path == long_run / "reward_curve-iterations-100-129.png" and reward.series["reward_mean"] == 30

    code, out, err = _inspect(capsys, str(long_run), "--json", "--iterations=-10:")  # the last 10
    assert code == 0, err
    assert [r["iteration"] for r in json.loads(out)["metrics"]] == list(range(290, 300))


@pytest.mark.parametrize("window", ["250:400", "300:", "5:5", "20:10", "x", "1:2:3"])
def test_iterations_outside_the_run_are_refused(long_run: Path, capsys: pytest.CaptureFixture[str],
                                                window: str) -> None:
    code, out, err = _inspect(capsys, str(long_run), "--iterations", window)
    assert code == 2 and out == ""
    assert "--iterations" in err and repr(window) in err and "0-299" in err
