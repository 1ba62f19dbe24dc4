"""The compute behind the iteration protocol: a few narrow calls, two implementations.

:mod:`slurm_rl.worker.protocol` runs the iteration (claims, migration, inference shares, the
mini-batch cutter and its epoch stamps, actor followers, the boundary handshake, progress) once
for every device. What differs between devices is only what these calls do:
:class:`~slurm_rl.worker.emulated_compute.EmulatedCompute` times them with the calibrated cost
model (no torch), :class:`~slurm_rl.worker.real_compute.RealCompute` runs the engines
(megatron-core actor, hf/vLLM rollout, reference scorer) over torch.distributed.

Time: every call that does work returns the wall time at which its result is ready. The real
engines block and return "now"; the cost model returns a time in the future and the protocol
holds the result until then, so one event loop serves both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

import pyarrow as pa

from slurm_rl.config import Config
from slurm_rl.control.epochs import Epoch
from slurm_rl.control.paths import RunPaths
from slurm_rl.launch.rank_env import RankInfo


class Decoder(Protocol):
    """One rank's rollout engine for one iteration: requests in, finished rollouts out."""

    def free_slots(self) -> int:
        """Requests it can admit now."""

    def held(self) -> int:
        """Admitted requests not finished yet."""

    def admit(self, requests: pa.Table, now: float) -> None:
        """Start ``requests`` (PENDING rows, possibly with partial responses)."""

    def advance(self, now: float) -> pa.Table | None:
        """Decode up to ``now``; the requests finished meanwhile as ROLLOUTS rows (or None)."""

    def next_event_at(self) -> float | None:
        """When the next request finishes (None: nothing admitted)."""

    def step_seconds(self) -> float | None:
        """Seconds per decode step at the current load (None: not decoding, or not measured)."""

    def evict(self, now: float, epoch: int) -> tuple[pa.Table | None, pa.Table | None]:
        """Stop every admitted request: (ROLLOUTS rows finished by ``now``, the others as PENDING
        rows with their partial responses)."""

    def land(self, version: int, now: float) -> None:
        """Weights of ``version`` landed at ``now`` (partial rollout): the requests running on say so when they
        finish (``weight_version_last``); those finished before keep the old version."""

    @property
    def lands_between_tokens(self) -> bool:
        """Whether weights land inside :meth:`advance` (its ``landing`` hook at each token boundary), so that
        requests it holds must not be landed on from outside it."""


class Compute(Protocol):
    """What a rank computes; see the module docstring."""

    def on_roles(self, old: Epoch | None, new: Epoch) -> dict[str, Any]:
        """Build, park or wake the engines of the roles ``new`` gives this rank; figures for the ack."""

    def requests(self, k: int, batch: int = 0, position: int | None = None) -> pa.Table:
        """The requests of generation batch ``batch`` of iteration ``k`` (PENDING rows; the same table
        on every rank), its first prompt at stream position ``position`` (None: ``k *
        train.rollout_batch_size``); batches after the first only under ``algorithm.filter_groups``."""

    def decoder(self, k: int, landing: Callable[[], None] | None = None) -> Decoder:
        """This rank's rollout engine in iteration ``k`` (weights of version ``k``); the requests it takes may be of
        iterations ahead of ``k`` (an asynchronous run): each row's sample id says which. ``landing``: called at
        each token boundary of a generation where the engine stops there (partial rollout): it may land the next
        weights (:meth:`land_weights`)."""

    def reward(self, k: int, rollouts: pa.Table, requests: pa.Table) -> pa.Table:
        """``rollouts`` with their ``reward`` column filled (ROLLOUTS rows), scored in this rank's reward worker
        processes; ``requests``: their requests (PENDING rows, the same order: the answers).
        Called by a reward rank where the reward is placed apart from the rollout (``placement.reward_ranks``);
        the rollout then leaves the column NaN."""

    def score(self, k: int, rollouts: pa.Table, now: float, share_ranks: int) -> tuple[pa.Table, float]:
        """Reference logprobs of ``rollouts``: (INFERENCE rows, ready at). Called by an inference
        rank, or by the actor's leader where no inference component is placed and a KL is weighed."""

    def reshard(self, old: list[int], new: list[int], epoch: int, old_tp: int = 1, new_tp: int = 1
                ) -> dict[str, Any]:
        """Move the actor's state from ranks ``old`` (TP ``old_tp``) to ``new`` (TP ``new_tp``) in
        place (called by their union)."""

    def sync_weights(self, k: int, src: int, ranks: list[int], gather: list[int] | None = None,
                     in_place: bool = False, sharded: list[list[int]] | None = None) -> dict[str, Any]:
        """Weights of version ``k`` from actor rank ``src`` to the rollout ranks (called by ``ranks`` and
        by ``gather``: the TP group of ``src``, whose shards ``src`` gathers first); ``in_place``: a
        collocated actor rank's engines take its own full replica instead (no collective); ``sharded``: the
        ranks of TP engines (in TP order) that ``src`` sends only their shards, point to point (called by them
        too)."""

    def land_weights(self, version: int, src: int, ranks: list[int], gather: list[int]) -> dict[str, Any]:
        """Weights of ``version`` from actor rank ``src`` to the rollout engines of ``ranks`` while they decode
        (partial rollout; called by ``ranks`` and by ``gather``, the TP group of ``src``): each engine stages them and
        loads them at its next token boundary, or at once where it is not generating."""

    def switch_phase(self, phase: str) -> dict[str, Any]:
        """A rank the actor shares with rollout or inference enters ``phase`` of an iteration:
        ``generate`` (the rollout engine awake; the actor's state parked in host memory where
        ``actor.offload_*`` asks) or ``train`` (the rollout engine released, the actor's state back);
        figures (``bytes`` moved, ``seconds``)."""

    def predict_train_seconds(self, tokens: int, old: list[int], new: list[int]) -> float | None:
        """Seconds a mini-batch takes (reshard ``old`` -> ``new`` included), when known in advance."""

    def predict_switch_seconds(self) -> float | None:
        """Seconds a shared rank's switch into training takes (the actor's state back in place), when
        known in advance: the first mini-batch of an iteration on shared ranks waits for it."""

    def train(self, k: int, index: int, batch: pa.Table, ranks: list[int], ready_at: float | None
              ) -> tuple[float, dict[str, Any]]:
        """Train mini-batch ``index`` on actor ranks ``ranks`` (called by each of them):
        (ready at, step figures such as loss and lr)."""

    def sync_critic(self, k: int, src: int, ranks: list[int], gather: list[int]) -> dict[str, Any]:
        """The critic on ranks of its own: its weights of version ``k`` from its first rank ``src`` to
        the value scorers among ``ranks`` (called by each of them, and by ``gather``: the TP group of
        ``src``, which gathers the full critic first); figures ``seconds`` and ``bytes``."""

    def train_critic(self, k: int, index: int, batch: pa.Table, ranks: list[int]) -> tuple[float, dict[str, Any]]:
        """The critic on ranks of its own: train it on mini-batch ``index`` over ``ranks`` (called by each
        of them): (ready at, ``critic/*`` step figures)."""

    def park(self) -> dict[str, Any]:
        """Warm switch out: move this rank's engine state (actor params, optimizer state, rollout and
        reference weights) to host memory, keeping the engine objects and process groups;
        figures ``seconds`` and ``bytes``."""

    def unpark(self) -> dict[str, Any]:
        """Warm switch in: bring the parked state back in place; figures ``seconds`` and ``bytes``."""

    def evaluate(self, k: int) -> dict[str, Any] | None:
        """Validation figures (``val/*``) of the weights of version ``k`` this rollout rank holds;
        None when the backend does not evaluate."""
        ...

    def save_state(self, directory: Path, iteration: int) -> None:
        """Write this rank's share of the run checkpoint taken at the gate of ``iteration`` into
        ``directory`` (collective over the actor's ranks: its DP rank 0 writes ``directory/actor``; the
        critic's likewise)."""

    def load_state(self, directory: Path) -> None:
        """Load a run checkpoint's state (the actor ranks of the config's placement read it)."""

    def close(self, finished: bool = True) -> None:
        """Free what the engines hold; ``finished``: the run is complete (save the final actor)."""


def make_compute(cfg: Config, info: RankInfo, paths: RunPaths) -> Compute:
    """The compute of ``runtime.device`` (the real engines and torch are imported only for them)."""
    if cfg.runtime.device == "emulated":
        from slurm_rl.worker.emulated_compute import EmulatedCompute

        return EmulatedCompute(cfg, info)
    from slurm_rl.worker.real_compute import RealCompute

    return RealCompute(cfg, info, paths)
