"""The whole post-hoc report of a run: epoch log, per-iteration metrics, run summary."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_rl.inspect.epoch_log import epoch_records, render_table
from slurm_rl.metrics import read_metrics

def report_json(run_dir: Path) -> dict[str, Any]:
    return {
        "run_dir": str(run_dir),
        "epochs": [r.to_json() for r in epoch_records(run_dir)],
        "metrics": read_metrics(run_dir),
    }


def print_report(run_dir: Path) -> None:
    """Epoch table, then the metrics table (reward curve) when the run recorded metrics."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 140))
    console.print(f"run dir: {run_dir}")
    render_table(epoch_records(run_dir), console)
    rows = read_metrics(run_dir)
    if not rows:
        return
    keys = [k for k in ("iteration", "reward_mean", "kl", "loss", "lr", "samples", "seconds", "train_s", "sync_s",
                        "tokens_per_s", "actor_dp", "mismatch/max_abs") if k in rows[0]]
    table = Table(title="metrics per iteration")
    for key in keys:
        table.add_column(key, justify="right")
    for row in rows:
        table.add_row(*(_fmt(row.get(k)) for k in keys))
    console.print(table)
    console.print(reward_curve_text(rows))
    png = plot_reward_curve(rows, run_dir / "reward_curve.png")
    if png is not None:
        console.print(f"reward curve plotted to {png}")


VAL_KEYS = ("val/reward_mean", "val/pass@1", "val/mean@n")  # on the rows of the iterations that evaluated
VAL_NAMES = {"val/reward_mean": "val reward", "val/pass@1": "pass@1", "val/mean@n": "mean@n"}
SMOOTHING = 10  # iterations in the moving average of the reward curve


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def reward_points(rows: list[dict[str, Any]], key: str = "reward_mean") -> list[tuple[int, float]]:
    """``(iteration, value)`` of the rows that have ``key``, by iteration."""
    return sorted((int(r["iteration"]), float(r[key])) for r in rows
                  if _number(r.get(key)) is not None and _number(r.get("iteration")) is not None)


def val_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with a validation figure (``val/...``), by iteration."""
    return sorted((r for r in rows if _number(r.get("iteration")) is not None
                   and any(_number(r.get(k)) is not None for k in VAL_KEYS)), key=lambda r: int(r["iteration"]))


def _val_text(row: dict[str, Any] | None, with_iteration: bool) -> str:
    if row is None:
        return ""
    parts = [f"{VAL_NAMES[k]} {float(row[k]):.3f}" for k in VAL_KEYS if _number(row.get(k)) is not None]
    return "  " + " · ".join(parts) + (f" (it {int(row['iteration'])})" if with_iteration else "")


def reward_curve_text(rows: list[dict[str, Any]], width: int = 50, max_lines: int = 50) -> str:
    """The reward curve, terminal friendly: one bar per iteration, with the validation figures of
    the iterations that evaluated. A long run is cut into buckets of consecutive iterations (their
    mean reward; the last evaluation in each) so that it has at most ``max_lines`` lines below its heading."""
    points = reward_points(rows)
    vals = val_rows(rows)
    room = max(1, max_lines)
    if len(points) <= room:
        lines = ["reward curve (mean reward per iteration" + ("; validation where evaluated" if vals else "") + "):"]
        by_it = {int(r["iteration"]): r for r in vals}
        for k, reward in points:
            bar = "#" * int(round(max(0.0, min(1.0, reward)) * width))
            val = _val_text(by_it.pop(k, None), False)
            lines.append(f"  {k:>4} {reward:6.3f} |{bar:<{width}}|{val}" if vals else f"  {k:>4} {reward:6.3f} |{bar}")
        rest = sorted(by_it.values(), key=lambda r: int(r["iteration"]))
        if rest:  # evaluations of iterations without a reward (e.g. a final evaluation)
            lines.append("  validation:" + "; ".join(_val_text(r, True) for r in rest))
        return "\n".join(lines)
    size = math.ceil(len(points) / room)
    buckets = [points[i:i + size] for i in range(0, len(points), size)]
    lines = [f"reward curve ({len(points)} iterations {points[0][0]}-{points[-1][0]}; "
             f"mean reward of each {size} iterations" + ("; the last validation in each" if vals else "") + "):"]
    label = max(len(f"{b[0][0]}-{b[-1][0]}") for b in buckets)
    v = 0
    for n, bucket in enumerate(buckets):
        last_it = buckets[n + 1][0][0] - 1 if n + 1 < len(buckets) else bucket[-1][0]
        mean = sum(r for _, r in bucket) / len(bucket)
        shown = None
        while v < len(vals) and int(vals[v]["iteration"]) <= last_it:
            shown = vals[v]
            v += 1
        bar = "#" * int(round(max(0.0, min(1.0, mean)) * width))
        val = _val_text(shown, True)
        span = f"{bucket[0][0]}-{bucket[-1][0]}"
        lines.append(f"  {span:>{label}} {mean:6.3f} |{bar:<{width}}|{val}" if vals
                     else f"  {span:>{label}} {mean:6.3f} |{bar}")
    if v < len(vals):
        lines.append("  validation after:" + "; ".join(_val_text(r, True) for r in vals[v:]))
    return "\n".join(lines)


def moving_average(values: list[float], window: int = SMOOTHING) -> list[float]:
    """Centred moving average of ``values`` over ``window`` points (fewer at the ends)."""
    half_lo, half_hi = window // 2, window - window // 2
    sums = [0.0]
    for x in values:
        sums.append(sums[-1] + x)
    out = []
    for i in range(len(values)):
        a, b = max(0, i - half_lo), min(len(values), i + half_hi)
        out.append((sums[b] - sums[a]) / (b - a))
    return out


@dataclass
class RewardCurveDrawing:
    """What :func:`draw_reward_curve` drew: its file and, per series, the number of points."""

    path: Path
    series: dict[str, int]


def plot_reward_curve(rows: list[dict[str, Any]], path: Path, title: str | None = None) -> Path | None:
    """Save the reward curve as a PNG (matplotlib, if installed); returns the path or None."""
    drawn = draw_reward_curve(rows, path, title)
    return drawn.path if drawn is not None else None


def draw_reward_curve(rows: list[dict[str, Any]], path: Path, title: str | None = None) -> RewardCurveDrawing | None:
    """The reward per iteration as light points, its moving average (:data:`SMOOTHING` iterations)
    on top, and the validation figures (``val/reward_mean``, ``val/pass@1``) as markers where the
    run evaluated. None without matplotlib or without a reward."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    points = reward_points(rows)
    if not points:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    series: dict[str, int] = {}
    fig, ax = plt.subplots(figsize=(7, 3.8) if len(points) > 40 else (6, 3.5))
    many = len(points) > 40
    ax.plot(xs, ys, marker="o", markersize=2.5 if many else 3, linewidth=0.6 if many else 1.0, alpha=0.35,
            color="#1f77b4", label="mean reward per iteration")
    series["reward_mean"] = len(points)
    if len(points) > SMOOTHING:
        ax.plot(xs, moving_average(ys), color="#1f77b4", linewidth=2.0,
                label=f"moving average ({SMOOTHING} iterations)")
        series["moving_average"] = len(points)
    lo, hi = min(ys), max(ys)
    for key, marker, colour in (("val/reward_mean", "D", "#d62728"), ("val/pass@1", "s", "#9467bd")):
        vals = reward_points(rows, key)
        if not vals:
            continue
        ax.plot([p[0] for p in vals], [p[1] for p in vals], marker=marker, markersize=5, linestyle="--",
                linewidth=0.8, color=colour, label=f"{key} (validation)", zorder=4)
        series[key] = len(vals)
        lo, hi = min(lo, *(p[1] for p in vals)), max(hi, *(p[1] for p in vals))
    ax.set_xlabel("iteration")
    ax.set_ylabel("reward")
    ax.set_ylim(min(0.0, lo - 0.05), max(1.05, hi + 0.05))
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return RewardCurveDrawing(Path(path), series)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
