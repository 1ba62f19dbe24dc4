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


def reward_faults_dir(run_dir: Path, iteration: int) -> Path:
    """Where the rollout ranks count the rewards of ``iteration`` that raised or timed out."""
    return Path(run_dir) / "rewards" / f"iter-{iteration:06d}"


def record_reward_faults(run_dir: Path, iteration: int, rank: int, errors: int, timeouts: int) -> None:
    """This rank's counts so far of rewards scored 0 under ``reward.on_error: zero`` (rewritten whole)."""
    from slurm_rl.fsio import atomic_write_json

    path = reward_faults_dir(run_dir, iteration) / f"rank-{rank:04d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"errors": errors, "timeouts": timeouts})


def reward_faults(run_dir: Path, iteration: int) -> dict[str, int]:
    """``reward_errors`` and ``reward_timeouts`` of ``iteration`` summed over the rollout ranks."""
    out = {"reward_errors": 0, "reward_timeouts": 0}
    for path in sorted(reward_faults_dir(run_dir, iteration).glob("rank-*.json")):
        doc = json.loads(path.read_text())
        out["reward_errors"] += int(doc.get("errors", 0))
        out["reward_timeouts"] += int(doc.get("timeouts", 0))
    return out
