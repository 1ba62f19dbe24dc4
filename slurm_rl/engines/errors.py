"""Errors of the engines (rollout, actor, inference, weight sync, parking); all are
:class:`~slurm_rl.errors.EngineError`. Classes tied to one module live there
(``WeightSyncError``, ``ParkedError``, ``GroupTimeoutError``, ...) and subclass these."""

from __future__ import annotations

from slurm_rl.errors import EngineError, WaitTimeout

__all__ = ["EngineError", "EngineStateError", "ReshardError", "WaitTimeout"]


class EngineStateError(EngineError, RuntimeError):
    """An engine call made in a state that does not allow it (released, batch full, not parked,
    no process group); names the engine and the call."""


class ReshardError(EngineError, RuntimeError):
    """The actor state moved by a reshard does not fit its destination (names the rank and sizes)."""
