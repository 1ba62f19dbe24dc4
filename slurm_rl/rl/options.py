"""The names the ``algorithm`` section accepts (without importing torch: ``validate`` checks them)."""

from __future__ import annotations

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""``algorithm.loss_agg_mode`` (verl's names, see :class:`slurm_rl.rl.losses.LossAggregation`)."""

KL_TYPES = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
"""``algorithm.kl_loss_type`` (verl's ``kl_penalty`` names; ``k3`` is ``low_var_kl``)."""
