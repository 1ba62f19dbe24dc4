"""Errors of the control plane. Every message names the rank, host, epoch or path involved."""

from __future__ import annotations

from slurm_rl.errors import ControlError, WaitTimeout

__all__ = ["AckTimeout", "ControlError", "DeadRankError", "EpochOrderError", "FencedEpochError", "LeaseHeldError",
           "TornFileError", "UnsafePathError", "WaitTimeout"]


class AckTimeout(ControlError, WaitTimeout):
    """Not every rank acknowledged an epoch in time."""


class DeadRankError(ControlError):
    """A rank's heartbeat is older than the allowed timeout (or never appeared)."""


class FencedEpochError(ControlError):
    """An epoch (or a publish attempt) carries a coordinator generation that is no longer current."""


class LeaseHeldError(ControlError):
    """Another coordinator holds the lease."""


class TornFileError(ControlError, ValueError):
    """A control file exists but does not hold a complete, valid JSON document."""


class EpochOrderError(ControlError, ValueError):
    """An epoch would break dense numbering or already exists."""


class UnsafePathError(ControlError, ValueError):
    """A path read from a file is absolute, contains '..' or leaves its root."""
