"""Named kill points for fault drills (``tools/fault_drill.py``): a process SIGKILLs itself when
it reaches the point named by ``SLURM_RL_FAULT``.

``SLURM_RL_FAULT="NAME@key=value,key=value"`` kills the process that calls
``fault_point(NAME, ...)`` with every listed key equal (as text), e.g. ``reshard@rank=1`` or
``checkpoint_write@iteration=2``. With ``SLURM_RL_FAULT_ONCE=PATH`` the fault fires once per
drill: the first process to create PATH dies, later ones (a restarted coordinator, a resumed
run) pass. Unset (always, outside drills) a point costs one environment lookup. The kill is real
(SIGKILL: no cleanup, no flush); only the moment is chosen.
"""

from __future__ import annotations

import os
import signal
from typing import Any

FAULT_ENV = "SLURM_RL_FAULT"
FAULT_ONCE_ENV = "SLURM_RL_FAULT_ONCE"
POINTS = ("reshard", "weight_sync", "epoch_write", "checkpoint_write", "rank_checkpoint")


def fault_point(name: str, **context: Any) -> None:
    """SIGKILL this process if ``SLURM_RL_FAULT`` names this point and ``context``."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    point, _, conditions = spec.partition("@")
    if point != name:
        return
    for condition in filter(None, conditions.split(",")):
        key, _, value = condition.partition("=")
        if str(context.get(key)) != value:
            return
    once = os.environ.get(FAULT_ONCE_ENV)
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return
    os.write(2, f"fault drill: SIGKILL at {name} {context}\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)
