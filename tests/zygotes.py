"""The session's zygotes (a pytest plugin): local runs fork their helpers instead of importing anew.

The controller (or a run without xdist) starts ``python -m slurm_rl.launch.zygote DIR --device D``
for ``emulated`` and ``cpu`` before the workers start and exports ``SLURM_RL_ZYGOTE=DIR``, so every
local run of the session (launched in a worker or by a ``slurm-rl`` subprocess) gets its fork server,
coordinator and group scheduler forked from an interpreter that imported once (a ``cpu`` run: ~10 s of
CPU -> ~4.5 s). Runs inside Slurm jobs do not use them (:mod:`slurm_rl.launch.zygote`).
``SLURM_RL_TEST_ZYGOTE=0`` runs the suite without them. The ledger reports what the zygotes and
everything they forked spent (``zygote_cpu_s``): a test's own CPU does not include it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from slurm_rl.launch.zygote import ENV, socket_path

REPO = Path(__file__).resolve().parents[1]
DEVICES = ("emulated", "cpu")
START_TIMEOUT_S = 60.0  # until a zygote has made its socket (before its imports)
zygotes_key = pytest.StashKey[tuple[Path, list[subprocess.Popen]]]()


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
    directory = Path(tempfile.mkdtemp(prefix="slurm-rl-zygotes-"))
    config.stash[zygotes_key] = directory, start_zygotes(directory)
    os.environ[ENV] = str(directory)


def pytest_unconfigure(config: pytest.Config) -> None:
    if zygotes_key in config.stash:
        directory, procs = config.stash[zygotes_key]
        stop_zygotes(procs)
        shutil.rmtree(directory, ignore_errors=True)
