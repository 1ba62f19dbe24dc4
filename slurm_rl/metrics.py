"""Per-iteration metrics of a run: ``RUN_DIR/metrics.jsonl``, one JSON object per line.

The actor leader appends one row per iteration (a single ``write`` on an ``O_APPEND`` descriptor);
inspection reads them back, skipping a last line cut short by a crash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurm_rl.fsio import append_bytes

METRICS_FILE = "metrics.jsonl"


def append_metrics(run_dir: Path, row: dict[str, Any]) -> None:
    """Append one metrics row to ``run_dir/metrics.jsonl`` (through :mod:`slurm_rl.fsio`)."""
    append_bytes(run_dir / METRICS_FILE, (json.dumps(row) + "\n").encode())


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete metrics row of the run, oldest first (empty before the first iteration ends)."""
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
