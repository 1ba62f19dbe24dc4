"""Ranks that serve several components in the simulator: each shared rank time-slices its components.

A collocated run (RLinf's ``actor,rollout,inference: all``) or a hybrid one (``actor,rollout: 0-5``,
``inference: 6-7``) is an epoch whose shared ranks serve one of their components at a time (the configured
placement under ``static``, or an iteration that ``plan`` runs collocated),
as the live protocol runs them (``worker/protocol.py``): a rank decodes while the iteration's rollout
has requests left, scores once it has ended (a rank without rollout scores as samples arrive), and
trains once every sample is in (while any actor rank is shared, the first mini-batch waits for the
whole batch). A rank that serves one component keeps it. :func:`time_slice` is a pure function
of the progress and the shared epoch in force (the simulator calls it where the live ranks switch phases
on their own); each move of the actor costs the control plane's latency plus its
offload or onload (``CostModel.offload_seconds``, where ``actor.offload_*`` parks it). Within a shared
epoch the actor's state never moves between ranks (each actor rank holds its DP share all along), so no
phase change reshards it.
"""

from __future__ import annotations

from typing import Mapping

from slurm_rl.placement import COMPONENTS
from slurm_rl.rules import actor_holds_every_rank  # noqa: F401  (re-exported; the config checks it too)
from slurm_rl.scheduler.state import Decision, RankMap, SchedState

MODE = "collocated"
HYBRID = "hybrid"


def rank_components(placement: Mapping[str, tuple[int, ...]], ranks: tuple[int, ...]) -> dict[int, tuple[str, ...]]:
    """Each rank's components in pipeline order (``()``: a rank that serves none)."""
    return {r: tuple(c for c in COMPONENTS if r in placement.get(c, ())) for r in ranks}


def on_every_rank(placement: Mapping[str, tuple[int, ...]], ranks: tuple[int, ...]) -> RankMap:
    """Every component of ``placement`` that holds ranks on all of ``ranks`` (co-location)."""
    return {c: (tuple(ranks) if held else ()) for c, held in placement.items()}


def epoch_zero(configured: Mapping[str, tuple[int, ...]], ranks: tuple[int, ...], time_slicing: bool) -> RankMap:
    """The placement a run starts on: ``configured``, or where ``plan`` time-slices (its first iteration runs
    collocated) every configured component on every rank, so that the actor is built there and does not
    reshard onto every rank when it first trains (the live run and the simulator both start so)."""
    return on_every_rank(configured, ranks) if time_slicing else dict(configured)


def shared_ranks(placement: Mapping[str, tuple[int, ...]]) -> frozenset[int]:
    """The ranks of ``placement`` that serve several components (they time-slice them)."""
    seen: set[int] = set()
    shared: set[int] = set()
    for ranks in placement.values():
        shared.update(seen.intersection(ranks))
        seen.update(ranks)
    return frozenset(shared)


def shares_ranks(placement: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether some rank of ``placement`` serves several components (it time-slices them)."""
    return bool(shared_ranks(placement))


def phase_of(comps: tuple[str, ...], state: SchedState, actor_waits: bool, has_inference: bool) -> str | None:
    """The component a rank serving ``comps`` serves now (None: it waits). ``actor_waits``: the actor
    trains only once every sample is in (some actor rank is shared); ``has_inference``: the epoch places
    inference."""
    rollout_left = state.rollout.outstanding > 0
    inference_left = has_inference and not state.inference.finished
    if len(comps) == 1:
        if comps == ("actor",) and actor_waits and (rollout_left or inference_left):
            return None
        return comps[0]
    if "rollout" in comps and rollout_left:
        return "rollout"
    if "inference" in comps and inference_left:
        return "inference"  # a rank that also decodes gets here only once the rollout has ended
    if "actor" in comps and not (rollout_left or inference_left) \
            and state.actor.minibatches_done < state.actor.minibatches_total:
        return "actor"
    return "rollout" if "rollout" in comps else None  # the iteration is over: the next one decodes first


def time_sliced_placement(state: SchedState, epoch: RankMap) -> RankMap:
    """The placement of this moment under the shared ``epoch``: every rank given to the component of
    :func:`phase_of`."""
    comps = rank_components(epoch, state.world_ranks)
    actor_waits = any("actor" in cs and len(cs) > 1 for cs in comps.values())
    has_inference = bool(epoch.get("inference"))
    want: dict[str, list[int]] = {c: [] for c in COMPONENTS}
    for rank, cs in comps.items():
        phase = phase_of(cs, state, actor_waits, has_inference) if cs else None
        if phase is not None:
            want[phase].append(rank)
    return {c: tuple(r) for c, r in want.items()}


def time_slice(state: SchedState, epoch: RankMap, now: RankMap) -> Decision | None:
    """Move every shared rank of ``epoch`` to its component of the moment (None: ``now`` is it)."""
    want = time_sliced_placement(state, epoch)
    if want == dict(now):
        return None
    serving = ", ".join(f"{c} {len(r)}" for c, r in want.items() if r)
    return Decision(want, reason=f"time-sliced: {serving or 'every rank waits'}")
