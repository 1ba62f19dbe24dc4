"""``static``: the disaggregated baseline; the placement never changes."""

from __future__ import annotations

from slurm_rl.scheduler.state import Decision, SchedState


def decide_static(state: SchedState) -> Decision | None:
    """Never change the placement."""
    del state
    return None
