"""Long-tailed response-length distributions for the simulator (deterministic given a seed)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from slurm_rl.config import LENGTH_DISTRIBUTIONS as DISTRIBUTIONS
from slurm_rl.scheduler import defaults



@dataclass(frozen=True)
class LengthModel:
    """Response lengths with mean ``mean`` (before clipping to ``[1, max_len]``).

    ``lognormal``: shape ``sigma`` (median = mean * exp(-sigma**2 / 2));
    ``pareto``: shape ``alpha`` > 1; ``fixed``: always ``mean``.
    """

    mean: float
    max_len: int
    dist: str = defaults.RESPONSE_LEN_DIST
    sigma: float = defaults.RESPONSE_LEN_SIGMA
    alpha: float = defaults.PARETO_ALPHA

    def __post_init__(self) -> None:
        if self.dist not in DISTRIBUTIONS:
            raise ValueError(f"emulated.response_len_dist: got {self.dist!r}, "
                             f"allowed {DISTRIBUTIONS}")
        if self.mean <= 0 or self.max_len <= 0:
            raise ValueError("emulated.response_len_mean and response_len_max must be > 0")
        if self.dist == "pareto" and self.alpha <= 1:
            raise ValueError(f"emulated.response_len_alpha: got {self.alpha}, expected > 1")

    def sample(self, rng: random.Random, n: int) -> list[int]:
        """``n`` response lengths in tokens."""
        if self.dist == "fixed":
            raw = [self.mean] * n
        elif self.dist == "lognormal":
            mu = math.log(self.mean) - self.sigma ** 2 / 2
            raw = [rng.lognormvariate(mu, self.sigma) for _ in range(n)]
        else:
            xm = self.mean * (self.alpha - 1) / self.alpha
            raw = [xm * rng.paretovariate(self.alpha) for _ in range(n)]
        return [max(1, min(self.max_len, int(round(x)))) for x in raw]
