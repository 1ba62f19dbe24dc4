"""The stop request: ``control/stop-request.json``, left by a signal handler or ``slurm-rl stop``.

The coordinator looks for it on every pass; at the next iteration gate it takes a checkpoint
(unless the request says not to) and stops the run with state ``stopped``. The first request
wins (exclusive create), so repeated signals change nothing.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Callable

from slurm_rl.control.atomic import read_json, write_json_exclusive
from slurm_rl.control.errors import TornFileError

STOP_FILE = "stop-request.json"
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)


def stop_path(run_dir: Path) -> Path:
    return Path(run_dir) / "control" / STOP_FILE


def request_stop(run_dir: Path, reason: str, checkpoint: bool = True, at_iteration: int | None = None) -> bool:
    """Ask the coordinator to stop at the next gate (``at_iteration``: at the gate of that
    iteration or a later one); False when a request was already there."""
    doc = {"reason": reason, "checkpoint": checkpoint, "at_iteration": at_iteration, "requested_at": time.time(),
           "host": socket.gethostname(), "pid": os.getpid()}
    try:
        write_json_exclusive(stop_path(run_dir), doc)
    except FileExistsError:
        return False
    return True


def read_stop(run_dir: Path) -> dict[str, Any] | None:
    """The stop request, or None. A torn request still counts (a writer was killed mid-way:
    stopping with a checkpoint is the safe reading)."""
    try:
        return read_json(stop_path(run_dir))
    except FileNotFoundError:
        return None
    except TornFileError as exc:
        return {"reason": f"unreadable stop request ({exc})", "checkpoint": True}


def clear_stop(run_dir: Path) -> None:
    try:
        os.unlink(stop_path(run_dir))
    except FileNotFoundError:
        pass


def install_stop_handlers(run_dir: Path, who: str, log: Callable[[str], None],
                          signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
    """Make USR1/USR2/SIGTERM request a checkpoint and stop instead of killing the process.

    Slurm sends USR1 (``--signal=B:USR1@T`` forwarded by ``sbatch/train.sh``) or USR2
    (submitit) ahead of a time limit or preemption, and SIGTERM at preemption before SIGKILL
    (``GraceTime``); in each case the run stops at the next gate with a checkpoint.
    """

    def handler(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        first = request_stop(run_dir, f"{name} received by {who}")
        log(f"{who}: {name} received; " + ("stop requested: the run checkpoints and stops at the next gate"
                                           if first else "a stop was already requested"))

    for sig in signals:
        signal.signal(sig, handler)
