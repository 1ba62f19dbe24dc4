"""The coefficient of the KL in the reward (``algorithm.kl_ctrl``), as verl's controllers set it.

``fixed`` keeps ``kl_ctrl.kl_coef``; ``adaptive`` is verl's ``AdaptiveKLController`` (Ziegler et al.):
after an iteration whose mean KL per response token is ``current_kl``, the coefficient is multiplied by
``1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * samples / horizon``. The controller keeps no state
of its own: iteration ``k``'s coefficient follows from iteration ``k - 1``'s row of ``metrics.jsonl``
(``kl_ctrl/kl_coef``, ``kl_ctrl/current_kl``, ``samples``), so a resumed run continues the same sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

KL_CTRL_TYPES = ("fixed", "adaptive")
COEF_KEY, KL_KEY = "kl_ctrl/kl_coef", "kl_ctrl/current_kl"


def uses_reference(algorithm: Any) -> bool:
    """Whether ``algorithm`` weighs a KL to the reference policy: as a loss (``kl_coef > 0``) or in
    the reward (``use_kl_in_reward``). Without one, the reference log-probs are never read."""
    return float(getattr(algorithm, "kl_coef", 0.0) or 0.0) > 0.0 or bool(getattr(algorithm, "use_kl_in_reward", False))


def adaptive_update(value: float, current_kl: float, n_steps: int, target_kl: float, horizon: int) -> float:
    """verl's ``AdaptiveKLController.update``: the next coefficient."""
    proportional_error = min(max(current_kl / target_kl - 1.0, -0.2), 0.2)
    return value * (1.0 + proportional_error * n_steps / horizon)


def kl_coef_of_iteration(rows: Sequence[dict[str, Any]], k: int, kl_ctrl: Any) -> float:
    """The coefficient iteration ``k`` uses, from the metrics ``rows`` of the iterations before it."""
    if kl_ctrl.type != "adaptive" or k == 0:
        return float(kl_ctrl.kl_coef)
    prev = [r for r in rows if r.get("iteration") == k - 1 and COEF_KEY in r]
    if not prev:
        raise LookupError(f"kl_ctrl: metrics.jsonl has no {COEF_KEY} for iteration {k - 1} (needed by iteration {k})")
    row = prev[-1]
    return adaptive_update(float(row[COEF_KEY]), float(row[KL_KEY]), int(row["samples"]),
                           float(kl_ctrl.target_kl), int(kl_ctrl.horizon))
