"""Errors of the coordinator, the group scheduler and the simulator; all are
:class:`~slurm_rl.errors.SchedulerError`."""

from __future__ import annotations

from slurm_rl.errors import SchedulerError, WaitTimeout

__all__ = ["CheckpointFailed", "GroupTimeout", "SchedulerError", "SimulationError"]


class SimulationError(SchedulerError, RuntimeError):
    """A simulated run cannot go on (a policy chose an unusable placement, the model stalled or
    ran past its limit); names the time, iteration and state."""


class CheckpointFailed(SchedulerError, RuntimeError):
    """Ranks failed while writing their part of a checkpoint (names the iteration and the ranks)."""


class GroupTimeout(SchedulerError, WaitTimeout):
    """A co-execution group did not finish within ``group.timeout_s`` (names the running jobs)."""
