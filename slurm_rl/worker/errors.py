"""Errors of the rank-side protocol; all are :class:`~slurm_rl.errors.WorkerError`. Classes tied to
one module live there (``CollectiveError`` in protocol, ``GroupFailed`` in pool_gate,
``RunStopped`` in runtime)."""

from __future__ import annotations

from slurm_rl.control.status import CoordinatorStatus
from slurm_rl.errors import WaitTimeout, WorkerError

__all__ = ["CoordinatorFailed", "DynamicSamplingExhausted", "NoProgressTimeout", "ProtocolError", "WorkerError"]


class CoordinatorFailed(WorkerError, RuntimeError):
    """The coordinator failed (its status says so) or its process is gone for good; the rank stops."""

    @classmethod
    def check(cls, status: CoordinatorStatus | None, who: str, when: str = "") -> None:
        """Raise when ``status`` (the coordinator status, None if absent) records a failure;
        ``who`` names the rank that stops, ``when`` (e.g. " in iteration 3") where it stops."""
        if status is not None and status.failed:
            raise cls(f"coordinator failed: {status.error}; {who} stops{when}")


class ProtocolError(WorkerError, RuntimeError):
    """A rank reached a state the protocol rules out (work left over or unfinished, a role
    without its engine); names the rank and the iteration."""


class DynamicSamplingExhausted(WorkerError, RuntimeError):
    """``algorithm.filter_groups.max_num_gen_batches`` generation batches kept too few groups (verl
    raises too); names the iteration, the groups kept and needed, and the metric."""


class NoProgressTimeout(WorkerError, WaitTimeout):
    """A rank made no progress within ``runtime.wait_timeout_s`` (names what it was waiting for)."""
