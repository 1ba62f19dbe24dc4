"""Rank discovery: one code path for srun (Slurm env), submitit and the local launcher.

The local launcher sets ``SLURM_RL_*`` variables; ``srun`` sets ``SLURM_*``; a submitit job sets
``SUBMITIT_EXECUTOR`` and is read through ``submitit.JobEnvironment``. Whatever the source, the
result is one :class:`RankInfo`. No torch import here: emulated ranks stay light.
"""

from __future__ import annotations

import glob
import os
import socket
import subprocess
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Mapping, MutableMapping

from slurm_rl.errors import LaunchError

if TYPE_CHECKING:
    from slurm_rl.placement import Placement

PORT_BASE = 20000
PORT_SPAN = 20000


class RankDiscoveryError(LaunchError):
    """The environment does not describe a rank (names the variables that were missing)."""


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the allocation."""

    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    num_nodes: int
    host: str
    master_addr: str
    master_port: int
    job_id: str
    source: str  # local | slurm | submitit

    def to_json(self) -> dict:
        return asdict(self)


def port_for_job(job_id: str) -> int:
    """Rendezvous port derived from the job id, so concurrent jobs on one node do not clash."""
    digits = "".join(ch for ch in str(job_id) if ch.isdigit()) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except KeyError:
        raise RankDiscoveryError(f"environment variable {key} is not set") from None
    except ValueError:
        raise RankDiscoveryError(f"environment variable {key}={env[key]!r} is not an integer") from None


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm hostlist (``n[1-2],gpu07``) with ``scontrol show hostnames``."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RankDiscoveryError(f"scontrol show hostnames {nodelist!r} failed: {out.stderr.strip()}")
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def node_address(node: str) -> str:
    """Address of a Slurm node: its NodeAddr when Slurm knows one, else the name itself.

    Virtual nodes (several slurmd on one host) have names that do not resolve; their NodeAddr does.
    """
    try:
        socket.gethostbyname(node)
        return node
    except OSError:
        pass
    out = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True, timeout=30)
    for field in out.stdout.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    raise RankDiscoveryError(f"cannot resolve Slurm node {node!r} and scontrol gives no NodeAddr for it")


def _from_local(env: Mapping[str, str]) -> RankInfo:
    job_id = env.get("SLURM_RL_JOB_ID", "local")
    return RankInfo(
        rank=_int(env, "SLURM_RL_RANK"),
        world_size=_int(env, "SLURM_RL_WORLD_SIZE"),
        local_rank=_int(env, "SLURM_RL_LOCAL_RANK"),
        node_rank=int(env.get("SLURM_RL_NODE_RANK", "0")),
        num_nodes=int(env.get("SLURM_RL_NUM_NODES", "1")),
        host=env.get("SLURM_RL_HOST", socket.gethostname()),
        master_addr=env.get("SLURM_RL_MASTER_ADDR", "127.0.0.1"),
        master_port=int(env.get("SLURM_RL_MASTER_PORT", str(port_for_job(job_id)))),
        job_id=job_id,
        source="local",
    )


def _from_slurm(env: Mapping[str, str]) -> RankInfo:
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "0"
    rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
    local_rank, node_rank = _int(env, "SLURM_LOCALID"), _int(env, "SLURM_NODEID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise RankDiscoveryError("environment variable SLURM_JOB_NODELIST is not set")
    master = env.get("SLURM_RL_MASTER_ADDR") or node_address(expand_nodelist(nodelist)[0])
    return RankInfo(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        node_rank=node_rank,
        num_nodes=int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"),
        host=env.get("SLURMD_NODENAME", socket.gethostname()),
        master_addr=master,
        master_port=int(env.get("SLURM_RL_MASTER_PORT", str(port_for_job(job_id)))),
        job_id=job_id,
        source="slurm",
    )


def _from_submitit(env: Mapping[str, str]) -> RankInfo:
    import submitit  # only in submitit jobs

    job_env = submitit.JobEnvironment()
    hosts = list(job_env.hostnames)
    job_id = str(job_env.job_id)
    first = hosts[0] if hosts else "127.0.0.1"
    master = env.get("SLURM_RL_MASTER_ADDR") or (node_address(first) if job_env.cluster == "slurm" else "127.0.0.1")
    return RankInfo(
        rank=job_env.global_rank,
        world_size=job_env.num_tasks,
        local_rank=job_env.local_rank,
        node_rank=job_env.node,
        num_nodes=job_env.num_nodes,
        host=env.get("SLURMD_NODENAME", socket.gethostname()),
        master_addr=master,
        master_port=int(env.get("SLURM_RL_MASTER_PORT", str(port_for_job(job_id)))),
        job_id=job_id,
        source="submitit",
    )


def discover_rank(env: Mapping[str, str] | None = None) -> RankInfo:
    """Describe this process from its environment (local launcher, submitit, or srun)."""
    env = os.environ if env is None else env
    if "SLURM_RL_RANK" in env:
        return _from_local(env)
    if "SUBMITIT_EXECUTOR" in env:
        return _from_submitit(env)
    if "SLURM_PROCID" in env:
        return _from_slurm(env)
    raise RankDiscoveryError(
        "no rank information: expected SLURM_RL_RANK (local launcher), SUBMITIT_EXECUTOR (submitit) "
        "or SLURM_PROCID (srun) in the environment"
    )


def rank_accelerators(placement: Placement, info: RankInfo) -> list[int]:
    """Indices of the accelerators rank ``info.rank`` owns, as its node numbers them (under the
    local launcher every rank runs on this machine, so they are the allocation's slot numbers)."""
    slots = placement.slots_of_rank[info.rank]
    if info.source == "local":
        return list(slots)
    first = placement.first_slot_of_node(placement.node_of_slot(slots[0]))
    return [s - first for s in slots]


def bind_accelerators(placement: Placement, info: RankInfo, env: MutableMapping[str, str]) -> str | None:
    """Narrow ``CUDA_VISIBLE_DEVICES`` in ``env`` to the accelerators the placement gives this rank
    (all of its slots when it owns several), read through the inherited list when there is one
    (Slurm's GRES binding). Sets ``SLURM_RL_SLOTS`` (the rank's global slots) and returns the new
    value; returns None and changes nothing when there are fewer accelerators (inherited list, else
    the NVIDIA devices of this machine) than the index wanted, e.g. an emulated run of more slots
    than the machine has accelerators."""
    wanted = rank_accelerators(placement, info)
    inherited = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    available = len(inherited) if inherited else len(glob.glob("/proc/driver/nvidia/gpus/*"))
    if max(wanted) >= available:
        return None
    value = ",".join(inherited[i] if inherited else str(i) for i in wanted)
    env["CUDA_VISIBLE_DEVICES"] = value
    env["SLURM_RL_SLOTS"] = ",".join(str(s) for s in placement.slots_of_rank[info.rank])
    return value


def check_node(placement: Placement, info: RankInfo) -> str | None:
    """A message when the launcher put this rank on another node than the placement does."""
    if info.source == "local" or info.num_nodes != placement.num_nodes:
        return None
    node = placement.node_of_rank(info.rank)
    if node == info.node_rank:
        return None
    return (f"rank {info.rank} runs on node {info.node_rank} ({info.host}) but the placement puts it on node "
            f"{node}: start {list(placement.ranks_per_node())} tasks per node (sbatch/train.sh does)")
