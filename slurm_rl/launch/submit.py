"""Launch a run with submitit: ``submit(config, overrides, executor="slurm"|"local") -> submitit.Job``.

The run dir is prepared here, on the submitting side; every task of the job then runs the same
worker entry point as ``srun`` would (rank discovery reads ``submitit.JobEnvironment``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import submitit

from slurm_rl.config import Config
from slurm_rl.errors import InputError, LaunchError
from slurm_rl.launch.prepare import prepare_run

EXECUTORS = ("slurm", "local")


class SubmitError(InputError):
    """Bad submit arguments (names the argument, the value and what is allowed)."""


STOP_WAIT_S = 50.0  # within submitit's signal_delay_s (60): the run reaches its gate and checkpoints


class RankTask(submitit.helpers.Checkpointable):
    """What each submitit task runs: one rank of the run, as a child process.

    Checkpointable the submitit way: when Slurm signals the job ahead of its time limit or a
    preemption (submitit's USR2), submitit calls :meth:`checkpoint` on task 0, which asks the
    run to checkpoint at its next gate, waits for it to stop, prepares the run dir for the next
    incarnation and hands submitit the same task to requeue. The rank runs in a child process
    so that this handler can wait while the rank works.
    """

    def __call__(self, run_dir: str) -> int:
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        self.child = subprocess.Popen([sys.executable, "-m", "slurm_rl.worker", run_dir], env=env)
        code = self.child.wait()
        if code != 0:
            raise LaunchError(f"rank failed with exit code {code}; see {run_dir}/logs")
        return code

    def checkpoint(self, run_dir: str) -> submitit.helpers.DelayedSubmission:  # type: ignore[override]
        """Stop the run at its next gate with a checkpoint, then requeue this task."""
        from slurm_rl.control.paths import RunPaths
        from slurm_rl.control.status import read_coordinator_status
        from slurm_rl.resume.restart import prepare_resume
        from slurm_rl.resume.stop import request_stop

        root = Path(run_dir)
        request_stop(root, "submitit checkpoint (time limit or preemption)")
        deadline = time.monotonic() + STOP_WAIT_S
        child = getattr(self, "child", None)
        while time.monotonic() < deadline:
            status = read_coordinator_status(RunPaths(root))
            stopped = status is not None and status.state == "stopped"
            if stopped and (child is None or child.poll() is not None):
                break
            time.sleep(0.2)
        else:
            print(f"slurm_rl: the run did not stop within {STOP_WAIT_S:.0f}s; it resumes from its last checkpoint",
                  file=sys.stderr, flush=True)
        prepare_resume(root, log=lambda m: print(f"slurm_rl: {m}", flush=True))
        return submitit.helpers.DelayedSubmission(RankTask(), run_dir)


def make_executor(cfg: Config, run_dir: Path, executor: str, slurm_params: dict[str, Any] | None = None) -> Any:
    """A submitit executor with one task per accelerator slot."""
    import submitit

    if executor not in EXECUTORS:
        raise SubmitError(f"--executor: got {executor!r}; allowed: {', '.join(EXECUTORS)}")
    folder = run_dir / "logs" / "submitit"
    world = cfg.placement.world_size
    timeout_min = max(1, int(cfg.runtime.run_timeout_s // 60) + 1)
    if executor == "local":
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(nodes=1, tasks_per_node=world, timeout_min=timeout_min)
        return ex
    nodes = cfg.cluster.num_nodes
    per_node = cfg.placement.ranks_per_node()
    if len(set(per_node)) != 1:
        raise SubmitError(f"cluster.component_placement: got {list(per_node)} ranks per node; allowed: the same "
                          "number on every node with submitit (sbatch/train.sh starts any layout)")
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=3)  # time limits requeue (RankTask.checkpoint)
    params: dict[str, Any] = dict(
        nodes=nodes,
        ntasks_per_node=world // nodes,
        time=timeout_min,
        job_name="slurm-rl",
        signal_delay_s=60,
    )
    if cfg.runtime.device == "cuda":
        params["gres"] = f"gpu:{max(cfg.placement.slots_per_node)}"
    params.update(slurm_params or {})
    ex.update_parameters(**params)
    return ex


def submit(
    config_path: str | Path,
    overrides: Sequence[str] = (),
    executor: str = "slurm",
    slurm_params: dict[str, Any] | None = None,
) -> Any:
    """Validate, prepare the run dir, submit one task per slot; returns the ``submitit.Job``."""
    if executor not in EXECUTORS:
        raise SubmitError(f"--executor: got {executor!r}; allowed: {', '.join(EXECUTORS)}")
    cfg, run_dir = prepare_run(config_path, overrides)
    ex = make_executor(cfg, run_dir, executor, slurm_params)
    job = ex.submit(RankTask(), str(run_dir))
    print(f"run dir: {run_dir}", flush=True)
    print(f"submitted {executor} job {job.job_id} with {cfg.placement.world_size} tasks", flush=True)
    return job
