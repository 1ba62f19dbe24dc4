"""TensorBoard event files in ``RUN_DIR/tensorboard``: the scalars of ``metrics.jsonl`` per
iteration, plus placement (ranks per component per epoch) and switch figures per epoch.

Uses ``tensorboardX`` (the ``tensorboard`` extra: ``pip install 'slurm_rl[tensorboard]'``), which
writes the event format without TensorFlow or the TensorBoard server; without it nothing is
written and :func:`write_tensorboard` returns None. Viewing needs ``tensorboard`` itself:
``tensorboard --logdir RUN_DIR/tensorboard``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from slurm_rl.inspect.epoch_log import epoch_records
from slurm_rl.metrics import read_metrics
from slurm_rl.placement import COMPONENTS

TB_DIR = "tensorboard"
_SKIP = {"iteration", "time", "plan", "losses"}
#: Metric prefixes kept as their own TensorBoard sections (verl's names: ``actor/pg_clipfrac``, ``critic/vf_loss``);
#: every other metric goes under ``train/``
TOP_LEVEL = ("val/", "mismatch/", "actor/", "critic/")


def _import_tensorboardx() -> Any:
    """``tensorboardX``, imported without torch where torch is not loaded yet.

    tensorboardX imports torch when it is installed, only to accept tensors as values (1.6 s of
    CPU at the end of every run whose launcher had no torch); the scalars written here are floats.
    torch is hidden from that one import (``sys.modules['torch'] = None`` makes ``import torch``
    raise ImportError, which tensorboardX handles) and visible again afterwards.
    """
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        import tensorboardX

        return tensorboardX
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        import tensorboardX
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return tensorboardX


def tensorboard_available() -> bool:
    try:
        _import_tensorboardx()
    except ImportError:
        return False
    return True


def scalars(run_dir: Path) -> list[tuple[str, float, int, float | None]]:
    """``(tag, value, step, wall time)`` for every scalar the run recorded."""
    out: list[tuple[str, float, int, float | None]] = []
    for row in read_metrics(run_dir):
        k = row.get("iteration")
        if not isinstance(k, int):
            continue
        wall = row.get("time") if isinstance(row.get("time"), (int, float)) else None
        for key, value in row.items():
            if key in _SKIP or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            out.append((key if key.startswith(TOP_LEVEL) else f"train/{key}", float(value), k, wall))
    try:
        records = epoch_records(run_dir)
    except (OSError, ValueError):
        records = []
    for r in records:
        for component in COMPONENTS:
            out.append((f"placement/{component}_ranks", float(len(r.placement.get(component, []))), r.epoch,
                        r.published_at))
        out.append(("placement/iteration", float(r.iteration), r.epoch, r.published_at))
        if r.switch_latency_s is not None:
            out.append(("switch/latency_s", r.switch_latency_s, r.epoch, r.published_at))
        if r.reshard_s is not None:
            out.append(("switch/reshard_s", r.reshard_s, r.epoch, r.published_at))
        out.append(("switch/bytes_moved", float(r.bytes_moved), r.epoch, r.published_at))
    return out


def stale(run_dir: Path) -> bool:
    """The event files are missing or older than the metrics or the epoch log."""
    target = run_dir / TB_DIR
    try:
        written = min(p.stat().st_mtime for p in target.glob("events.out.tfevents.*"))
    except (OSError, ValueError):  # none written yet
        return True
    sources = [run_dir / "metrics.jsonl", run_dir / "control" / "epochs", run_dir / "control" / "coordinator.json"]
    return any(p.exists() and p.stat().st_mtime > written for p in sources)


def write_tensorboard(run_dir: str | Path) -> Path | None:
    """(Re)write the run's event files under ``RUN_DIR/tensorboard`` unless they are up to date;
    None without tensorboardX."""
    if not stale(Path(run_dir)):
        return Path(run_dir) / TB_DIR
    if not tensorboard_available():
        return None
    SummaryWriter = _import_tensorboardx().SummaryWriter

    root = Path(run_dir)
    target = root / TB_DIR
    if target.exists():
        shutil.rmtree(target)  # rewritten whole: no duplicate points from an earlier inspection
    writer: Any = SummaryWriter(logdir=str(target), flush_secs=3600)
    try:
        for tag, value, step, wall in scalars(root):
            writer.add_scalar(tag, value, global_step=step, walltime=wall)
    finally:
        writer.close()
    return target
