"""The whole post-hoc report of a run: epoch log, per-iteration metrics, run summary."""

from __future__ import annotations

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
                        "tokens_per_s", "actor_dp") if k in rows[0]]
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


def reward_curve_text(rows: list[dict[str, Any]], width: int = 50) -> str:
    """The reward curve as one bar per iteration (terminal friendly)."""
    lines = ["reward curve (mean reward per iteration):"]
    for row in rows:
        reward = row.get("reward_mean")
        if reward is None:
            continue
        bar = "#" * int(round(max(0.0, min(1.0, float(reward))) * width))
        lines.append(f"  {int(row['iteration']):>4} {float(reward):6.3f} |{bar}")
    return "\n".join(lines)


def plot_reward_curve(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Save the reward curve as a PNG (matplotlib, if installed); returns the path or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    points = [(r["iteration"], r["reward_mean"]) for r in rows if r.get("reward_mean") is not None]
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean reward")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
