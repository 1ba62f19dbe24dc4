"""Local multi-process launch (no Slurm): one worker process per rank on this machine.

This is the embedded default of ``slurm-rl run``. The workers discover their rank from the
``SLURM_RL_*`` variables set here; everything else is the same code as under ``srun``.

Each run's ranks are forked from a fork server that imported what they need once
(:mod:`slurm_rl.launch.forkserver`); ``SLURM_RL_FORKSERVER=0`` starts every rank as a fresh
``python -m slurm_rl.worker RUN_DIR`` instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from slurm_rl.errors import LaunchError  # the launch family; importable from here as before
from slurm_rl.fsio import remove_temp_files_of
from slurm_rl.launch import forkserver as _forkserver
from slurm_rl.launch.proctable import process_stats


@dataclass(frozen=True)
class LocalRunResult:
    run_dir: Path
    seconds: float
    exit_codes: dict[int, int]


EPHEMERAL_FLOOR = 32768  # Linux's default ip_local_port_range start, when /proc does not say
PORT_WINDOW = 8192  # the rendezvous port is drawn from this many ports below the ephemeral range


def _free_port() -> int:
    """A free port for the ranks' rendezvous, drawn below the kernel's ephemeral range: a port that
    bind(0) gives is an ephemeral one, which another process's outgoing connection can take in the
    seconds before rank 0 binds it (the fork server imports first); these ports are only ever bound
    on purpose."""
    import random
    import socket

    try:
        floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        floor = EPHEMERAL_FLOOR
    low = max(1024, floor - PORT_WINDOW)
    for port in random.SystemRandom().sample(range(low, floor), min(64, floor - low)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise LaunchError(f"no free port for the rendezvous in [{low}, {floor})")


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


class RankProcess(Protocol):
    """A rank's process as :class:`LocalJob` holds it: a ``subprocess.Popen``, or a
    :class:`~slurm_rl.launch.forkserver.ForkedRank` of the run's fork server."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class LocalJob:
    """The worker processes of one run on this machine (started at construction).

    ``forkserver``: fork the ranks from the run's fork server (:mod:`slurm_rl.launch.forkserver`);
    None: unless ``SLURM_RL_FORKSERVER=0``. Each rank leads its own process group either way."""

    def __init__(self, run_dir: Path, world_size: int, log_dir: Path | None = None,
                 forkserver: bool | None = None) -> None:
        self.run_dir = run_dir
        self.log_dir = log_dir or run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.procs: dict[int, RankProcess] = {}
        self.codes: dict[int, int] = {}
        self._logs = []
        self._server: _forkserver.ForkServer | None = None
        job_id = f"local-{os.getpid()}-{run_dir.name}"
        port = _free_port()
        base = dict(os.environ)
        try:
            if _forkserver.enabled() if forkserver is None else forkserver:
                # the server imports under the ranks' OMP_NUM_THREADS (OpenBLAS starts no threads then)
                self._server = _forkserver.ForkServer(
                    run_dir, dict(base, OMP_NUM_THREADS=base.get("OMP_NUM_THREADS", "1")), self.log_dir)
                try:
                    self.procs.update(self._server.start([
                        (rank, worker_env(rank, world_size, job_id, port, base), self._log_path(rank))
                        for rank in range(world_size)]))
                    return
                except _forkserver.ForkServerUnusable as exc:
                    print(f"{exc}; starting each rank as a fresh process", file=sys.stderr, flush=True)
                    self._server.close()
                    self._server = None
            for rank in range(world_size):
                log = open(self._log_path(rank), "wb")
                self._logs.append(log)
                self.procs[rank] = subprocess.Popen(
                    [sys.executable, "-m", "slurm_rl.worker", str(run_dir)],
                    env=worker_env(rank, world_size, job_id, port, base),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except BaseException:
            self.kill()
            raise

    def _log_path(self, rank: int) -> Path:
        return self.log_dir / f"rank-{rank:04d}.log"

    def poll(self) -> dict[int, int] | None:
        """Exit codes once every rank exited, None while some run; the first rank to fail stops
        the others and raises :class:`LaunchError` with the end of its log."""
        for rank, p in self.procs.items():
            if rank in self.codes or (rc := p.poll()) is None:
                continue
            self.codes[rank] = rc
            if rc != 0:
                self.kill()
                log = self._log_path(rank)
                server = self._server
                if server is not None and rc == _forkserver.LOST_CODE and server.proc.returncode not in (None, 0):
                    log = server.log_path
                    raise LaunchError(f"the fork server of this run exited with code {server.proc.returncode} while "
                                      f"rank {rank} ran; stopped every rank. Last lines of {log}:\n{_tail(log)}")
                raise LaunchError(f"rank {rank} exited with code {rc}; stopped the other ranks. "
                                  f"Last lines of {log}:\n{_tail(log)}")
        if len(self.codes) < len(self.procs):
            return None
        if self._server is not None:
            self._server.close()
        return dict(self.codes)

    def kill(self) -> None:
        """Stop every rank still running, and what its process group still holds (rank 0's
        coordinator outlives a rank 0 that died), and close the logs."""
        server = self._server
        if server is not None and not server.started:  # the start failed midway: ranks we may not know of
            server.abort()
        killed = [p.pid for p in self.procs.values() if p.poll() is None]
        for p in self.procs.values():
            _killpg(p.pid)
        for p in self.procs.values():
            p.wait()
        if server is not None:
            server.close()
        if killed or any(rc != 0 for rc in self.codes.values()):
            # a writer killed mid-write leaves its temp file: once nothing of the run is left, remove them
            _wait_until_gone([p.pid for p in self.procs.values()], timeout_s=5.0)
            remove_temp_files_of(self.run_dir)
        for log in self._logs:
            log.close()
        self._logs = []


def run_local(run_dir: Path, world_size: int, timeout_s: float, log_dir: Path | None = None) -> LocalRunResult:
    """Start ``world_size`` workers on ``run_dir`` (already prepared) and wait for all of them.

    The first rank to fail stops the others; a run still going after ``timeout_s`` is stopped.
    Each rank's output goes to ``run_dir/logs/rank-NNNN.log``.
    """
    previous = signal.signal(signal.SIGTERM, _raise_terminated)  # so the finally below stops the ranks
    previous_hup = signal.signal(signal.SIGHUP, _raise_terminated)  # the terminal closed: stop them too
    job: LocalJob | None = None
    try:
        job = LocalJob(run_dir, world_size, log_dir)
        deadline = time.monotonic() + timeout_s
        while (codes := job.poll()) is None:
            if time.monotonic() > deadline:
                missing = sorted(r for r in job.procs if r not in job.codes)
                raise LaunchError(f"run did not finish within {timeout_s:.0f}s; ranks still running: {missing}")
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGHUP, previous_hup)
        if job is not None:
            job.kill()
    return LocalRunResult(run_dir=run_dir, seconds=time.monotonic() - job.started, exit_codes=codes)


def _raise_terminated(signum: int, frame: object) -> None:
    raise LaunchError(f"launcher received signal {signum}; stopping every rank")


def _wait_until_gone(pgids: list[int], timeout_s: float) -> None:
    """Until no live (non-zombie) process is left in the process groups ``pgids``, at most ``timeout_s``."""
    groups, deadline = set(pgids), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(fields[0] != "Z" and int(fields[2]) in groups for _, fields in process_stats()):
            return
        time.sleep(0.01)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_tail = _forkserver.tail
