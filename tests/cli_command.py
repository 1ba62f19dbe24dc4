"""How tests start the command line: ``python -m slurm_rl.launch.zygote exec slurm_rl.cli``, forked by
the session's ``cpu`` zygote (tests/zygotes.py) as the process itself, or exec'd as a fresh
``python -m slurm_rl.cli`` where no zygote serves (``SLURM_RL_TEST_ZYGOTE=0``); the scripts of ``tools/``
the same way (:func:`tool`: ``python tools/SCRIPT.py``, their imports of torch, megatron-core and transformers
already made)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "slurm_rl.launch.zygote", "exec", "slurm_rl.cli"]


def tool(script: str) -> list[str]:
    """The argv that runs ``python tools/SCRIPT`` (forked by the session's ``cpu`` zygote where one serves)."""
    return [sys.executable, "-m", "slurm_rl.launch.zygote", "exec", str(REPO / "tools" / script)]
