"""The k3 KL estimator once, for numpy and torch arrays (the worker's ``kl`` metric)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


def k3(log_ratio: Any, exp: Callable[[Any], Any] = np.exp) -> Any:
    """k3 estimator of KL(pi || ref) per token from ``log_ratio = ref_logprob - logprob``:
    ``exp(d) - d - 1`` (>= 0). ``exp`` is the array library's (``np.exp``, ``torch.exp``)."""
    return exp(log_ratio) - log_ratio - 1.0
