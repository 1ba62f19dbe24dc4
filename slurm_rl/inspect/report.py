"""The whole post-hoc report of a run: epoch log, per-iteration metrics, run summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurm_rl.inspect.epoch_log import epoch_records, render_table

METRICS_FILE = "metrics.jsonl"


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Per-iteration metrics rows written by the actor leader (``RUN_DIR/metrics.jsonl``)."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
    return rows


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
    keys = [k for k in ("iteration", "reward_mean", "kl", "loss", "lr", "samples", "seconds", "tokens_per_s") if k in rows[0]]
    table = Table(title="metrics per iteration")
    for key in keys:
        table.add_column(key, justify="right")
    for row in rows:
        table.add_row(*(_fmt(row.get(k)) for k in keys))
    console.print(table)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
