"""Append-only JSONL decision log (``control/events/decisions.jsonl``) for post-hoc inspection.

Only the coordinator appends. Each record is one ``write`` on an ``O_APPEND`` descriptor; a
record cut short by a crash (no trailing newline) is skipped by :func:`read_events`.
"""

from __future__ import annotations

import time
from typing import Any

from slurm_rl.fsio import append_bytes, encode_json, read_jsonl
from slurm_rl.control.paths import RunPaths


def append_event(paths: RunPaths, kind: str, doc: dict[str, Any]) -> None:
    """Append one record ``{"kind", "time", **doc}`` to the decision log."""
    data = encode_json({**doc, "kind": kind, "time": doc.get("time", time.time())})
    paths.events_dir.mkdir(parents=True, exist_ok=True)
    append_bytes(paths.decisions, data, fs=paths.fs)


def read_events(paths: RunPaths, kind: str | None = None) -> list[dict[str, Any]]:
    """All complete records (optionally only those of ``kind``), oldest first."""
    return [r for r in read_jsonl(paths.decisions, fs=paths.fs) if kind is None or r.get("kind") == kind]
