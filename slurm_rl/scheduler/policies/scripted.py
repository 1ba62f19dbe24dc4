"""``scripted``: switch to fixed placements at given (iteration, phase) points."""

from __future__ import annotations

from typing import Sequence

from slurm_rl.scheduler.placement_ops import with_actor_tp
from slurm_rl.scheduler.state import Decision, SchedState, ScriptedSwitch


def decide_scripted(state: SchedState, steps: Sequence[ScriptedSwitch]) -> Decision | None:
    """Apply the last step matching the state's iteration and phase, if it changes anything.

    A step with ``at_iteration=None`` matches every iteration; a rollout-phase step with
    ``at_rollout_fraction`` matches once that fraction of samples is finished (the highest such
    fraction wins). Level-triggered: calling again after the switch returns ``None``. A step's
    ``actor_tp`` goes into the decision (a step may change only the tensor-parallel size); a step
    without one keeps the size in force where it suits the step's actor ranks.
    """
    match: ScriptedSwitch | None = None
    finished = state.rollout.finished / max(state.rollout.total, 1)
    for step in steps:
        if (step.at_phase == state.phase and step.at_iteration in (None, state.iteration)
                and finished >= step.at_rollout_fraction
                and (match is None or step.at_rollout_fraction >= match.at_rollout_fraction)):
            match = step
    new_tp = match.actor_tp if match is not None and match.actor_tp not in (None, state.tp) else None
    if match is None or (dict(match.placement) == state.current and new_tp is None):
        return None
    old_rollout = set(state.current["rollout"])
    migrate = tuple(r for r in old_rollout if r not in set(match.placement["rollout"]))
    actor_changes = match.placement["actor"] != state.current["actor"] or new_tp is not None
    boundary = "iteration" if state.phase in ("start", "end") else (
        "minibatch" if actor_changes else "now")
    reason = f"script: iteration {state.iteration} phase {state.phase}"
    if new_tp is not None:
        reason += f"; actor tensor parallel {state.tp} -> {new_tp}"
    return with_actor_tp(state, Decision(placement=dict(match.placement), reason=reason,
                                         migrate_from=migrate if state.rollout.outstanding else (),
                                         boundary=boundary, actor_tp=match.actor_tp))
