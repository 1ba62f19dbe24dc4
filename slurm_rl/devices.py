"""Which accelerators this process sees, without importing torch (``runtime.device: auto``).

A rank sees GPUs when ``nvidia-smi -L`` lists at least one and ``CUDA_VISIBLE_DEVICES`` (set by
Slurm's GRES binding, or by hand) does not hide them all. A Slurm allocation *has* GPUs when its job
or step variables name some (``SLURM_JOB_GPUS``, ``SLURM_STEP_GPUS``, ``SLURM_GPUS_ON_NODE``,
``SLURM_GPUS``...), whether or not this process can use them.
"""

from __future__ import annotations

import subprocess
from typing import Mapping

NVIDIA_SMI_TIMEOUT_S = 15.0
_HIDDEN = ("", "-1", "none", "nodevfiles")
_ALLOCATION_VARS = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE",
                    "SLURM_GPUS", "SLURM_TRES_PER_NODE")


def visible_gpus(env: Mapping[str, str]) -> int:
    """How many GPUs this process sees (0 without ``nvidia-smi`` or when all are hidden)."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip().lower() in _HIDDEN:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    listed = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0
    if cvd is not None and listed:
        return min(listed, len([d for d in cvd.split(",") if d.strip()]))
    return listed


def allocation_gpus(env: Mapping[str, str]) -> str | None:
    """The Slurm variable that says this allocation has GPUs (``NAME=value``), else None."""
    for name in _ALLOCATION_VARS:
        value = env.get(name, "").strip()
        if value and value not in ("0", "(null)") and (name != "SLURM_TRES_PER_NODE" or "gpu" in value):
            return f"{name}={value}"
    return None


def resolve_device(device: str, env: Mapping[str, str]) -> str:
    """``runtime.device`` as the run uses it: ``auto`` is ``cuda`` where this process sees GPUs,
    else ``cpu``; any other value is kept (``emulated`` only when a config names it)."""
    if device != "auto":
        return device
    return "cuda" if visible_gpus(env) > 0 else "cpu"
