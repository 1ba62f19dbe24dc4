"""Cost model of the simulator: the same laws and parameters as the emulated runtime.

* A component holding ``g`` GPUs processes ``T`` tokens in ``T * s_per_token / g**scaling`` seconds
  (``slurm_rl.engines.emulated.CostModel``; a test keeps the two in step).
* Rollout decodes per request: an instance of ``g`` GPUs runs up to ``max_running_requests``
  requests at once, each at ``g**scaling / (rollout_s_per_token * max_running_requests)`` tokens
  per second, whatever the batch (memory-bound decode). A full instance therefore matches the law
  above; a half-empty one (the long tail) wastes half its GPUs.
* Resharding the actor from DP ``a`` to ``b > a`` moves ``state * (b - a) / b`` bytes, with
  ``state = model_params * 16`` (fp32 param, grad, two Adam moments); shrinking moves nothing.
  It takes ``bytes / 1e9 * reshard_s_per_gb`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

BYTES_PER_PARAM_STATE = 16


@dataclass(frozen=True)
class SimCostModel:
    """Seconds per token on one GPU for each component, scaling exponent, reshard cost."""

    rollout_s_per_token: float
    inference_s_per_token: float
    actor_s_per_token: float
    scaling: float = 1.0
    reshard_s_per_gb: float = 0.0
    model_params: int = 0

    def __post_init__(self) -> None:
        for name in ("rollout_s_per_token", "inference_s_per_token", "actor_s_per_token"):
            if getattr(self, name) <= 0:
                raise ValueError(f"emulated.{name}: got {getattr(self, name)!r}, expected > 0")
        if not 0 < self.scaling <= 1:
            raise ValueError(f"emulated.scaling: got {self.scaling!r}, expected 0 < x <= 1")
        if self.reshard_s_per_gb < 0 or self.model_params < 0:
            raise ValueError("emulated.reshard_s_per_gb and emulated.model_params must be >= 0")

    @classmethod
    def from_config(cls, emulated: Mapping[str, Any]) -> "SimCostModel":
        """Build from the ``emulated`` config section."""
        return cls(
            rollout_s_per_token=float(emulated["rollout_s_per_token"]),
            inference_s_per_token=float(emulated["inference_s_per_token"]),
            actor_s_per_token=float(emulated["actor_s_per_token"]),
            scaling=float(emulated.get("scaling", 1.0)),
            reshard_s_per_gb=float(emulated.get("reshard_s_per_gb", 0.0)),
            model_params=int(emulated.get("model_params", 0)),
        )

    def seconds(self, component: str, tokens: float, gpus: int) -> float:
        """Seconds a component with ``gpus`` GPUs needs for ``tokens`` tokens."""
        per_token = {"rollout": self.rollout_s_per_token,
                     "inference": self.inference_s_per_token,
                     "actor": self.actor_s_per_token}[component]
        return tokens * per_token / max(1, gpus) ** self.scaling

    def decode_tokens_per_s(self, instance_gpus: int, max_running_requests: int) -> float:
        """Decode speed of one request on a rollout instance of ``instance_gpus`` GPUs."""
        return instance_gpus ** self.scaling / (self.rollout_s_per_token * max_running_requests)

    def reshard_bytes(self, old_dp: int, new_dp: int) -> int:
        """Actor state bytes that must reach joining ranks (0 when only shrinking)."""
        if new_dp <= old_dp:
            return 0
        return self.model_params * BYTES_PER_PARAM_STATE * (new_dp - old_dp) // new_dp

    def reshard_seconds(self, old_dp: int, new_dp: int) -> float:
        """Seconds to reshard the actor from DP ``old_dp`` to ``new_dp``."""
        return self.reshard_bytes(old_dp, new_dp) / 1e9 * self.reshard_s_per_gb
