"""Per-rank activity spans (``control/activity/rank-NNNN.jsonl``) and startup phases.

A rank appends one JSON line per span of work it did (``kind`` = rollout | inference | actor |
reshard | sync, ``start`` and ``end`` wall times, ``iteration``); inspection turns them into busy
time and bubbles per component. Each record is one ``write`` on an ``O_APPEND`` descriptor of the
rank's own file; a line cut short by a crash is skipped when read.

Before its first epoch a rank names what it is doing (``state: starting``, ``phase``) in its
progress file, so that a live view never shows minutes of silence while engines are built.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from slurm_rl.control.paths import RUN_DIR_MODE, RunPaths
from slurm_rl.control.progress import write_progress
from slurm_rl.fsio import read_jsonl

SPAN_KINDS = ("rollout", "inference", "actor", "critic", "reshard", "sync", "checkpoint", "offload")


def activity_dir(paths: RunPaths) -> Path:
    return paths.control / "activity"


def activity_file(paths: RunPaths, rank: int) -> Path:
    return activity_dir(paths) / f"rank-{rank:04d}.jsonl"


def append_span(paths: RunPaths, rank: int, kind: str, start: float, end: float, **extra: Any) -> None:
    """Append one span of work of ``rank`` (``kind`` one of :data:`SPAN_KINDS`)."""
    if kind not in SPAN_KINDS:
        raise ValueError(f"span kind: got {kind!r}; allowed: {', '.join(SPAN_KINDS)}")
    activity_dir(paths).mkdir(mode=RUN_DIR_MODE, parents=True, exist_ok=True)
    data = (json.dumps({"kind": kind, "start": start, "end": max(start, end), **extra}) + "\n").encode()
    fd = os.open(activity_file(paths, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_spans(paths: RunPaths, rank: int) -> list[dict[str, Any]]:
    """Every complete span of ``rank``, in the order written (empty when it recorded none)."""
    return [doc for doc in read_jsonl(activity_file(paths, rank), fs=paths.fs)
            if isinstance(doc.get("start"), (int, float)) and isinstance(doc.get("end"), (int, float))]


def announce_phase(paths: RunPaths, rank: int, host: str, phase: str) -> None:
    """Name the startup phase of ``rank`` in its progress file (before its first epoch)."""
    write_progress(paths, rank, {"state": "starting", "phase": phase, "host": host})
