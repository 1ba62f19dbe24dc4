"""Rollout engines (hf, vllm) behind one interface; backends are imported lazily."""

from __future__ import annotations

from typing import Any, Literal

from slurm_rl.engines.model_config import ModelConfig
from slurm_rl.engines.rollout.base import Generation, RolloutEngine, SamplingParams

__all__ = ["Generation", "RolloutEngine", "SamplingParams", "make_rollout_engine"]


def make_rollout_engine(backend: Literal["hf", "vllm"], model_cfg: ModelConfig,
                        device: str = "cpu", **kwargs: Any) -> RolloutEngine:
    """Build a rollout engine; ``kwargs`` go to the backend (seed, work_dir, ...)."""
    if backend == "hf":
        from slurm_rl.engines.rollout.hf import HFRolloutEngine
        return HFRolloutEngine(model_cfg, device=device, **kwargs)
    if backend == "vllm":
        from slurm_rl.engines.rollout.vllm_engine import VLLMRolloutEngine
        return VLLMRolloutEngine(model_cfg, device=device, **kwargs)
    raise ValueError(f"rollout.backend: got {backend!r}, allowed: ['hf', 'vllm']")
