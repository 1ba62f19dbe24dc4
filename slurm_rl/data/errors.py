"""Errors raised by the data plane. Messages name the path, iteration, stage and ranks involved."""

from __future__ import annotations

from slurm_rl.errors import DataPlaneError, WaitTimeout

__all__ = ["CorruptShardError", "DataPlaneError", "InvalidManifestError", "ManifestTimeout"]


class InvalidManifestError(DataPlaneError):
    """A manifest (or pending ticket) is malformed or names a file it must not name."""


class CorruptShardError(DataPlaneError):
    """A shard listed in a manifest is missing, truncated, or fails its checksum.

    The shard is never handed to the caller.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"corrupt shard {path}: {reason}")
        self.path = path
        self.reason = reason


class ManifestTimeout(DataPlaneError, WaitTimeout):
    """Waiting for producers of a stage made no progress within the timeout."""

    def __init__(self, message: str, *, iteration: int, stage: str, missing_ranks: list[int]) -> None:
        super().__init__(message)
        self.iteration = iteration
        self.stage = stage
        self.missing_ranks = missing_ranks
