"""KL estimators once, for numpy and torch arrays: the worker's ``kl`` metric, the KL in the reward
(numpy, on Arrow columns) and the KL loss (torch) call the same code."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

import numpy as np

LOG_RATIO_CLAMP = 20.0  # a log ratio (policy loss, k3), as verl clamps it
LOW_VAR_KL_CLAMP = 10.0  # k3 itself


def k3(log_ratio: Any, exp: Callable[[Any], Any] = np.exp) -> Any:
    """k3 estimator of KL(pi || ref) per token from ``log_ratio = ref_logprob - logprob``:
    ``exp(d) - d - 1`` (>= 0). ``exp`` is the array library's (``np.exp``, ``torch.exp``)."""
    return exp(log_ratio) - log_ratio - 1.0


def kl_estimate(logprob: Any, ref_logprob: Any, kind: str, xp: ModuleType = np) -> Any:
    """Per-token KL(pi || ref) estimate of ``kind`` as verl's ``kl_penalty``: ``k1`` (``kl``)
    ``lp - ref``, ``abs``, ``k2`` (``mse``) ``(lp - ref)^2 / 2``, ``k3`` (``low_var_kl``) k3 with the
    log ratio clamped to [-20, 20] and the result to [-10, 10]. ``xp``: numpy or torch."""
    if kind in ("k1", "kl"):
        return logprob - ref_logprob
    if kind == "abs":
        return xp.abs(logprob - ref_logprob)
    if kind in ("k2", "mse"):
        return 0.5 * (logprob - ref_logprob) ** 2
    if kind in ("k3", "low_var_kl"):
        d = xp.clip(ref_logprob - logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return xp.clip(k3(d, xp.exp), -LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)
    raise ValueError(f"kl type {kind!r}: expected one of k1, kl, abs, k2, mse, k3, low_var_kl")
