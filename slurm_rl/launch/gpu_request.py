"""Whether a run needs GPUs, whether its Slurm allocation (or partition) has them, and the sbatch flags
that would give them.

A config needs GPUs with ``runtime.device: cuda``, or under ``auto`` with a vLLM rollout or a model of
more than :data:`CPU_MAX_PARAMETERS` parameters (a cpu would take too long to train it); ``cpu`` and
``emulated`` runs need none. ``sbatch sbatch/train.sh`` checks its allocation before anything starts
(:func:`allocation_problem`); ``slurm-rl submit`` asks for GPUs under ``auto`` where the partition has
them (:func:`partition_gpus`).
"""

from __future__ import annotations

import re
import subprocess
from typing import Mapping, Optional

from slurm_rl.config import Config

CPU_MAX_PARAMETERS = 100e6
"""Under ``runtime.device: auto``, a larger model needs GPUs."""

SINFO_TIMEOUT_S = 10.0


def written_device(cfg: Config) -> str:
    """``runtime.device`` as the config writes it (``auto`` is resolved per host in ``cfg.runtime``)."""
    from omegaconf import OmegaConf

    written = OmegaConf.select(cfg.raw, "runtime.device", default=None) if cfg.raw is not None else None
    return str(written or cfg.runtime.device)


def gpu_need(cfg: Config, parameters: Optional[int] = None) -> Optional[str]:
    """Why the run needs GPUs (a phrase naming the key), or None; ``parameters``: the model's size if
    known (``inputs.model_summary``)."""
    device = written_device(cfg)
    if device == "cuda":
        return "runtime.device is cuda"
    if device != "auto":
        return None
    if cfg.rollout.backend == "vllm":
        return "runtime.device auto with rollout.backend vllm"
    if parameters is not None and parameters > CPU_MAX_PARAMETERS:
        return (f"runtime.device auto with a model of {parameters / 1e6:.0f}M parameters "
                f"(more than {CPU_MAX_PARAMETERS / 1e6:.0f}M: too slow to train on cpu)")
    return None


def _count(text: str) -> Optional[int]:
    """GPUs in a Slurm GPU variable: ``4``, ``gpu:4``, ``a100:4``, ``gpu:a100:4``, or a device list ``0,1,2``."""
    text = text.strip()
    if not text or text in ("(null)", "N/A"):
        return None
    if text.isdigit():
        return int(text)
    if re.fullmatch(r"[\d,\s]+", text):
        return len([d for d in text.split(",") if d.strip()])
    m = re.search(r":(\d+)$", text)  # gpu:4, gpu:a100:4, a100:4, gres/gpu:4
    return int(m.group(1)) if m else None


def allocation_gpus_per_node(env: Mapping[str, str]) -> int:
    """GPUs per node the job holds (0 when its variables name none)."""
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        n = _count(env.get(name, ""))
        if n is not None:
            return n
    tres = env.get("SLURM_TRES_PER_NODE", "")
    return (_count(tres) or 0) if "gpu" in tres else 0


def sbatch_flags(cfg: Config) -> str:
    """The sbatch options that give the run its GPUs: nodes, a task per rank, a GPU per slot."""
    placement = cfg.placement
    per_node = max(placement.slots_per_node) if placement.slots_per_node else placement.num_slots
    tasks = max(placement.ranks_per_node())
    return f"--nodes={cfg.cluster.num_nodes} --ntasks-per-node={tasks} --gres=gpu:{per_node}"


def allocation_problem(cfg: Config, env: Mapping[str, str]) -> Optional[str]:
    """Inside a Slurm job: why its allocation cannot run the config (it needs more GPUs per node than
    the job holds), with the sbatch command that would work; None when it can, or outside a job."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    need = gpu_need(cfg)
    if need is None and written_device(cfg) == "auto":  # the model's size decides
        from slurm_rl.inputs import model_summary

        need = gpu_need(cfg, model_summary(cfg)["parameters"])
    if need is None:
        return None
    placement = cfg.placement
    wanted = max(placement.slots_per_node) if placement.slots_per_node else placement.num_slots
    held = allocation_gpus_per_node(env)
    if held >= wanted:
        return None
    return (f"Slurm job {job} holds {held} GPU(s) per node, but the config needs {wanted} per node ({need}); "
            f"nothing launched. Submit it with: sbatch {sbatch_flags(cfg)} sbatch/train.sh CONFIG "
            "(or set runtime.device: cpu)")


def partition_gpus(partition: Optional[str], env: Optional[Mapping[str, str]] = None) -> int:
    """The most GPUs a node of ``partition`` (None: of any partition) has, from ``sinfo -h -o %G``;
    0 where it lists none or sinfo cannot be run."""
    cmd = ["sinfo", "-h", "-o", "%G"] + (["-p", partition] if partition else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SINFO_TIMEOUT_S,
                              env=None if env is None else dict(env))
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if proc.returncode != 0:
        return 0
    counts = [_count(item) or 0 for line in proc.stdout.split() for item in line.split(",") if "gpu" in item]
    return max(counts, default=0)


__all__ = ["CPU_MAX_PARAMETERS", "allocation_gpus_per_node", "allocation_problem", "gpu_need",
           "partition_gpus", "sbatch_flags", "written_device"]

