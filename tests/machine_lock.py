"""The test session's machine lock, shared by its xdist workers (a JSON file of holders under a file lock).

An ordinary test shares the machine with other ordinary tests. A ``serial`` test (timing-sensitive: ratios
against a simulator, calibration, many ranks) never runs beside an ordinary one, and beside at most
``serial_at_once - 1`` other serial tests: each of them keeps about half a core busy (emulated ranks that
mostly sleep), so two of them leave the second core free. Two at a time, the live runs' ratios to the simulator (10 %
allowed) were 0.985-1.035 over two runs of every serial test (alone: 0.98-1.019), auto against static 0.83-0.86 of
the time, and the serial tests took 75-86 s instead of 126 s one at a time. A waiting serial test keeps new
ordinary tests from starting. A holder whose process is gone (a crashed worker) is dropped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock
import psutil

ORDINARY, SERIAL = "ordinary", "serial"
POLL_S = 0.05


class MachineLockTimeout(TimeoutError):
    """A test waited longer than the lock's timeout for the machine."""


class MachineLock:
    """``hold(mode)`` takes the machine in ``mode`` (:data:`ORDINARY` or :data:`SERIAL`) for the ``with`` block."""

    def __init__(self, path: Path, timeout_s: float, serial_at_once: int = 2) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self.serial_at_once = serial_at_once
        self._guard = filelock.FileLock(str(path) + ".lock", timeout=timeout_s)

    def _read(self) -> dict:
        try:
            state = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            state = {}
        holders = {int(p): m for p, m in state.get("holders", {}).items() if _alive(int(p))}
        waiting = [p for p in state.get("waiting_serial", []) if _alive(p)]
        return {"holders": holders, "waiting_serial": waiting}

    def _write(self, state: dict) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"holders": {str(p): m for p, m in state["holders"].items()},
                                   "waiting_serial": state["waiting_serial"]}))
        os.replace(tmp, self.path)

    def _try(self, mode: str, pid: int) -> bool:
        with self._guard:
            state = self._read()
            modes = list(state["holders"].values())
            if mode == SERIAL:
                granted = ORDINARY not in modes and modes.count(SERIAL) < self.serial_at_once
                if pid in state["waiting_serial"]:
                    state["waiting_serial"].remove(pid)
                if not granted:
                    state["waiting_serial"].append(pid)
            else:
                granted = SERIAL not in modes and not state["waiting_serial"]
            if granted:
                state["holders"][pid] = mode
            self._write(state)
            return granted

    def _release(self, pid: int) -> None:
        with self._guard:
            state = self._read()
            state["holders"].pop(pid, None)
            self._write(state)

    @contextmanager
    def hold(self, mode: str) -> Iterator[None]:
        pid = os.getpid()
        deadline = time.monotonic() + self.timeout_s
        while not self._try(mode, pid):
            if time.monotonic() > deadline:
                raise MachineLockTimeout(f"waited {self.timeout_s:.0f}s for the machine ({mode}) at {self.path}")
            time.sleep(POLL_S)
        try:
            yield
        finally:
            self._release(pid)


def _alive(pid: int) -> bool:
    return psutil.pid_exists(pid)
