"""Launch a run with submitit: ``submit(config, overrides, executor="slurm"|"local") -> submitit.Job``.

The run dir is prepared here, on the submitting side; every task of the job then runs the same
worker entry point as ``srun`` would (rank discovery reads ``submitit.JobEnvironment``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from slurm_rl.config import Config
from slurm_rl.launch.prepare import prepare_run

EXECUTORS = ("slurm", "local")


class SubmitError(ValueError):
    """Bad submit arguments (names the argument, the value and what is allowed)."""


def run_rank(run_dir: str) -> int:
    """The function each submitit task runs: one rank of the run. Raises when the rank fails."""
    from slurm_rl.worker.main import run_worker

    code = run_worker(Path(run_dir))
    if code != 0:
        raise RuntimeError(f"rank failed with exit code {code}; see {run_dir}/logs")
    return code


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
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
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
    job = ex.submit(run_rank, str(run_dir))
    print(f"run dir: {run_dir}", flush=True)
    print(f"submitted {executor} job {job.job_id} with {cfg.placement.world_size} tasks", flush=True)
    return job
