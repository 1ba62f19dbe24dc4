"""Scheduling policies: pure functions ``decide(state) -> Decision | None``.

``static`` never moves anything, ``scripted`` follows ``PolicyConfig.script``, ``auto`` follows
RLinf's auto scheduler (with the ``use_pre_process_policy`` and
``use_wait_before_last_iter_policy`` options read from the state's ``PolicyConfig``), ``plan``
moves GPUs where a forecast of the iteration's critical path says it pays.
"""

from __future__ import annotations

import functools
from typing import Callable

from slurm_rl.scheduler.defaults import POLICIES
from slurm_rl.scheduler.policies.auto import decide_auto, starved_components
from slurm_rl.scheduler.policies.plan import decide_plan
from slurm_rl.scheduler.policies.scripted import decide_scripted
from slurm_rl.scheduler.policies.static import decide_static
from slurm_rl.scheduler.state import Decision, PolicyConfig, SchedState

Policy = Callable[[SchedState], Decision | None]


def make_policy(name: str, cfg: PolicyConfig) -> Policy:
    """The policy function called ``name``; ``scripted`` binds ``cfg.script``."""
    if name == "static":
        return decide_static
    if name == "auto":
        return decide_auto
    if name == "plan":
        return decide_plan
    if name == "scripted":
        if not cfg.script:
            raise ValueError("scheduler.script: the scripted policy needs at least one step")
        return functools.partial(decide_scripted, steps=cfg.script)
    raise ValueError(f"scheduler.policy: got {name!r}, allowed {POLICIES}")


__all__ = ["POLICIES", "Policy", "decide_auto", "decide_plan", "decide_scripted", "decide_static",
           "make_policy", "starved_components"]
