"""The cost model, one for its two uses: the simulator and the emulated runtime (``engines.emulated``).

* A component holding ``g`` GPUs processes ``T`` tokens in ``T * s_per_token / g**scaling`` seconds
  (:meth:`CostModel.seconds`); one rank doing its share ``T / g`` of that work spends
  :meth:`CostModel.share_seconds` on it (the emulated runtime sleeps that long).
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
* A rank the actor shares with rollout and inference (collocated) parks its share of that state in host
  memory while it decodes and brings it back to train: each way ``state / tp / 1e9 * offload_s_per_gb``
  seconds (:meth:`CostModel.offload_seconds`).

No torch import: emulated ranks stay small.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from slurm_rl.scheduler import defaults

BYTES_PER_PARAM_STATE = 16  # fp32 param + grad + two Adam moments


def reshard_fraction(old_dp: int, new_dp: int) -> float:
    """Fraction of the actor's state that reaches joining ranks when its DP goes from
    ``old_dp`` to ``new_dp``: ``(new - old) / new`` when growing, 0 when shrinking."""
    if new_dp <= old_dp or new_dp <= 0:
        return 0.0
    return (new_dp - old_dp) / new_dp


@dataclass(frozen=True)
class CostModel:
    """Seconds per token on one GPU for each component, scaling exponent, reshard cost."""

    rollout_s_per_token: float
    inference_s_per_token: float
    actor_s_per_token: float
    scaling: float = 1.0
    reshard_s_per_gb: float = 0.0
    model_params: int = 0
    decode_fixed_fraction: float = defaults.DECODE_FIXED_FRACTION
    offload_s_per_gb: float = 0.0

    def __post_init__(self) -> None:
        for name in ("rollout_s_per_token", "inference_s_per_token", "actor_s_per_token"):
            if getattr(self, name) <= 0:
                raise ValueError(f"emulated.{name}: got {getattr(self, name)!r}, expected > 0")
        if not 0 < self.scaling <= 1:
            raise ValueError(f"emulated.scaling: got {self.scaling!r}, expected 0 < x <= 1")
        if not 0 < self.decode_fixed_fraction <= 1:
            raise ValueError(f"emulated.decode_fixed_fraction: got {self.decode_fixed_fraction!r}, "
                             "expected 0 < x <= 1")
        if self.reshard_s_per_gb < 0 or self.model_params < 0 or self.offload_s_per_gb < 0:
            raise ValueError("emulated.reshard_s_per_gb, offload_s_per_gb and model_params must be >= 0")

    @classmethod
    def from_config(cls, emulated: Mapping[str, Any] | Any) -> "CostModel":
        """Build from the ``emulated`` config section (a mapping or the config dataclass)."""
        get: Callable[[str, Any], Any] = (
            (lambda k, d: emulated.get(k, d)) if isinstance(emulated, Mapping)
            else (lambda k, d: getattr(emulated, k, d)))
        for name in ("rollout_s_per_token", "inference_s_per_token", "actor_s_per_token"):
            if get(name, None) is None:
                raise KeyError(f"emulated.{name}")
        return cls(
            rollout_s_per_token=float(get("rollout_s_per_token", None)),
            inference_s_per_token=float(get("inference_s_per_token", None)),
            actor_s_per_token=float(get("actor_s_per_token", None)),
            scaling=float(get("scaling", 1.0)),
            reshard_s_per_gb=float(get("reshard_s_per_gb", 0.0)),
            model_params=int(get("model_params", 0)),
            decode_fixed_fraction=float(get("decode_fixed_fraction", defaults.DECODE_FIXED_FRACTION)),
            offload_s_per_gb=float(get("offload_s_per_gb", 0.0)),
        )

    def _per_token(self, component: str) -> float:
        return {"rollout": self.rollout_s_per_token,
                "inference": self.inference_s_per_token,
                "actor": self.actor_s_per_token}[component]

    def seconds(self, component: str, tokens: float, gpus: int) -> float:
        """Seconds the whole component with ``gpus`` GPUs needs for ``tokens`` tokens."""
        return tokens * self._per_token(component) / max(1, gpus) ** self.scaling

    def share_seconds(self, component: str, tokens: float, component_gpus: int) -> float:
        """Seconds one rank of a component with ``component_gpus`` GPUs spends on its ``tokens``."""
        return tokens * self._per_token(component) * max(1, component_gpus) ** (1.0 - self.scaling)

    def decode_step_seconds(self, instance_gpus: int, max_running_requests: int, running: int) -> float:
        """One decode step (one token for every running request) of a rollout instance."""
        m = max_running_requests
        f = self.decode_fixed_fraction
        step = self.rollout_s_per_token * m / max(1, instance_gpus) ** self.scaling
        return step * (f + (1 - f) * min(running, m) / m)

    def decode_tokens_per_s(self, instance_gpus: int, max_running_requests: int,
                            running: int) -> float:
        """Decode speed of one request on an instance of ``instance_gpus`` GPUs running
        ``running`` requests: one token per decode step."""
        return 1.0 / self.decode_step_seconds(instance_gpus, max_running_requests, running)

    def reshard_bytes(self, old_dp: int, new_dp: int) -> int:
        """Actor state bytes that must reach joining ranks (0 when only shrinking)."""
        if new_dp <= old_dp:
            return 0
        return self.model_params * BYTES_PER_PARAM_STATE * (new_dp - old_dp) // new_dp

    def transfer_seconds(self, nbytes: int) -> float:
        """Seconds to move ``nbytes`` of actor state."""
        return nbytes / 1e9 * self.reshard_s_per_gb

    def offload_seconds(self, tp: int = 1) -> float:
        """Seconds a rank takes to move its share of the actor's state (TP ``tp``) to host memory, or back."""
        return self.model_params * BYTES_PER_PARAM_STATE / max(1, tp) / 1e9 * self.offload_s_per_gb

    def reshard_seconds(self, old_dp: int, new_dp: int) -> float:
        """Seconds to reshard the actor from DP ``old_dp`` to ``new_dp``."""
        return self.transfer_seconds(self.reshard_bytes(old_dp, new_dp))
