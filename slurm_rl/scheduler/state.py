"""What a scheduling policy sees (``SchedState``) and what it returns (``Decision``).

Frozen dataclasses, no I/O. The live coordinator builds a ``SchedState`` from progress files,
the simulator from its event model; both call the same policy functions on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from slurm_rl.config import PHASES
from slurm_rl.placement import COMPONENTS
from slurm_rl.scheduler import defaults
from slurm_rl.scheduler.history import History
from slurm_rl.rules import valid_dp_sizes  # noqa: F401  (the rule lives below the config; re-exported here)

Ranks = tuple[int, ...]
RankMap = dict[str, Ranks]
"""Component -> sorted rank tuple (the scheduler's plain view; :class:`slurm_rl.placement.Placement`
is the full parsed placement)."""

#: Phases of one iteration, in order. ``start``: nothing generated yet; ``rollout``: samples are
#: being generated, the actor has not trained yet; ``train``: the actor has started its mini-batches;
#: ``end``: the actor finished every mini-batch of the iteration.

#: When a decision is applied. ``now``: at the next generation chunk / inference batch (rollout and
#: inference changes only); ``minibatch``: at the actor's next mini-batch boundary (the actor's
#: ranks change); ``iteration``: before the next iteration starts (return to the initial placement).
BOUNDARIES = ("now", "minibatch", "iteration")


def normalize_placement(placement: Mapping[str, Sequence[int]]) -> RankMap:
    """Sorted rank tuples for every component (missing components get ``()``)."""
    out: RankMap = {c: () for c in COMPONENTS}
    for comp, ranks in placement.items():
        out[comp] = tuple(sorted(int(r) for r in ranks))
    return out


@dataclass(frozen=True)
class ScriptedSwitch:
    """One step of the ``scripted`` policy: at ``at_iteration`` (``None``: every iteration) and
    ``at_phase``, switch to ``placement``; in phase ``rollout`` only once ``at_rollout_fraction``
    of the iteration's samples are finished. ``actor_tp``: the actor's tensor-parallel size from
    then on (``None``: keep the size in force)."""

    at_phase: str
    placement: Mapping[str, Ranks]
    at_iteration: int | None = None
    at_rollout_fraction: float = 0.0
    actor_tp: int | None = None

    def __post_init__(self) -> None:
        if self.at_phase not in PHASES:
            raise ValueError(f"scheduler.script.at_phase: got {self.at_phase!r}, allowed {PHASES}")
        if not 0.0 <= self.at_rollout_fraction < 1.0 or (self.at_rollout_fraction and self.at_phase != "rollout"):
            raise ValueError(f"scheduler.script.at_rollout_fraction: got {self.at_rollout_fraction!r}, "
                             "allowed a number in [0, 1), non-zero only with at_phase rollout")
        if self.actor_tp is not None and (not isinstance(self.actor_tp, int) or self.actor_tp < 1):
            raise ValueError(f"scheduler.script.actor_tp: got {self.actor_tp!r}, allowed a positive int or None")
        object.__setattr__(self, "placement", normalize_placement(self.placement))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ScriptedSwitch":
        """Build from ``{at_iteration, at_phase, at_rollout_fraction, placement, actor_tp}`` (the config form)."""
        unknown = set(d) - {"at_iteration", "at_phase", "at_rollout_fraction", "placement", "actor_tp"}
        if unknown:
            raise ValueError(f"scheduler.script: unknown keys {sorted(unknown)}")
        return cls(at_phase=str(d.get("at_phase", "start")), placement=d["placement"],
                   at_iteration=None if d.get("at_iteration") is None else int(d["at_iteration"]),
                   at_rollout_fraction=float(d.get("at_rollout_fraction", 0.0)),
                   actor_tp=None if d.get("actor_tp") is None else int(d["actor_tp"]))


@dataclass(frozen=True)
class PolicyConfig:
    """Knobs of the policies; defaults come from ``scheduler.defaults``.

    ``actor_ranks_per_instance`` is the actor's initial tensor-parallel size; ``actor_tp_choices``
    the sizes a policy may switch it to (empty: only the initial one). ``ranks_per_node``: ranks
    per node when rank ``r`` lives on node ``r // ranks_per_node``; ``rank_nodes``: the node of
    each rank otherwise (it wins when given). With neither, TP groups are not checked for nodes."""

    max_running_requests: int = defaults.MAX_RUNNING_REQUESTS
    rollout_ranks_per_instance: int = defaults.RANKS_PER_INSTANCE
    actor_ranks_per_instance: int = defaults.RANKS_PER_INSTANCE
    pre_process_threshold: float = defaults.PRE_PROCESS_THRESHOLD
    pre_process_min_finished: float = defaults.PRE_PROCESS_MIN_FINISHED
    use_pre_process_policy: bool = defaults.USE_PRE_PROCESS_POLICY
    use_wait_before_last_iter_policy: bool = defaults.USE_WAIT_BEFORE_LAST_ITER_POLICY
    script: tuple[ScriptedSwitch, ...] = ()
    ranks_per_node: int | None = None
    actor_tp_choices: tuple[int, ...] = ()
    rank_nodes: tuple[int, ...] = ()
    # ``plan`` may run an iteration collocated (every component on every rank, time-sliced) where its
    # measured iterations say that is faster; ``phase_switch_s``: seconds a shared rank takes to park the actor's
    # state between phases, or to bring it back (0: it stays on the device)
    time_slicing: bool = False
    phase_switch_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("max_running_requests", "rollout_ranks_per_instance",
                     "actor_ranks_per_instance"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"scheduler.{name}: got {value!r}, expected a positive integer")
        if self.ranks_per_node is not None and (not isinstance(self.ranks_per_node, int) or self.ranks_per_node <= 0):
            raise ValueError(f"PolicyConfig.ranks_per_node: got {self.ranks_per_node!r}, expected a positive integer or None")
        choices = tuple(sorted(set(self.actor_tp_choices)))
        if any(not isinstance(tp, int) or tp <= 0 for tp in choices) or (
                choices and self.actor_ranks_per_instance not in choices):
            raise ValueError(f"actor.tensor_parallel_choices: got {list(self.actor_tp_choices)!r}, expected "
                             f"positive integers that include {self.actor_ranks_per_instance} (or none)")
        object.__setattr__(self, "actor_tp_choices", choices)
        object.__setattr__(self, "rank_nodes", tuple(self.rank_nodes))
        for name in ("pre_process_threshold", "pre_process_min_finished"):
            value = getattr(self, name)
            if not 0.0 <= float(value) < 1.0:
                raise ValueError(f"scheduler.{name}: got {value!r}, expected 0 <= x < 1")
        object.__setattr__(self, "script", tuple(
            s if isinstance(s, ScriptedSwitch) else ScriptedSwitch.from_dict(s) for s in self.script))

    @property
    def tp_choices(self) -> tuple[int, ...]:
        """The actor's tensor-parallel sizes a policy may use, ascending."""
        return self.actor_tp_choices or (self.actor_ranks_per_instance,)

    def node_of(self, rank: int) -> int | None:
        """Node of ``rank`` (None when the layout is not known: no node checks)."""
        if self.rank_nodes:
            return self.rank_nodes[rank] if 0 <= rank < len(self.rank_nodes) else None
        return None if self.ranks_per_node is None else rank // self.ranks_per_node


@dataclass(frozen=True)
class RolloutProgress:
    """Rollout requests (one request = one response) of the current iteration."""

    running: int
    pending: int
    finished: int
    total: int

    @property
    def outstanding(self) -> int:
        """Requests not finished yet (running or not started)."""
        return self.running + self.pending


@dataclass(frozen=True)
class InferenceProgress:
    """Samples of the current iteration that went through inference (reference logprobs).
    A run without an inference component reports ``done == total == 0``."""

    done: int
    total: int

    @property
    def finished(self) -> bool:
        return self.done >= self.total


@dataclass(frozen=True)
class ActorProgress:
    """Actor training progress of the current iteration; ``busy`` while inside a mini-batch.
    ``state_dp``: DP size of the ranks holding the actor's state (a held-back actor keeps it
    there, so coming back onto them moves nothing); None when not known. ``samples_ready``:
    samples in complete groups through inference (the data its mini-batches are cut from); None
    when not known apart (then ``InferenceProgress.done``: inference scores complete groups)."""

    samples_done: int
    samples_total: int
    minibatches_done: int
    minibatches_total: int
    busy: bool = False
    state_dp: int | None = None
    samples_ready: int | None = None


@dataclass(frozen=True)
class BatchSpec:
    """Batch sizes fixed by the config (``samples_per_iteration = rollout_batch_size * group_size``)."""

    global_batch_size: int
    micro_batch_size: int
    samples_per_iteration: int
    ppo_epochs: int = 1  # passes over the iteration's mini-batches (actor.ppo_epochs)

    def __post_init__(self) -> None:
        if self.samples_per_iteration % self.global_batch_size:
            raise ValueError(
                f"train.global_batch_size: {self.global_batch_size} does not divide the "
                f"{self.samples_per_iteration} samples of an iteration "
                "(rollout_batch_size * group_size)")
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"train.micro_batch_size: {self.micro_batch_size} does not divide "
                f"global_batch_size={self.global_batch_size}")

    @property
    def minibatches_per_epoch(self) -> int:
        """Mini-batches of one pass over the iteration's samples."""
        return self.samples_per_iteration // self.global_batch_size

    @property
    def minibatches_per_iteration(self) -> int:
        """Optimizer steps of an iteration: every pass (``ppo_epochs``) over its mini-batches."""
        return self.minibatches_per_epoch * self.ppo_epochs


def derive_phase(rollout: RolloutProgress, actor: ActorProgress) -> str:
    """The iteration phase implied by progress (see ``PHASES``)."""
    if actor.minibatches_done >= actor.minibatches_total:
        return "end"
    if actor.minibatches_done > 0 or actor.busy:
        return "train"
    if rollout.finished == 0 and rollout.running == 0:
        return "start"
    return "rollout"


@dataclass(frozen=True)
class SchedState:
    """Everything a policy may look at. ``initial`` is the configured placement, ``current`` the
    placement of the latest published epoch; both are normalized to sorted rank tuples.
    ``elapsed_s`` and ``history`` are filled by the coordinator and the simulator alike.
    ``actor_tp``: the actor's tensor-parallel size in force (``None``: the initial one,
    ``cfg.actor_ranks_per_instance``)."""

    iteration: int
    num_iterations: int
    phase: str
    world_ranks: Ranks
    initial: RankMap
    current: RankMap
    rollout: RolloutProgress
    inference: InferenceProgress
    actor: ActorProgress
    batch: BatchSpec
    cfg: PolicyConfig = field(default_factory=PolicyConfig)
    elapsed_s: float = 0.0  # seconds since the iteration was released
    history: History | None = None  # the run's own measurements (``plan``'s forecast reads them)
    actor_tp: int | None = None

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"SchedState.phase: got {self.phase!r}, allowed {PHASES}")
        if self.actor_tp is None:
            object.__setattr__(self, "actor_tp", self.cfg.actor_ranks_per_instance)
        object.__setattr__(self, "world_ranks", tuple(sorted(self.world_ranks)))
        object.__setattr__(self, "initial", normalize_placement(self.initial))
        object.__setattr__(self, "current", normalize_placement(self.current))

    @property
    def tp(self) -> int:
        """The actor's tensor-parallel size in force."""
        return int(self.actor_tp or self.cfg.actor_ranks_per_instance)

    def actor_valid_dp_sizes(self) -> list[int]:
        """Valid actor DP sizes (at the tensor-parallel size in force) that fit in the allocation."""
        max_dp = len(self.world_ranks) // self.tp
        return valid_dp_sizes(self.batch.global_batch_size, self.batch.micro_batch_size, max_dp)


@dataclass(frozen=True)
class Decision:
    """A new placement, why, which rollout ranks must migrate their running requests out, and
    at which boundary it applies (see ``BOUNDARIES``). ``actor_tp``: the actor's tensor-parallel
    size from then on (``None``: keep the size in force). ``forecast_end_s``: seconds into the
    iteration at which the policy expects it to end with this decision (``None``: no forecast), so
    that its forecasts can be checked against the iteration's actual end."""

    placement: RankMap
    reason: str
    migrate_from: Ranks = ()
    boundary: str = "now"
    actor_tp: int | None = None
    forecast_end_s: float | None = None

    def __post_init__(self) -> None:
        if self.boundary not in BOUNDARIES:
            raise ValueError(f"Decision.boundary: got {self.boundary!r}, allowed {BOUNDARIES}")
        if self.actor_tp is not None and (not isinstance(self.actor_tp, int) or self.actor_tp < 1):
            raise ValueError(f"Decision.actor_tp: got {self.actor_tp!r}, allowed a positive int or None")
        object.__setattr__(self, "placement", normalize_placement(self.placement))
        object.__setattr__(self, "migrate_from", tuple(sorted(self.migrate_from)))

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form (for epoch ``reason`` fields and logs); ``actor_tp`` only when set."""
        doc: dict[str, Any] = {"placement": {c: list(r) for c, r in self.placement.items()},
                               "reason": self.reason, "migrate_from": list(self.migrate_from),
                               "boundary": self.boundary}
        if self.actor_tp is not None:
            doc["actor_tp"] = self.actor_tp
        if self.forecast_end_s is not None:
            doc["forecast_end_s"] = self.forecast_end_s
        return doc


def instances_needed(outstanding: int, max_running_requests: int) -> int:
    """Rollout instances that suffice for ``outstanding`` requests (RLinf: ceil(running / max))."""
    return math.ceil(outstanding / max_running_requests)
