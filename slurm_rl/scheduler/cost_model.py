"""Cost model of the simulator: the same laws and parameters as the emulated runtime.

* A component holding ``g`` GPUs processes ``T`` tokens in ``T * s_per_token / g**scaling`` seconds
  (``slurm_rl.engines.emulated.CostModel``; a test keeps the two in step).
* Rollout decodes per request: an instance of ``g`` GPUs runs up to ``m = max_running_requests``
  requests at once. One decode step (one token for every running request) takes
  ``rollout_s_per_token * m / g**scaling * (f + (1 - f) * b / m)`` seconds with ``b`` running
  requests and ``f = decode_fixed_fraction`` (the part of a step that does not shrink with the
  batch: reading the weights). A full instance therefore matches the law above; with ``f = 1``
  a half-empty instance (the long tail) wastes half its GPUs, with ``f < 1`` its few requests
  decode faster.
* Resharding the actor from DP ``a`` to ``b > a`` moves ``state * (b - a) / b`` bytes, with
  ``state = model_params * 16`` (fp32 param, grad, two Adam moments); shrinking moves nothing.
  It takes ``bytes / 1e9 * reshard_s_per_gb`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from slurm_rl.scheduler import defaults

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
    decode_fixed_fraction: float = defaults.DECODE_FIXED_FRACTION

    def __post_init__(self) -> None:
        for name in ("rollout_s_per_token", "inference_s_per_token", "actor_s_per_token"):
            if getattr(self, name) <= 0:
                raise ValueError(f"emulated.{name}: got {getattr(self, name)!r}, expected > 0")
        if not 0 < self.scaling <= 1:
            raise ValueError(f"emulated.scaling: got {self.scaling!r}, expected 0 < x <= 1")
        if not 0 < self.decode_fixed_fraction <= 1:
            raise ValueError(f"emulated.decode_fixed_fraction: got {self.decode_fixed_fraction!r}, "
                             "expected 0 < x <= 1")
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
            decode_fixed_fraction=float(emulated.get("decode_fixed_fraction",
                                                     defaults.DECODE_FIXED_FRACTION)),
        )

    def seconds(self, component: str, tokens: float, gpus: int) -> float:
        """Seconds a component with ``gpus`` GPUs needs for ``tokens`` tokens."""
        per_token = {"rollout": self.rollout_s_per_token,
                     "inference": self.inference_s_per_token,
                     "actor": self.actor_s_per_token}[component]
        return tokens * per_token / max(1, gpus) ** self.scaling

    def decode_tokens_per_s(self, instance_gpus: int, max_running_requests: int,
                            running: int) -> float:
        """Decode speed of one request on an instance of ``instance_gpus`` GPUs running
        ``running`` requests (see the module docstring)."""
        m = max_running_requests
        f = self.decode_fixed_fraction
        step = self.rollout_s_per_token * m / instance_gpus ** self.scaling
        return 1.0 / (step * (f + (1 - f) * min(running, m) / m))

    def reshard_bytes(self, old_dp: int, new_dp: int) -> int:
        """Actor state bytes that must reach joining ranks (0 when only shrinking)."""
        if new_dp <= old_dp:
            return 0
        return self.model_params * BYTES_PER_PARAM_STATE * (new_dp - old_dp) // new_dp

    def reshard_seconds(self, old_dp: int, new_dp: int) -> float:
        """Seconds to reshard the actor from DP ``old_dp`` to ``new_dp``."""
        return self.reshard_bytes(old_dp, new_dp) / 1e9 * self.reshard_s_per_gb
