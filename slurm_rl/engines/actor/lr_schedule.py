"""Learning-rate schedule driven by consumed samples (warmup + cosine/linear/constant decay).

The schedule is a pure function of the number of samples consumed, never of the number of
optimizer calls, so dynamic batching and DP changes cannot speed up or slow down the decay
(the bug reported in ROLL issue #442, where the decay budget was computed from nominal
batches but advanced per optimizer call).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

DECAY_STYLES = ("cosine", "linear", "constant")


@dataclass(frozen=True)
class LRScheduleConfig:
    """Peak ``lr`` reached after ``lr_warmup_samples``; decays to ``min_lr`` over the next
    ``lr_decay_samples`` samples (``None`` = constant after warmup)."""

    lr: float = 1e-3
    min_lr: float = 0.0
    lr_warmup_samples: int = 0
    lr_decay_samples: int | None = None
    lr_decay_style: str = "cosine"

    def __post_init__(self) -> None:
        if self.lr_decay_style not in DECAY_STYLES:
            raise ValueError(f"actor.lr_decay_style: got {self.lr_decay_style!r}, "
                             f"allowed: {list(DECAY_STYLES)}")
        if self.lr < 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ValueError(f"actor.min_lr: got lr={self.lr}, min_lr={self.min_lr}; "
                             "expected 0 <= min_lr <= lr")
        if self.lr_warmup_samples < 0:
            raise ValueError(f"actor.lr_warmup_samples: got {self.lr_warmup_samples}, "
                             "expected >= 0")
        if self.lr_decay_samples is not None and self.lr_decay_samples <= 0:
            raise ValueError(f"actor.lr_decay_samples: got {self.lr_decay_samples}, "
                             "expected a positive integer or null")


def lr_at(cfg: LRScheduleConfig, samples: int) -> float:
    """Learning rate after ``samples`` samples have been consumed."""
    if cfg.lr_warmup_samples and samples < cfg.lr_warmup_samples:
        return cfg.lr * samples / cfg.lr_warmup_samples
    if cfg.lr_decay_samples is None or cfg.lr_decay_style == "constant":
        return cfg.lr
    progress = min(1.0, (samples - cfg.lr_warmup_samples) / cfg.lr_decay_samples)
    if cfg.lr_decay_style == "linear":
        coeff = 1.0 - progress
    else:
        coeff = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


class SampleLRScheduler:
    """Tracks consumed samples and yields the LR of each optimizer step.

    The LR of a step is evaluated at the sample count the step brings the run to, so the first
    step of a warmup gets a non-zero LR and a step's LR does not depend on how its samples were
    split into micro-batches or over DP ranks.
    """

    def __init__(self, cfg: LRScheduleConfig, consumed_samples: int = 0) -> None:
        self.cfg = cfg
        self.consumed_samples = consumed_samples

    def lr_for_step(self, step_samples: int) -> float:
        """LR for an optimizer step that consumes ``step_samples`` samples (no state change)."""
        return lr_at(self.cfg, self.consumed_samples + step_samples)

    def advance(self, step_samples: int) -> float:
        """Record a finished step of ``step_samples`` samples; returns the LR that step used."""
        if step_samples <= 0:
            raise ValueError(f"step_samples must be positive, got {step_samples}")
        lr = self.lr_for_step(step_samples)
        self.consumed_samples += step_samples
        return lr

    @property
    def current_lr(self) -> float:
        """LR at the current consumed-sample count."""
        return lr_at(self.cfg, self.consumed_samples)

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint state: consumed samples (never a count of calls) and the config."""
        return {"consumed_samples": self.consumed_samples,
                "config": dataclasses.asdict(self.cfg)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore consumed samples (the config of this scheduler is kept)."""
        self.consumed_samples = int(state["consumed_samples"])
