"""The suite's machine lock (tests/machine_lock.py): ordinary tests share the machine, serial ones run apart from
them and at most two at a time, a waiting serial test holds back new ordinary ones, a dead holder is dropped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from machine_lock import ORDINARY, SERIAL, MachineLock


def test_who_may_hold_the_machine_with_whom(tmp_path: Path) -> None:
    lock = MachineLock(tmp_path / "machine.json", timeout_s=5)
    a, b, c = os.getpid(), os.getppid(), 1  # live processes standing for three xdist workers
    assert lock._try(ORDINARY, a) and lock._try(ORDINARY, b)  # ordinary tests share
    assert not lock._try(SERIAL, c)  # a serial test waits for them...
    lock._release(a)
    assert not lock._try(ORDINARY, a)  # ...and holds back new ordinary ones while it waits
    lock._release(b)
    assert lock._try(SERIAL, c) and lock._try(SERIAL, a)  # two serial tests at once
    assert not lock._try(SERIAL, b) and not lock._try(ORDINARY, b)
    lock._release(a)
    lock._release(c)
    assert lock._try(SERIAL, b)
    lock._release(b)
    assert lock._try(ORDINARY, a)


def test_a_dead_holder_is_dropped(tmp_path: Path) -> None:
    lock = MachineLock(tmp_path / "machine.json", timeout_s=5)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert lock._try(ORDINARY, gone.pid)
    assert lock._try(SERIAL, os.getpid())  # the only holder's process is gone
    lock._release(os.getpid())
    with lock.hold(SERIAL):
        assert lock._read()["holders"] == {os.getpid(): SERIAL}
    assert lock._read()["holders"] == {}
