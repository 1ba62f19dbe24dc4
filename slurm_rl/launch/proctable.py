"""The process table as ``/proc`` shows it (Linux): what the launchers read to find the processes a run
left (a node task's descendants, a local run's process groups) without psutil, which emulated runs do
not install."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


def process_stats() -> Iterator[tuple[int, list[str]]]:
    """Each live process's pid and the fields of ``/proc/PID/stat`` after its name (``state``, ``ppid``,
    ``pgrp``, ...); a process that ends while being read is left out."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        yield int(entry), stat[stat.rindex(")") + 2:].split()
