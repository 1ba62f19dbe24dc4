"""The actor's loss, as verl's ``core_algos`` computes it: policy losses by name, KL estimators,
and the aggregation of per-token losses over an optimizer step.

Shapes: per-token tensors are ``[batch, tokens]`` in the next-token layout of
:func:`place_responses`; ``mask`` is 1 on response tokens.

- **Policy loss** ``vanilla`` (verl's default ``policy_loss.loss_mode``): PPO's clipped ratio
  ``-min(r * A, clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high) * A)`` (DAPO's clip-higher when
  high > low), and for negative advantages the dual clip ``min(that, -A * clip_ratio_c)``. The log
  ratio is clamped to [-20, 20] as verl clamps it.
- **KL** between the policy and the reference (``kl_loss_type``): ``k1`` (``kl``) ``lp - ref``,
  ``abs``, ``k2`` (``mse``) ``(lp - ref)^2 / 2``, ``k3`` (``low_var_kl``) ``exp(ref - lp) - (ref - lp) - 1``
  clamped to [-10, 10].
- **Aggregation** (``loss_agg_mode``), over the whole optimizer step (every micro-batch and data
  parallel rank), so that an update does not depend on how a mini-batch is split:
  ``token-mean`` (sum over tokens / tokens), ``seq-mean-token-sum`` (sum / sequences),
  ``seq-mean-token-mean`` (each sequence's token mean, averaged over sequences) and
  ``seq-mean-token-sum-norm`` (sum / (sequences * horizon), Dr. GRPO; the horizon is
  ``rollout.max_new_tokens``). verl divides the last one by the padded length of each micro-batch;
  a fixed horizon keeps it independent of the split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from slurm_rl.rl.formulas import LOG_RATIO_CLAMP, kl_estimate
from slurm_rl.rl.options import AGG_MODES, KL_TYPES

__all__ = ["AGG_MODES", "KL_TYPES", "POLICY_LOSSES", "LossAggregation", "PolicyLossConfig", "kl_penalty",
           "place_responses", "policy_diagnostics", "policy_loss", "register_policy_loss", "response_mask", "value_loss"]



@dataclass(frozen=True)
class PolicyLossConfig:
    """The clip ratios of the policy loss (verl's ``actor`` keys)."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0


PolicyLossFn = Callable[[Tensor, Tensor, Tensor, PolicyLossConfig], tuple[Tensor, Tensor]]
POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register a policy loss ``(logprobs, old_logprobs, advantages, config) -> (per-token loss,
    per-token clipped flag)`` under ``name``."""

    def add(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES[name] = fn
        return fn

    return add


def _ppo_terms(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
               cfg: PolicyLossConfig) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """verl's terms of the clipped loss: the advantages (per token), the log-ratio, the unclipped and the
    clipped loss, their max and the dual clip's bound."""
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    log_ratio = torch.clamp(logprobs - old_logprobs.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss1 = -adv * ratio
    loss2 = -adv * torch.clamp(ratio, 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    return adv, log_ratio, loss1, loss2, torch.maximum(loss1, loss2), -adv * cfg.clip_ratio_c


@register_policy_loss("vanilla")
def vanilla(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
            cfg: PolicyLossConfig) -> tuple[Tensor, Tensor]:
    """PPO's clipped loss with clip-higher and the dual clip of negative advantages (verl's vanilla)."""
    adv, _, loss1, loss2, clipped1, loss3 = _ppo_terms(logprobs, old_logprobs, advantages, cfg)
    loss = torch.where(adv < 0, torch.minimum(loss3, clipped1), clipped1)
    with torch.no_grad():
        clipped = (loss2 > loss1) | ((adv < 0) & (clipped1 > loss3))
    return loss, clipped


def policy_diagnostics(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                       cfg: PolicyLossConfig) -> dict[str, Tensor]:
    """verl's per-token diagnostics of the clipped loss (its metrics are their token means):
    ``pg_clipfrac`` (the ratio's clip is the larger loss), ``pg_clipfrac_lower`` (the dual clip bounds a
    negative advantage's loss) and ``ppo_kl`` (the log-ratio of old to current policy, k1)."""
    with torch.no_grad():
        adv, log_ratio, loss1, loss2, clipped1, loss3 = _ppo_terms(logprobs.detach(), old_logprobs, advantages, cfg)
        return {"pg_clipfrac": (loss2 > loss1).to(logprobs.dtype),
                "pg_clipfrac_lower": ((clipped1 > loss3) & (adv < 0)).to(logprobs.dtype),
                "ppo_kl": -log_ratio}


def policy_loss(name: str) -> PolicyLossFn:
    """The registered policy loss ``name`` (KeyError naming the registered ones)."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise KeyError(f"policy loss {name!r}: registered are {sorted(POLICY_LOSSES)}") from None


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str) -> Tensor:
    """Per-token KL(pi || ref) estimate of ``kind`` (one of :data:`KL_TYPES`)."""
    if kind not in KL_TYPES:
        raise ValueError(f"kl_loss_type {kind!r}: expected one of {', '.join(KL_TYPES)}")
    return kl_estimate(logprobs, ref_logprobs, kind, torch)


@dataclass(frozen=True)
class LossAggregation:
    """How per-token losses of one optimizer step become one number (``loss_agg_mode``).

    The trainer sums ``loss * weights(mask)`` over every micro-batch of the step and divides by
    ``denominator(tokens, sequences)`` of the whole step (all data parallel ranks)."""

    mode: str = "token-mean"
    horizon: int | None = None  # seq-mean-token-sum-norm: the longest response (rollout.max_new_tokens)

    def __post_init__(self) -> None:
        if self.mode not in AGG_MODES:
            raise ValueError(f"loss_agg_mode {self.mode!r}: expected one of {', '.join(AGG_MODES)}")
        if self.mode == "seq-mean-token-sum-norm" and not (self.horizon and self.horizon > 0):
            raise ValueError(f"loss_agg_mode {self.mode!r} needs a positive horizon, got {self.horizon!r}")

    def weights(self, mask: Tensor, segments: Tensor | None = None) -> Tensor:
        """Per-token weights of a micro-batch's ``mask`` ``[rows, tokens]``; a packed row gives the sample of
        each token in ``segments`` (same shape), padded rows are one sample each."""
        if self.mode != "seq-mean-token-mean":
            return mask
        if segments is None:
            return mask / mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
        flat = segments.reshape(-1)
        counts = torch.zeros(int(flat.max()) + 1, dtype=mask.dtype, device=mask.device).index_add_(
            0, flat, mask.reshape(-1))
        return mask / counts[flat].view_as(mask).clamp(min=1.0)

    def denominator(self, tokens: float, sequences: float) -> float:
        """What the step's weighted sum is divided by."""
        if self.mode == "token-mean":
            return tokens
        if self.mode == "seq-mean-token-sum-norm":
            assert self.horizon is not None
            return sequences * self.horizon
        return sequences


def response_mask(lengths: Tensor, width: int) -> Tensor:
    """``[batch, width]`` float mask with the first ``lengths[i]`` positions set."""
    return (torch.arange(width, device=lengths.device).unsqueeze(0)
            < lengths.unsqueeze(1)).float()


def place_responses(prompt_lens: Sequence[int], values: Sequence[Sequence[float]], width: int
                    ) -> tuple[Tensor, Tensor]:
    """Lay per-response-token values into the ``[batch, width]`` next-token layout.

    For a sequence ``prompt + response`` the logprob of response token ``j`` sits at column
    ``len(prompt) - 1 + j`` of ``token_logprobs(ids)`` (width ``T - 1``). Returns
    ``(values, mask)`` in that layout, zeros outside the responses.
    """
    out = torch.zeros(len(values), width)
    mask = torch.zeros(len(values), width)
    for i, (p, v) in enumerate(zip(prompt_lens, values)):
        s, n = p - 1, len(v)
        if s < 0 or s + n > width:
            raise ValueError(f"place_responses: row {i}: prompt {p} + response {n} tokens do "
                             f"not fit width {width}")
        out[i, s:s + n] = torch.as_tensor(v, dtype=torch.float32)
        mask[i, s:s + n] = 1.0
    return out, mask


def value_loss(vpreds: Tensor, values: Tensor, returns: Tensor, cliprange_value: float) -> tuple[Tensor, Tensor]:
    """The critic's per-token loss (verl's ``compute_value_loss`` before aggregation):
    ``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)`` with ``V_old`` the values the
    advantages were computed from and ``R`` the returns; and the per-token flag of the clipped term
    being the larger (``vf_clipfrac``)."""
    values, returns = values.detach(), returns.detach()
    clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss1 = (vpreds - returns) ** 2
    loss2 = (clipped - returns) ** 2
    with torch.no_grad():
        flag = loss2 > loss1
    return 0.5 * torch.maximum(loss1, loss2), flag
