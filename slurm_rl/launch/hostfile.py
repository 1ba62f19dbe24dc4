"""``python -m slurm_rl.launch.hostfile RUN_DIR HOST...``: the node of every rank, one line each.

``sbatch/train.sh`` starts ``srun --distribution=arbitrary`` from it: a task per node that holds
ranks, in the order of their first rank (:mod:`slurm_rl.launch.node` forks them), or, with
``SLURM_RL_FORKSERVER=0``, this file as ``SLURM_HOSTFILE``: a task per rank on the node the placement
gives it, whatever the number of slots each rank owns. HOSTs are the allocation's nodes in order
(``scontrol show hostnames``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from slurm_rl.placement import Placement


def rank_hosts(placement: Placement, hosts: list[str]) -> list[str]:
    """Host of each rank, in rank order; ``ValueError`` when the allocation has too few nodes."""
    if len(hosts) < placement.num_nodes:
        raise ValueError(f"the placement spans {placement.num_nodes} nodes (cluster.num_nodes) but the "
                         f"allocation has {len(hosts)}: {' '.join(hosts)}")
    return [hosts[placement.node_of_rank(r)] for r in range(placement.world_size)]


def main(argv: list[str]) -> int:
    from slurm_rl.config import load_config

    if len(argv) < 2:
        print("usage: python -m slurm_rl.launch.hostfile RUN_DIR HOST...", file=sys.stderr)
        return 2
    cfg = load_config(Path(argv[0]) / "config.yaml")
    try:
        lines = rank_hosts(cfg.placement, argv[1:])
    except ValueError as exc:
        print(f"slurm_rl: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
