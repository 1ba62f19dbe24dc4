"""The GRPO formulas, once, without torch: group-normalised advantages and the k3 KL estimator.

The emulated and real worker paths (numpy, on Arrow columns) call these directly; the torch
functions of :mod:`slurm_rl.rl.grpo` call the same code.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


def group_advantages(rewards: np.ndarray, groups: np.ndarray, *, eps: float = 1e-6,
                     scale: bool = True) -> np.ndarray:
    """``(r - mean_g) / (std_g + eps)`` per group (samples with equal ``groups`` ids), float64.

    ``std`` is the population std; a group whose rewards are all equal gets advantage 0.
    ``scale=False`` gives the mean-centred rewards only (Dr. GRPO style).
    """
    reward = np.asarray(rewards, np.float64)
    _, inv, counts = np.unique(np.asarray(groups), return_inverse=True, return_counts=True)
    mean = np.bincount(inv, reward) / counts
    centred = reward - mean[inv]
    if not scale:
        return centred
    var = np.bincount(inv, centred ** 2) / counts
    return centred / (np.sqrt(var[inv]) + eps)


def k3(log_ratio: Any, exp: Callable[[Any], Any] = np.exp) -> Any:
    """k3 estimator of KL(pi || ref) per token from ``log_ratio = ref_logprob - logprob``:
    ``exp(d) - d - 1`` (>= 0). ``exp`` is the array library's (``np.exp``, ``torch.exp``)."""
    return exp(log_ratio) - log_ratio - 1.0
