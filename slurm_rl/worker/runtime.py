"""The per-rank runtime: poll epochs, apply them at safe points, run the roles, report progress.

A rank's roles at epoch ``e`` are a pure function of the epoch-``e`` file (invariant 3): the rank
reads ``placement[component]["ranks"]`` and nothing else. Epochs are applied only at safe points
(between work units) and at iteration gates, where the rank waits for the coordinator to release
the next iteration (on-policy: iteration ``k+1`` starts after iteration ``k`` is done everywhere).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from slurm_rl.control.acks import write_ack
from slurm_rl.control.epochs import Epoch, EpochWatcher
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.progress import write_progress
from slurm_rl.control.status import CoordinatorStatus, read_coordinator_status
from slurm_rl.errors import WaitTimeout, WorkerError
from slurm_rl.launch.rank_env import RankInfo
from slurm_rl.placement import COMPONENTS
from slurm_rl.worker.errors import CoordinatorFailed



def roles_in(epoch: Epoch, rank: int) -> tuple[str, ...]:
    """Components that include ``rank`` in ``epoch`` (empty: the rank is idle)."""
    return tuple(c for c in COMPONENTS if rank in epoch.placement.get(c, {}).get("ranks", ()))


class Roles(Protocol):
    """What a rank does for its roles: the emulated cost model or the real engines."""

    def transition(self, old: Epoch | None, new: Epoch, rt: "WorkerRuntime") -> dict[str, Any]:
        """Carry out an epoch change (reshard, release, resume); return figures for the ack."""

    def run_iteration(self, iteration: int, rt: "WorkerRuntime") -> None:
        """Do this rank's share of ``iteration`` for its current roles, calling ``rt.safe_point()``."""

    def save_checkpoint(self, directory: Path, iteration: int) -> None:
        """Write this rank's part of the run checkpoint taken at the gate of ``iteration``."""

    def close(self, finished: bool = True) -> None:
        """Free what the roles hold (``finished``: the run is complete, save its final state)."""


class RunStopped(WorkerError):
    """The coordinator stopped the run at an iteration gate (after its checkpoint)."""


@dataclass
class WorkerRuntime:
    """State of one rank: its identity, the epoch in force, and how it reports."""

    info: RankInfo
    paths: RunPaths
    poll_interval_s: float
    wait_timeout_s: float
    num_iterations: int
    roles_impl: Roles
    epoch: Epoch | None = None
    roles: tuple[str, ...] = ()
    iteration: int = -1
    counters: dict[str, Any] = field(default_factory=dict)
    watchdog: Callable[[], None] | None = None  # raises when something this rank depends on died
    at_gate: bool = False  # True while waiting at an iteration gate (every rank is between iterations)
    released_epoch: int | None = None  # the epoch the coordinator released the current iteration with
    first_iteration: int = 0  # a resumed run starts at its checkpoint's gate
    after_epoch: int = -1  # ... and applies the epochs published after its previous incarnation's last

    def __post_init__(self) -> None:
        self._watcher = EpochWatcher(self.paths, start_after=self.after_epoch, poll_interval_s=self.poll_interval_s,
                                     rank=self.info.rank)
        self._gate_iteration = -1
        self._checkpointed: str | None = None  # the checkpoint directory this rank wrote its part of

    # -- epochs ---------------------------------------------------------------------------------
    def _describe(self) -> str:
        return f"rank {self.info.rank} (host {self.info.host})"

    def wait_first_epoch(self) -> None:
        self._wait_until(lambda status: self.epoch is not None, "epoch 0 from the coordinator")

    def apply(self, epoch: Epoch) -> None:
        """Apply one epoch: role change and transition work, then acknowledge it."""
        seen_at = time.time()
        old = self.epoch
        figures = self.roles_impl.transition(old, epoch, self)
        self.epoch = epoch
        self.roles = roles_in(epoch, self.info.rank)
        figures = dict(figures, roles=list(self.roles))
        write_ack(self.paths, epoch.epoch, self.info.rank, self.info.host, seen_at, time.time(), figures)
        if self.at_gate:  # still waiting at the gate: the coordinator must keep counting it there
            self.report("at_gate", gate=self._gate_iteration, checkpointed=self._checkpointed)
        else:
            self.report("applied-epoch")

    def safe_point(self) -> bool:
        """Apply every epoch published since the last poll; True when one was applied."""
        applied = False
        while (epoch := self._watcher.poll_if_due()) is not None:
            self.apply(epoch)
            applied = True
        return applied

    # -- progress -------------------------------------------------------------------------------
    def report(self, state: str, **extra: Any) -> None:
        doc = {
            "rank": self.info.rank,
            "host": self.info.host,
            "state": state,
            "iteration": self.iteration,
            "epoch": self.epoch.epoch if self.epoch else None,
            "roles": list(self.roles),
        }
        doc.update(self.counters)
        doc.update(extra)
        write_progress(self.paths, self.info.rank, doc)

    def check(self) -> CoordinatorStatus | None:
        """Apply due epochs, then raise if what this rank depends on failed (watchdog, coordinator);
        the coordinator status."""
        self.safe_point()
        status = read_coordinator_status(self.paths)
        if self.watchdog is not None:
            self.watchdog()
        CoordinatorFailed.check(status, self._describe())
        return status

    def _wait_until(self, done: Callable[[CoordinatorStatus | None], bool], what: str) -> None:
        """Poll epochs (applying them) until ``done()``; fail on a coordinator failure or timeout."""
        deadline = time.monotonic() + self.wait_timeout_s
        while True:
            status = self.check()
            if done(status):
                return
            if time.monotonic() > deadline:
                raise WaitTimeout(
                    f"{self._describe()} waited {self.wait_timeout_s:.0f}s for {what} "
                    f"(epoch in force: {self.epoch.epoch if self.epoch else None})"
                )
            time.sleep(max(self.poll_interval_s, self._watcher.interval))

    def wait_for(self, done: Callable[[], bool], what: str) -> None:
        """Wait until ``done()`` while applying epochs; a timeout names ``what`` and this rank."""
        self._wait_until(lambda status: done(), what)

    def gate(self, iteration: int) -> None:
        """Wait at the start of ``iteration`` until the coordinator releases it, applying epochs;
        write this rank's part of a checkpoint the coordinator asks for; raise :class:`RunStopped`
        when the coordinator stops the run here."""
        self.report("at_gate", gate=iteration, checkpointed=self._checkpointed)

        def released(status: CoordinatorStatus | None) -> bool:
            if status is None:
                return False
            if status.state == "stopped":
                raise RunStopped(f"{self._describe()}: the coordinator stopped the run at the gate of iteration "
                                 f"{status.stopped_at_iteration} ({(status.stop or {}).get('reason')})")
            request = status.checkpoint_request
            if (status.state == "checkpointing" and request is not None
                    and request.iteration == iteration and request.dir != self._checkpointed):
                self.roles_impl.save_checkpoint(Path(request.dir), iteration)
                self._checkpointed = request.dir
                self.report("at_gate", gate=iteration, checkpointed=self._checkpointed)
            if status.released_iteration is None or status.released_iteration < iteration:
                return False
            self.released_epoch = status.released_epoch
            return True

        self.at_gate, self._gate_iteration = True, iteration
        try:
            self._wait_until(released, f"the coordinator to release iteration {iteration}")
            self.safe_point()
        finally:
            self.at_gate = False

    # -- main loop ------------------------------------------------------------------------------
    def run(self) -> None:
        """All iterations of the run, from the first epoch to the final report."""
        self.wait_first_epoch()
        for iteration in range(self.first_iteration, self.num_iterations):
            self.gate(iteration)
            self.iteration = iteration
            self.counters.clear()  # progress counters are per iteration: none of the last one's may leak
            self.report("working")
            self.roles_impl.run_iteration(iteration, self)
        self.gate(self.num_iterations)
        self.report("finished")
        self.roles_impl.close(finished=True)
