"""After the ranks of a batch job ended: requeue the job when its run should go on.

``sbatch/train.sh`` runs ``python -m slurm_rl.launch.requeue RUN_DIR --srun-exit RC`` after
``srun``. The run goes on in a requeued job (``scontrol requeue``; the script has ``--requeue``)
when

- the coordinator stopped it at a gate with a checkpoint (USR1 ahead of the time limit or a
  preemption, SIGTERM, ``slurm-rl stop``), or
- ranks died or hung and ``runtime.on_rank_failure`` is ``checkpoint_and_requeue``: the hosts
  the coordinator found dead are excluded (``ExcNodeList``) where Slurm accepts it, and the job
  resumes from the last checkpoint (``runtime.checkpoint_every``).

The restarted job finds this RUN_DIR again through its job id (``slurm-rl prepare``).
Exit code: 0 requeued, 3 the run finished (nothing to do), 1 not requeued.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from slurm_rl.config import load_config
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import read_coordinator_status

SCONTROL_TIMEOUT_S = 60.0
EXIT_REQUEUED, EXIT_NOT_REQUEUED, EXIT_FINISHED = 0, 1, 3


@dataclass(frozen=True)
class RequeueDecision:
    requeue: bool
    reason: str
    exclude: list[str] = field(default_factory=list)


def decide(run_dir: Path, srun_exit: int) -> RequeueDecision:
    """Whether the job should be requeued, from the run's files and the ranks' exit code."""
    status = read_coordinator_status(RunPaths(run_dir))
    state = status.state if status is not None else None
    if state == "finished":  # (ranks may still exit non-zero: a signal arriving while they shut down)
        return RequeueDecision(False, "the run finished")
    if state == "stopped":
        return RequeueDecision(True, f"stopped at the gate of iteration {status.stopped_at_iteration} "
                                     f"({(status.stop or {}).get('reason')})")
    policy = load_config(run_dir / "config.yaml").runtime.on_rank_failure
    if policy != "checkpoint_and_requeue":
        return RequeueDecision(False, f"ranks exited with code {srun_exit}, coordinator state {state!r}; "
                                      f"runtime.on_rank_failure is {policy!r}")
    if status is not None and status.failed and not status.requeue:
        return RequeueDecision(False, f"the run failed for a reason other than a rank: {status.error}")
    return RequeueDecision(True, f"rank failure (ranks exited with code {srun_exit}; coordinator: "
                                 f"{(status.error if status else None) or state})",
                           list(status.exclude) if status is not None else [])


def _scontrol(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)


def requeue_job(job_id: str, exclude: list[str], log=print) -> bool:
    """``scontrol requeue`` the job, first excluding ``exclude`` where Slurm accepts it."""
    if exclude:
        done = _scontrol("update", f"JobId={job_id}", f"ExcNodeList={','.join(exclude)}")
        log(f"slurm_rl: exclude {','.join(exclude)} from job {job_id}: "
            + ("done" if done.returncode == 0 else f"refused by Slurm ({done.stderr.strip() or done.stdout.strip()})"))
    done = _scontrol("requeue", job_id)
    if done.returncode != 0:
        log(f"slurm_rl: scontrol requeue {job_id} failed: {done.stderr.strip() or done.stdout.strip()}")
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm_rl.launch.requeue")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--srun-exit", type=int, required=True)
    args = parser.parse_args(argv)
    decision = decide(args.run_dir, args.srun_exit)
    job_id = os.environ.get("SLURM_JOB_ID")
    if not decision.requeue:
        print(f"slurm_rl: not requeued: {decision.reason}", flush=True)
        return EXIT_FINISHED if decision.reason == "the run finished" else EXIT_NOT_REQUEUED
    if not job_id:
        print(f"slurm_rl: would requeue ({decision.reason}) but SLURM_JOB_ID is not set; resume with: "
              f"slurm-rl run --resume {args.run_dir}", flush=True)
        return EXIT_NOT_REQUEUED
    print(f"slurm_rl: requeueing job {job_id}: {decision.reason}; it resumes {args.run_dir}", flush=True)
    return EXIT_REQUEUED if requeue_job(job_id, decision.exclude) else EXIT_NOT_REQUEUED


if __name__ == "__main__":
    sys.exit(main())
