"""Reward functions for RL post-training: the built-ins (``gsm8k``, ``math``, ``exact``), user
rewards named ``package.module:function``, and :class:`RewardRunner`, which scores batches in
worker processes with a per-sample timeout."""

from slurm_rl.rewards.builtin import BUILTIN, RewardFn
from slurm_rl.rewards.errors import RewardError, RewardTimeout
from slurm_rl.rewards.loader import resolve_reward, reward_problems
from slurm_rl.rewards.runner import RewardResult, RewardRunner, RewardSample

__all__ = ["BUILTIN", "RewardError", "RewardFn", "RewardResult", "RewardRunner", "RewardSample",
           "RewardTimeout", "resolve_reward", "reward_problems"]
