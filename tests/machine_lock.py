"""The test session's machine lock, shared by its xdist workers (a JSON file of holders under a file lock).

An ordinary test shares the machine with other ordinary tests. A ``serial`` test (timing-sensitive: ratios
against a simulator, calibration, many ranks) never runs beside an ordinary one, and beside at most
``serial_at_once - 1`` other serial tests: each of them keeps about half a core busy (emulated ranks that
mostly sleep), so two of them leave the second core free. Two at a time, the live runs' ratios to the simulator (10 %
allowed) were 0.985-1.035 over two runs of every serial test (alone: 0.98-1.019), auto against static 0.83-0.86 of
the time, and the serial tests took 75-86 s instead of 126 s one at a time.

Who goes first: the ordinary tests. Serial tests come last in the session's order, but xdist hands each worker
a few tests ahead, so when the first serial test is picked the other workers still hold ordinary tests. A
serial test starts only once no ordinary test runs or waits and none has for ``quiet_s`` (the gap between two
tests of one worker); an ordinary test waits only while a serial one runs. So the ordinary tests drain first,
with the machine busy, and the serial tests then run in pairs. (When a waiting serial test held back new
ordinary tests instead, each worker's queued ordinary tests waited behind the serial tests in turn: they ran
one at a time, 93 s for 111 s of serial tests.) A serial test that has waited ``hold_back_after_s`` holds back
new ordinary tests, so it cannot starve. Among waiting serial tests the one of the highest ``priority`` (its
measured seconds: the longest first) goes first, then the one waiting longest. A serial test that itself keeps more
than a core busy (the 64-rank run) takes ``slots=serial_at_once``: it runs beside no other. A holder or waiter whose process
is gone (a crashed worker) is dropped.
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
QUIET_S = 1.0  # no ordinary test held or waited this long: the workers hold no more of them
HOLD_BACK_AFTER_S = 120.0  # a serial test waiting this long keeps new ordinary tests from starting


class MachineLockTimeout(TimeoutError):
    """A test waited longer than the lock's timeout for the machine."""


class MachineLock:
    """``hold(mode)`` takes the machine in ``mode`` (:data:`ORDINARY` or :data:`SERIAL`) for the ``with`` block."""

    def __init__(self, path: Path, timeout_s: float, serial_at_once: int = 2, quiet_s: float = QUIET_S,
                 hold_back_after_s: float = HOLD_BACK_AFTER_S) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self.serial_at_once = serial_at_once
        self.quiet_s = quiet_s
        self.hold_back_after_s = hold_back_after_s
        self._guard = filelock.FileLock(str(path) + ".lock", timeout=timeout_s)

    def _read(self) -> dict:
        try:
            state = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            state = {}
        holders = {int(p): m for p, m in state.get("holders", {}).items() if _alive(int(p))}
        waiting = {key: {int(p): float(t) for p, t in state.get(key, {}).items() if _alive(int(p))}
                   for key in ("waiting_serial", "waiting_ordinary", "priority", "slots")}
        return {"holders": holders, **waiting, "ordinary_at": float(state.get("ordinary_at", 0.0))}

    def _write(self, state: dict) -> None:
        tmp = self.path.with_suffix(".tmp")
        doc = {"holders": {str(p): m for p, m in state["holders"].items()}, "ordinary_at": state["ordinary_at"],
               **{key: {str(p): t for p, t in state[key].items()}
                  for key in ("waiting_serial", "waiting_ordinary", "priority", "slots")}}
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.path)

    def _try(self, mode: str, pid: int, now: float | None = None, priority: float = 0.0, slots: int = 1) -> bool:
        """Take the machine in ``mode`` for ``pid`` if the rules allow it now; else record ``pid`` as waiting
        (a serial test with its ``priority``; it takes ``slots`` of the ``serial_at_once``)."""
        now = time.time() if now is None else now
        with self._guard:
            state = self._read()
            modes = list(state["holders"].values())
            if mode == SERIAL:  # a serial test that has waited long enough stops giving way to ordinary ones
                since = state["waiting_serial"].get(pid, now)
                patient = now - since < self.hold_back_after_s
                gives_way = bool(state["waiting_ordinary"]) or now - state["ordinary_at"] < self.quiet_s
                first = (-priority, since, pid) <= min(
                    ((-state["priority"].get(p, 0.0), t, p) for p, t in state["waiting_serial"].items()),
                    default=(-priority, since, pid))
                taken = sum(int(state["slots"].get(p, 1)) for p, m in state["holders"].items() if m == SERIAL)
                granted = (ORDINARY not in modes and taken + min(slots, self.serial_at_once) <= self.serial_at_once
                           and not (patient and gives_way) and first)
            else:
                holding_back = any(now - since >= self.hold_back_after_s for since in state["waiting_serial"].values())
                granted = SERIAL not in modes and not holding_back
                state["ordinary_at"] = now
            waiting = state["waiting_serial" if mode == SERIAL else "waiting_ordinary"]
            if granted:  # a worker waits for one thing at a time
                state["holders"][pid] = mode
                for key in ("waiting_serial", "waiting_ordinary", "priority", "slots"):
                    state[key].pop(pid, None)
                if mode == SERIAL and slots != 1:
                    state["slots"][pid] = slots
            else:
                waiting.setdefault(pid, now)
                if mode == SERIAL:
                    state["priority"][pid] = priority
            self._write(state)
            return granted

    def _release(self, pid: int, now: float | None = None) -> None:
        with self._guard:
            state = self._read()
            state["slots"].pop(pid, None)
            if state["holders"].pop(pid, None) == ORDINARY:
                state["ordinary_at"] = time.time() if now is None else now
            self._write(state)

    @contextmanager
    def hold(self, mode: str, priority: float = 0.0, slots: int = 1) -> Iterator[None]:
        """Hold the machine in ``mode`` for the block; ``priority`` orders waiting serial tests (highest first),
        ``slots``: how many of the ``serial_at_once`` a serial test takes."""
        pid = os.getpid()
        deadline = time.monotonic() + self.timeout_s
        while not self._try(mode, pid, priority=priority, slots=slots):
            if time.monotonic() > deadline:
                raise MachineLockTimeout(f"waited {self.timeout_s:.0f}s for the machine ({mode}) at {self.path}")
            time.sleep(POLL_S)
        try:
            yield
        finally:
            self._release(pid)


def _alive(pid: int) -> bool:
    return psutil.pid_exists(pid)
