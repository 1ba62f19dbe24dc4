"""Errors of the reward functions: a reward that raised, returned no real number, timed out, or
whose worker process died. All are :class:`~slurm_rl.errors.EngineError` (and ``RuntimeError``);
a timeout is also a :class:`~slurm_rl.errors.WaitTimeout` (``TimeoutError``).

A bad ``reward.name`` / ``reward.fn`` is bad input, reported as a
:class:`~slurm_rl.placement.ConfigError` by :func:`slurm_rl.rewards.loader.resolve_reward`."""

from __future__ import annotations

from slurm_rl.errors import EngineError, WaitTimeout

__all__ = ["RewardError", "RewardTimeout"]


class RewardError(EngineError, RuntimeError):
    """A reward function failed on a sample; names the function (``module:function`` or the
    built-in name), the sample id and the exception, the bad value or the timeout.

    ``reward``, ``sample_id`` and ``kind`` (``"error"``, ``"value"``, ``"timeout"``, ``"worker"``,
    ``"pool"``) say what failed; ``sample_id`` is None when no one sample is to blame."""

    def __init__(self, message: str, *, reward: str | None = None, sample_id: int | None = None,
                 kind: str = "error") -> None:
        super().__init__(message)
        self.reward = reward
        self.sample_id = sample_id
        self.kind = kind


class RewardTimeout(RewardError, WaitTimeout):
    """A reward function ran past ``reward.timeout_s`` on a sample: its worker was killed (or, scored in the
    rank's own process with ``reward.workers: 0``, it returned too late)."""
