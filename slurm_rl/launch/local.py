"""Local multi-process launch (no Slurm): one worker process per rank on this machine.

This is the embedded default of ``slurm-rl run``. The workers discover their rank from the
``SLURM_RL_*`` variables set here; everything else is the same code as under ``srun``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


class LaunchError(RuntimeError):
    """A rank failed or the run did not finish in time (names the ranks and their exit codes)."""


@dataclass(frozen=True)
class LocalRunResult:
    run_dir: Path
    seconds: float
    exit_codes: dict[int, int]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(rank: int, world_size: int, job_id: str, port: int, base: dict[str, str]) -> dict[str, str]:
    """Environment of one local worker process."""
    env = dict(base)
    env.update(
        SLURM_RL_RANK=str(rank),
        SLURM_RL_WORLD_SIZE=str(world_size),
        SLURM_RL_LOCAL_RANK=str(rank),
        SLURM_RL_NODE_RANK="0",
        SLURM_RL_NUM_NODES="1",
        SLURM_RL_JOB_ID=job_id,
        SLURM_RL_MASTER_ADDR="127.0.0.1",
        SLURM_RL_MASTER_PORT=str(port),
        OMP_NUM_THREADS=base.get("OMP_NUM_THREADS", "1"),
    )
    return env


def run_local(run_dir: Path, world_size: int, timeout_s: float, log_dir: Path | None = None) -> LocalRunResult:
    """Start ``world_size`` workers on ``run_dir`` (already prepared) and wait for all of them.

    The first rank to fail stops the others; a run still going after ``timeout_s`` is stopped.
    Each rank's output goes to ``run_dir/logs/rank-NNNN.log``.
    """
    log_dir = log_dir or run_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    job_id = f"local-{os.getpid()}"
    port = _free_port()
    procs: dict[int, subprocess.Popen] = {}
    logs = []
    start = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _raise_terminated)  # so the finally below stops the ranks
    try:
        for rank in range(world_size):
            log = open(log_dir / f"rank-{rank:04d}.log", "wb")
            logs.append(log)
            procs[rank] = subprocess.Popen(
                [sys.executable, "-m", "slurm_rl.worker", str(run_dir)],
                env=worker_env(rank, world_size, job_id, port, dict(os.environ)),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        codes = _wait_all(procs, timeout_s, log_dir)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for p in procs.values():
            if p.poll() is None:
                _kill(p)
        for log in logs:
            log.close()
    return LocalRunResult(run_dir=run_dir, seconds=time.monotonic() - start, exit_codes=codes)


def _raise_terminated(signum: int, frame: object) -> None:
    raise LaunchError(f"launcher received signal {signum}; stopping every rank")


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_all(procs: dict[int, subprocess.Popen], timeout_s: float, log_dir: Path) -> dict[int, int]:
    deadline = time.monotonic() + timeout_s
    codes: dict[int, int] = {}
    while len(codes) < len(procs):
        for rank, p in procs.items():
            if rank in codes:
                continue
            rc = p.poll()
            if rc is None:
                continue
            codes[rank] = rc
            if rc != 0:
                for other in procs.values():
                    if other.poll() is None:
                        _kill(other)
                raise LaunchError(
                    f"rank {rank} exited with code {rc}; stopped the other ranks. "
                    f"Last lines of {log_dir / f'rank-{rank:04d}.log'}:\n{_tail(log_dir / f'rank-{rank:04d}.log')}"
                )
        if time.monotonic() > deadline:
            missing = sorted(r for r in procs if r not in codes)
            raise LaunchError(f"run did not finish within {timeout_s:.0f}s; ranks still running: {missing}")
        time.sleep(0.05)
    return codes
