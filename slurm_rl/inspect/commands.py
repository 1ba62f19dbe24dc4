"""What ``slurm-rl inspect`` does for a run: the summary with its PNGs and TensorBoard files,
``--follow`` (the summary refreshed from the files while the run goes on), ``--compare``, and the
closing lines of ``slurm-rl run`` that say where everything is."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from slurm_rl.control.heartbeats import read_heartbeat
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import read_coordinator_status

FOLLOW_STALE_S = 120.0


def write_artifacts(run_dir: Path, timeline: Any = None, rows: list[dict[str, Any]] | None = None,
                    window: tuple[int, int] | None = None) -> list[str]:
    """Write ``timeline.png``, ``reward_curve.png`` and the TensorBoard files; one line per result.

    ``timeline`` / ``rows``: what to draw (default: read from the run dir); ``window``: the
    iterations ``[first, stop)`` they cover (``--iterations``): the PNGs are then
    ``timeline-iterations-FIRST-LAST.png`` and ``reward_curve-iterations-FIRST-LAST.png``, so the
    whole run's stay."""
    from slurm_rl.inspect.report import plot_reward_curve
    from slurm_rl.inspect.run_gantt import write_run_gantt
    from slurm_rl.inspect.run_timeline import build_timeline
    from slurm_rl.inspect.tensorboard import write_tensorboard
    from slurm_rl.metrics import read_metrics

    suffix = "" if window is None else f"-iterations-{window[0]}-{window[1] - 1}"
    title = None if window is None else f"reward of {run_dir.name}, iterations {window[0]}-{window[1] - 1}"
    lines = []
    try:
        tl = timeline if timeline is not None else build_timeline(run_dir)
        lines.append(f"placement timeline: {write_run_gantt(tl, run_dir / f'timeline{suffix}.png')}")
        curve = plot_reward_curve(rows if rows is not None else read_metrics(run_dir),
                                  run_dir / f"reward_curve{suffix}.png", title=title)
        if curve is not None:
            lines.append(f"reward curve: {curve}")
    except ImportError:
        lines.append("no PNGs: matplotlib is not installed (pip install matplotlib)")
    except OSError as exc:
        lines.append(f"no PNGs: {exc}")
    try:
        tb = write_tensorboard(run_dir)
        lines.append(f"tensorboard: tensorboard --logdir {tb}" if tb is not None
                     else "no TensorBoard files: pip install 'slurm_rl[tensorboard]' (tensorboardX)")
    except OSError as exc:
        lines.append(f"no TensorBoard files: {exc}")
    return lines


def inspect_run(run_dir: Path, as_json: bool = False, all_epochs: bool = False, artifacts: bool = True,
                iterations: str | None = None) -> int:
    """Print the one-screen summary (or ``--json``: the full data) and the reward curve; write the
    PNGs beside it. ``iterations`` (``--iterations A:B``): only those iterations; exit 2 when the
    run has no such iterations."""
    from slurm_rl.inspect.report import reward_curve_text
    from slurm_rl.inspect.summary import WindowError, _timeline_from_json, format_summary, run_report_json

    try:
        report = run_report_json(run_dir, iterations=iterations)
    except WindowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(report, indent=1))
        return 0
    print(format_summary(run_dir, all_epochs=all_epochs, report=report), flush=True)
    if any(r.get("reward_mean") is not None for r in report["metrics"]):
        print("")
        print(reward_curve_text(report["metrics"]))
    if artifacts:
        print("")
        window = tuple(report["window"]["iterations"]) if "window" in report else None
        for line in write_artifacts(run_dir, timeline=_timeline_from_json(report["timeline"]),
                                    rows=report["metrics"], window=window):
            print(line)
    return 0


def _alive(paths: RunPaths, world: int, stale_s: float) -> bool:
    """Some rank wrote a heartbeat in the last ``stale_s`` seconds (or none ever did: not started)."""
    times = []
    for rank in range(world):
        try:
            doc = read_heartbeat(paths, rank)
        except (OSError, ValueError):
            continue
        if doc is not None and isinstance(doc.get("time"), (int, float)):
            times.append(float(doc["time"]))
    return not times or time.time() - max(times) < stale_s


def follow(run_dir: Path, interval_s: float = 2.0, timeout_s: float = 24 * 3600.0,
           stale_s: float = FOLLOW_STALE_S, columns: int = 72) -> int:
    """Refresh the summary every ``interval_s`` until the coordinator says finished or failed
    (exit 0 / 1), no rank has written a heartbeat for ``stale_s`` (exit 1), or ``timeout_s`` (exit 1).
    On a terminal the screen is redrawn; otherwise each refresh is printed after a separator line."""
    from rich.console import Console

    from slurm_rl.inspect.summary import format_summary

    paths = RunPaths(run_dir)
    console = Console(highlight=False, soft_wrap=True)
    deadline = time.monotonic() + timeout_s
    try:
        from slurm_rl.config import load_config

        world = load_config(run_dir / "config.yaml").placement.world_size
    except Exception:  # a half-written run dir: follow what is there
        world = 0
    while True:
        status = read_coordinator_status(paths)
        text = format_summary(run_dir, columns=columns)
        if console.is_terminal:
            console.clear()
        else:
            console.print(f"──── {time.strftime('%H:%M:%S')} · following {run_dir} (every {interval_s:g}s) ────")
        console.print(text, markup=False)
        sys.stdout.flush()
        state = status.state if status is not None else None
        if state in ("finished", "failed"):
            console.print(f"the run {state}; stopped following. Full view: slurm-rl inspect {run_dir}", markup=False)
            return 0 if state == "finished" else 1
        if not _alive(paths, world, stale_s):
            console.print(f"no rank of {run_dir} wrote a heartbeat for {stale_s:.0f}s and the coordinator status "
                          f"is {state!r}: the run is not running; stopped following", markup=False)
            return 1
        if time.monotonic() > deadline:
            console.print(f"stopped following {run_dir} after {timeout_s:.0f}s: the run had not ended "
                          f"(coordinator state {state!r})", markup=False)
            return 1
        time.sleep(interval_s)


def compare_runs(run_a: Path, run_b: Path, as_json: bool = False, png: Path | None = None) -> int:
    """Print both runs side by side and write the comparison PNG."""
    from slurm_rl.inspect.compare import compare_json, format_compare, write_compare_png

    doc = compare_json(run_a, run_b)
    if as_json:
        print(json.dumps(doc, indent=1))
        return 0
    print(format_compare(doc))
    target = png if png is not None else run_b / f"compare-{run_a.name}.png"
    try:
        print(f"\ncomparison plot: {write_compare_png(doc, target)}")
    except ImportError:
        print("\nno comparison plot: matplotlib is not installed")
    return 0


def next_steps(run_dir: Path, ok: bool) -> str:
    """What to do after a run: where its files are and the commands that show them."""
    pngs = (f"{run_dir / 'timeline.png'}, {run_dir / 'reward_curve.png'}"
            if (run_dir / "timeline.png").exists() else "written by slurm-rl inspect into the run dir")
    lines = [f"run dir: {run_dir}",
             f"  summary:      slurm-rl inspect {run_dir}      (--all: every epoch, --json: everything)",
             f"  PNGs:         {pngs}",
             f"  TensorBoard:  tensorboard --logdir {run_dir / 'tensorboard'}   (pip install tensorboard to view)",
             f"  compare:      slurm-rl inspect --compare OTHER_RUN_DIR {run_dir}"]
    if not ok:
        lines.insert(1, f"  rank logs:    {run_dir / 'logs'}/rank-NNNN.log, coordinator.log")
    return "\n".join(lines)
