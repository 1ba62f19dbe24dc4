"""How tests start the command line: ``python -m slurm_rl.launch.zygote exec slurm_rl.cli``, forked by
the session's ``cpu`` zygote (tests/zygotes.py) as the process itself, or exec'd as a fresh
``python -m slurm_rl.cli`` where no zygote serves (``SLURM_RL_TEST_ZYGOTE=0``)."""

import sys

CLI = [sys.executable, "-m", "slurm_rl.launch.zygote", "exec", "slurm_rl.cli"]
