"""The session's zygotes (a pytest plugin): local runs fork their helpers instead of importing anew.

The controller (or a run without xdist) starts ``python -m slurm_rl.launch.zygote DIR --device D``
for ``emulated`` and ``cpu`` before the workers start and exports ``SLURM_RL_ZYGOTE=DIR``, so every
local run of the session (launched in a worker or by a ``slurm-rl`` subprocess) gets its fork server,
coordinator and group scheduler forked from an interpreter that imported once (a ``cpu`` run: ~10 s of
CPU -> ~4.5 s), and tests start ``slurm-rl`` as ``python -m slurm_rl.launch.zygote exec slurm_rl.cli``
(tests/cli_command.py: forked from the ``cpu`` zygote, the process itself as far as the test can tell). Runs
inside Slurm jobs do not use them (:mod:`slurm_rl.launch.zygote`). ``SLURM_RL_TEST_ZYGOTE=0`` runs
the suite without them. Each test labels what the zygotes fork for it (``SLURM_RL_ZYGOTE_LABEL``, set
by the ledger), and its CPU counts in the test's; the ledger also reports what the zygotes and
everything they forked spent in all (``zygote_cpu_s``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_rl.launch.zygote import ENV, socket_path, usage_path

REPO = Path(__file__).resolve().parents[1]
DEVICES = ("emulated", "cpu")
START_TIMEOUT_S = 60.0  # until a zygote has made its socket (before its imports)
zygotes_key = pytest.StashKey[tuple[Path, list[subprocess.Popen]]]()
_usage_offsets = pytest.StashKey[dict[str, int]]()


@contextlib.contextmanager
def caller_ignoring(signals: tuple[int, ...]) -> Iterator[None]:
    """This process ignores ``signals`` meanwhile (as a shell's background job ignores SIGINT and SIGQUIT)."""
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def zygote_cpu_s(config: pytest.Config) -> float:
    """CPU seconds of the session's zygotes with every child they reaped (the per-run servers, with their ranks)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for proc in config.stash.get(zygotes_key, (None, []))[1]:
        try:
            stat = Path(f"/proc/{proc.pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += sum(int(f) for f in fields[11:15]) / tick
    return total


def zygote_children_cpu_s(config: pytest.Config, label: str) -> float:
    """CPU seconds of what the session's zygotes forked with ``SLURM_RL_ZYGOTE_LABEL=label`` and reaped
    since the last call in this process (their usage logs, read on from where the last call stopped)."""
    directory = os.environ.get(ENV)
    if not directory:
        return 0.0
    offsets = config.stash.setdefault(_usage_offsets, {})
    total = 0.0
    for device in DEVICES:
        path = usage_path(directory, device)
        try:
            with open(path, "rb") as f:
                f.seek(offsets.get(str(path), 0))
                data = f.read()
        except OSError:
            continue
        data = data[:data.rfind(b"\n") + 1]  # a line being written is read next time
        offsets[str(path)] = offsets.get(str(path), 0) + len(data)
        for line in data.splitlines():
            entry = json.loads(line)
            if entry.get("label") == label:
                total += float(entry["cpu_s"])
    return total


def start_zygotes(directory: Path, devices: list[str] | tuple[str, ...] = DEVICES) -> list[subprocess.Popen]:
    """One zygote per device serving ``directory``; returns once each has made its socket (callers
    queue on it while it imports)."""
    procs = []
    for device in devices:
        with open(directory / f"{device}.log", "wb") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "slurm_rl.launch.zygote", str(directory), "--device", device],
                                          cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True))
    deadline = time.monotonic() + START_TIMEOUT_S
    for device, proc in zip(devices, procs):
        while not socket_path(directory, device).exists():
            if time.monotonic() > deadline:
                stop_zygotes(procs)
                raise RuntimeError(f"the {device} zygote made no socket in {directory} within {START_TIMEOUT_S:.0f}s")
            if proc.poll() is not None:
                stop_zygotes(procs)
                raise RuntimeError(f"the {device} zygote exited with code {proc.returncode}: "
                                   f"{(directory / f'{device}.log').read_text()[-2000:]}")
            time.sleep(0.05)
    return procs


def stop_zygotes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each zygote (what it forked carries on), SIGKILL one that is still there after 10 s."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or os.environ.get("SLURM_RL_TEST_ZYGOTE", "1") == "0":
        return
    # the launchers give their fork servers OMP_NUM_THREADS=1 (unless set) and a zygote serves only
    # callers with its own: so the session's commands (slurm-rl through exec) run with it too
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    directory = Path(tempfile.mkdtemp(prefix="slurm-rl-zygotes-"))
    config.stash[zygotes_key] = directory, start_zygotes(directory)
    os.environ[ENV] = str(directory)


def pytest_unconfigure(config: pytest.Config) -> None:
    if zygotes_key in config.stash:
        directory, procs = config.stash[zygotes_key]
        stop_zygotes(procs)
        shutil.rmtree(directory, ignore_errors=True)
