"""Errors of the control plane. Every message names the rank, host, epoch or path involved."""

from __future__ import annotations


class ControlError(Exception):
    """Base class of all control-plane errors."""


class WaitTimeout(ControlError, TimeoutError):
    """A bounded wait on a control file ran out of time."""


class AckTimeout(WaitTimeout):
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
