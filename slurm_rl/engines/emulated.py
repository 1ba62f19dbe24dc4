"""Emulated compute: a calibrated cost model that replaces GPU work by sleeps.

A component holding ``n`` GPUs processes ``T`` tokens in ``T * s_per_token / n**scaling`` seconds,
the same law the simulator uses. A rank doing its share ``t`` of that work therefore sleeps
``t * s_per_token * n**(1 - scaling)``. No torch import: emulated ranks stay a few tens of MB.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

BYTES_PER_PARAM_STATE = 16  # fp32 param + grad + two Adam moments


@dataclass(frozen=True)
class CostModel:
    """Seconds per token of each component on one GPU, and the cost of moving actor state."""

    rollout_s_per_token: float
    inference_s_per_token: float
    actor_s_per_token: float
    scaling: float
    reshard_s_per_gb: float
    model_params: int

    @classmethod
    def from_config(cls, emulated: Mapping[str, Any] | Any) -> "CostModel":
        get: Callable[[str], Any] = (
            emulated.__getitem__ if isinstance(emulated, Mapping) else lambda k: getattr(emulated, k)
        )
        return cls(
            rollout_s_per_token=float(get("rollout_s_per_token")),
            inference_s_per_token=float(get("inference_s_per_token")),
            actor_s_per_token=float(get("actor_s_per_token")),
            scaling=float(get("scaling")),
            reshard_s_per_gb=float(get("reshard_s_per_gb")),
            model_params=int(get("model_params")),
        )

    def share_seconds(self, component: str, tokens: int, component_gpus: int) -> float:
        """Seconds one rank of a component with ``component_gpus`` GPUs spends on ``tokens``."""
        per_token = {
            "rollout": self.rollout_s_per_token,
            "inference": self.inference_s_per_token,
            "actor": self.actor_s_per_token,
        }[component]
        return tokens * per_token * max(1, component_gpus) ** (1.0 - self.scaling)

    def reshard_bytes(self, old_dp: int, new_dp: int) -> int:
        """Bytes of actor state that must reach ranks that join the actor (0 when only shrinking)."""
        if new_dp <= old_dp:
            return 0
        state = self.model_params * BYTES_PER_PARAM_STATE
        return state * (new_dp - old_dp) // max(1, new_dp)

    def reshard_seconds(self, nbytes: int) -> float:
        return nbytes / 1e9 * self.reshard_s_per_gb


def emulate(seconds: float) -> float:
    """Stand in for GPU work; returns the seconds slept."""
    if seconds > 0:
        time.sleep(seconds)
    return max(0.0, seconds)
