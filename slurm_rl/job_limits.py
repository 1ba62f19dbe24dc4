"""How long a run may go on: ``runtime.run_timeout_s``, or, where it is null, the Slurm allocation's end
less ``runtime.checkpoint_margin_s`` (locally: 4 hours).

At the deadline the coordinator asks the run to stop at its next gate with a checkpoint (a resumable
stop, as ``slurm-rl stop``); the margin is the time that stop and its checkpoint have before Slurm ends
the job. The allocation's end comes from ``SLURM_JOB_END_TIME`` (set by Slurm in the job's environment),
else from ``squeue -h -j $SLURM_JOB_ID -o %e``. Bottom layer: reads the environment and asks ``squeue``,
imports nothing of slurm_rl.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Mapping, Optional

LOCAL_RUN_TIMEOUT_S = 4 * 3600.0
"""A run's limit with ``runtime.run_timeout_s: null`` outside a Slurm job (or where the job has no end)."""

SQUEUE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RunLimit:
    """The run's deadline (``time.time()`` seconds) and where it comes from, for ``validate`` to print."""

    deadline: float
    timeout_s: float  # seconds from the moment it was resolved
    source: str

    def describe(self) -> str:
        """One line: the timeout, the wall-clock deadline and its source."""
        at = datetime.fromtimestamp(self.deadline).strftime("%Y-%m-%d %H:%M:%S")
        return f"{self.timeout_s:.0f}s (until {at}; {self.source})"


def _parse_end(text: str) -> Optional[float]:
    """``squeue``'s ``%e`` (local time ``YYYY-MM-DDTHH:MM:SS``) as epoch seconds; None for N/A, Unknown,
    UNLIMITED or anything else."""
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def job_end_time(env: Mapping[str, str] | None = None) -> tuple[Optional[float], str]:
    """The allocation's end (epoch seconds) and how it was read; (None, why) outside a job or for a job
    without an end."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None, "not in a Slurm job"
    raw = env.get("SLURM_JOB_END_TIME", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return float(raw), f"Slurm job {job} ends then (SLURM_JOB_END_TIME)"
    try:
        proc = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True,
                              timeout=SQUEUE_TIMEOUT_S, env=dict(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"squeue -j {job} gave no end time ({type(exc).__name__})"
    end = _parse_end(proc.stdout) if proc.returncode == 0 else None
    if end is None:
        return None, f"squeue -j {job} -o %e gave {proc.stdout.strip() or proc.stderr.strip()!r}"
    return end, f"Slurm job {job} ends then (squeue %e)"


def run_limit(run_timeout_s: Optional[float], margin_s: float, env: Mapping[str, str] | None = None,
              now: float | None = None) -> RunLimit:
    """The run's limit: ``run_timeout_s`` when set; else the allocation's end less ``margin_s``; else
    :data:`LOCAL_RUN_TIMEOUT_S`."""
    now = time.time() if now is None else now
    if run_timeout_s is not None:
        return RunLimit(now + run_timeout_s, float(run_timeout_s), "runtime.run_timeout_s")
    end, how = job_end_time(env)
    if end is None:
        return RunLimit(now + LOCAL_RUN_TIMEOUT_S, LOCAL_RUN_TIMEOUT_S,
                        f"runtime.run_timeout_s null: the local default of 4 h ({how})")
    left = max(0.0, end - margin_s - now)
    return RunLimit(now + left, left, f"runtime.run_timeout_s null: {how}, less runtime.checkpoint_margin_s "
                                      f"{margin_s:g}s")


def job_timeout_s(run_timeout_s: Optional[float], margin_s: float) -> float:
    """The time limit to ask of a new job for a run: ``run_timeout_s`` (else the local default of 4 h)
    plus ``margin_s`` for its final checkpoint."""
    return (LOCAL_RUN_TIMEOUT_S if run_timeout_s is None else float(run_timeout_s)) + margin_s


__all__ = ["LOCAL_RUN_TIMEOUT_S", "RunLimit", "job_end_time", "job_timeout_s", "run_limit"]
