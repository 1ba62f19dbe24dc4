"""``python -m slurm_rl.worker RUN_DIR``: one rank of a run (started by srun, submitit or locally)."""

from __future__ import annotations

import sys
from pathlib import Path

from slurm_rl.worker.main import run_worker

if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m slurm_rl.worker RUN_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(run_worker(Path(sys.argv[1])))
