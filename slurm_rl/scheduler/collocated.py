"""The collocated mode in the simulator: every GPU serves every component, one phase at a time.

A collocated run (RLinf's ``actor,rollout,inference: all``) is a static placement whose ranks
time-slice their components: all of them decode, then all of them score once the rollout has ended,
then all of them train once inference has ended (``worker/protocol.py``). The simulator models it as
a schedule of whole-allocation phases: :func:`decide_collocated` is a pure function of the progress,
like a policy, and each switch costs the control plane's latency plus the actor's offload or onload
(``CostModel.offload_seconds``, where ``actor.offload_*`` parks it). The actor's state never moves
between ranks (each holds its DP share all along), so no phase change reshards it.
"""

from __future__ import annotations

from slurm_rl.scheduler.state import Decision, SchedState

MODE = "collocated"


def collocated_phase(state: SchedState) -> str:
    """The component the whole allocation serves now: ``rollout`` until every response is generated,
    then ``inference`` (where the run has one) until every sample is scored, then ``actor``."""
    if state.rollout.outstanding > 0:
        return "rollout"
    if state.initial.get("inference") and not state.inference.finished:
        return "inference"
    if state.actor.minibatches_done < state.actor.minibatches_total:
        return "actor"
    return "rollout"  # the iteration is over: the next one decodes first


def decide_collocated(state: SchedState) -> Decision | None:
    """Give every rank to the component of :func:`collocated_phase` (None: it already has them)."""
    phase = collocated_phase(state)
    want = {c: (state.world_ranks if c == phase else ()) for c in state.current}
    if want == dict(state.current):
        return None
    return Decision(want, reason=f"collocated: every rank serves {phase}")
