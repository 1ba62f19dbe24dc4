"""What the placer asks Slurm: the partition's GPUs (``sinfo``) and submitting a batch script (``sbatch``).

Capacity is the GPUs of the partition's usable nodes (from each node's ``gpu`` GRES; a partition
without GPU GRES counts CPUs as slots, as emulated groups use them). The partition is the one the
placer's sbatch options name (``-p``/``--partition``), else ``SBATCH_PARTITION``, else the default.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from slurm_rl.errors import LaunchError

DOWN_STATES = ("down", "drain", "drng", "drained", "fail", "maint", "futr", "future", "unk", "inval", "boot")
_JOB_ID = re.compile(r"(?:Submitted batch job\s+)?(\d+)(?:;\S+)?\s*$")


class SbatchError(LaunchError):
    """sbatch refused or failed: nothing was submitted."""


@dataclass(frozen=True)
class Capacity:
    """The GPUs placement may use in all (None: unknown), where the number came from, per node."""

    total_gpus: int | None
    source: str
    gpus_per_node: int = 8
    gres: bool = True  # GPUs are GRES (request --gres=gpu:N); False: CPU slots


def partition_of(sbatch_args: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """The partition named by ``sbatch_args`` (``-p X``, ``-pX``, ``--partition X|=X``) or SBATCH_PARTITION."""
    args = list(sbatch_args)
    found = None
    for i, a in enumerate(args):
        if a in ("-p", "--partition") and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith("--partition="):
            found = a.split("=", 1)[1]
        elif a.startswith("-p") and len(a) > 2 and not a.startswith("--"):
            found = a[2:]
    return found or (env if env is not None else os.environ).get("SBATCH_PARTITION") or None


def gres_gpus(gres: str) -> int:
    """GPUs in a node's GRES string: ``gpu:8``, ``gpu:h100:4(S:0-1),gpu:a100:2``, ``(null)``."""
    total = 0
    for part in re.split(r",(?![^()]*\))", gres or ""):
        fields = re.sub(r"\(.*?\)", "", part.strip()).split(":")
        if fields and fields[0] == "gpu" and len(fields) >= 2 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def parse_sinfo(text: str, partition: str | None) -> Capacity:
    """Capacity from ``sinfo -h -N -o '%N|%P|%c|%G|%t'`` lines (each node once; ``*``: default)."""
    nodes: dict[str, tuple[int, int]] = {}
    parts = set()
    default = None
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5:
            continue
        node, part, cpus, gres, state = fields
        if part.endswith("*"):
            part = part[:-1]
            default = part
        parts.add(part)
        if state.rstrip("*~#!%$@^-").lower() in DOWN_STATES:
            continue
        nodes.setdefault(f"{part}/{node}", (gres_gpus(gres), int(cpus) if cpus.isdigit() else 0))
    want = partition or default
    if want is None or want not in parts:
        raise LaunchError(f"sinfo: partition {want!r} not found (partitions: {sorted(parts)}); "
                          "name one with -p/--partition or give --max-gpus N")
    mine = [v for k, v in nodes.items() if k.split("/", 1)[0] == want]
    gpus = [g for g, _ in mine]
    if any(gpus):
        return Capacity(sum(gpus), f"sinfo: partition {want}, {len(mine)} nodes up, {sum(gpus)} GPUs",
                        max(gpus), True)
    cpus = [c for _, c in mine]
    return Capacity(sum(cpus), f"sinfo: partition {want}, {len(mine)} nodes up, no GPU GRES: {sum(cpus)} CPU slots",
                    max(cpus, default=1) or 1, False)


def slurm_capacity(sbatch_args: Sequence[str] = ()) -> Capacity:
    """The partition's capacity from ``sinfo`` (``Capacity(None, why)`` when sinfo is not there)."""
    if shutil.which("sinfo") is None:
        return Capacity(None, "no sinfo on PATH (not on a Slurm cluster?); give --max-gpus N")
    try:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%P|%c|%G|%t"], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        return Capacity(None, "sinfo did not answer within 60s; give --max-gpus N")
    if proc.returncode != 0:
        return Capacity(None, f"sinfo exited {proc.returncode}: {proc.stderr.strip()}; give --max-gpus N")
    return parse_sinfo(proc.stdout, partition_of(sbatch_args))


def resource_args(slots: int, cap: Capacity) -> list[str]:
    """sbatch options for an allocation of ``slots`` slots (one task each) on nodes of ``cap``."""
    per = max(1, cap.gpus_per_node)
    nodes = math.ceil(slots / per)
    tasks = math.ceil(slots / nodes)
    args = [f"--nodes={nodes}", f"--ntasks-per-node={tasks}"]
    if cap.gres:
        args.append(f"--gres=gpu:{tasks}")
    return args


def parse_job_id(stdout: str) -> str:
    """The job id of sbatch's output (``--parsable``: ``ID[;cluster]``; else ``Submitted batch job ID``)."""
    for line in reversed(stdout.strip().splitlines()):
        m = _JOB_ID.search(line.strip())
        if m:
            return m.group(1)
    raise SbatchError(f"sbatch printed no job id: {stdout.strip()!r}")


def sbatch(args: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None, timeout_s: float = 120.0) -> str:
    """Run ``sbatch --parsable ARGS`` in ``cwd``; the job id. :class:`SbatchError` with sbatch's words."""
    if shutil.which("sbatch") is None:
        raise SbatchError("sbatch is not on PATH (not on a Slurm cluster?); nothing was submitted")
    cmd = ["sbatch", "--parsable", *args]
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=dict(env) if env is not None else None, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SbatchError(f"sbatch did not answer within {timeout_s:.0f}s ({' '.join(cmd)}); "
                          "check squeue before placing again") from None
    if proc.returncode != 0:
        raise SbatchError(f"sbatch exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()} "
                          f"({' '.join(cmd)}); nothing was submitted")
    return parse_job_id(proc.stdout)
