"""GRPO math as pure torch functions: group advantages and the clipped, KL-regularised loss.

Shapes: per-token tensors are ``[batch, tokens]`` aligned with the generated (response) tokens;
``mask`` is 1 for response tokens that count in the loss, 0 for padding.
The loss is a token mean over the *global* batch: the caller passes ``global_tokens`` (the number
of masked-in tokens across all micro-batches and data-parallel ranks of one optimizer step), so
summing micro-batch losses and all-reducing gradients gives the same update for any split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from slurm_rl.rl import formulas


def group_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6,
                     scale: bool = True) -> Tensor:
    """:func:`slurm_rl.rl.formulas.group_advantages` (the formula the worker uses) per group of
    ``group_size`` consecutive samples, as float32.

    ``std`` is the population std; a group whose rewards are all equal gets advantage 0.
    ``scale=False`` gives the mean-centred rewards only (Dr. GRPO style).
    """
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"group_advantages: {tuple(rewards.shape)} rewards is not a flat "
                         f"multiple of group_size={group_size}")
    groups = np.arange(rewards.numel()) // group_size
    adv = formulas.group_advantages(rewards.detach().cpu().double().numpy(), groups, eps=eps, scale=scale)
    return torch.from_numpy(adv.astype(np.float32)).to(rewards.device)


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || ref): ``exp(ref - lp) - (ref - lp) - 1`` (>= 0)."""
    return formulas.k3(ref_logprobs - logprobs, torch.exp)


@dataclass
class LossParts:
    """Loss of one micro-batch plus token *sums* for metrics (divide by ``global_tokens``)."""

    loss: Tensor
    policy_sum: Tensor
    kl_sum: Tensor
    clipped_tokens: Tensor
    ratio_sum: Tensor
    tokens: Tensor


def grpo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
              global_tokens: int | float | Tensor, clip_eps: float = 0.2,
              clip_eps_high: float | None = None, ref_logprobs: Tensor | None = None,
              kl_coef: float = 0.0) -> LossParts:
    """Clipped policy-ratio loss + ``kl_coef`` * k3 KL, summed over tokens / ``global_tokens``.

    ``advantages`` is per sample ``[batch]`` or per token ``[batch, tokens]``.
    ``ratio = exp(logprobs - old_logprobs)``; per token the policy term is
    ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps_high) * A)``.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"grpo_loss: shapes differ: logprobs {tuple(logprobs.shape)}, "
                         f"old {tuple(old_logprobs.shape)}, mask {tuple(mask.shape)}")
    if float(global_tokens) <= 0:
        raise ValueError(f"grpo_loss: global_tokens must be > 0, got {global_tokens}")
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs - old_logprobs.detach())
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * adv
    policy = -torch.minimum(unclipped, clipped)
    per_token = policy
    if ref_logprobs is not None and kl_coef:
        kl = kl_k3(logprobs, ref_logprobs.detach())
        per_token = per_token + kl_coef * kl
    elif ref_logprobs is not None:
        kl = kl_k3(logprobs.detach(), ref_logprobs)
    else:
        kl = torch.zeros_like(logprobs)
    loss = (per_token * mask).sum() / float(global_tokens)
    with torch.no_grad():
        was_clipped = (clipped < unclipped).to(mask.dtype) * mask
        return LossParts(loss=loss, policy_sum=(policy * mask).sum().detach(),
                         kl_sum=(kl * mask).sum().detach(), clipped_tokens=was_clipped.sum(),
                         ratio_sum=(ratio * mask).sum().detach(), tokens=mask.sum())


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


def grpo_token_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                    clip_eps: float = 0.2, clip_eps_high: float | None = None,
                    ref_logprobs: Tensor | None = None, kl_coef: float = 0.0) -> Tensor:
    """Per-token GRPO loss ``[batch, tokens]`` (no mask, no normalisation).

    The same terms as :func:`grpo_loss`; for trainers that apply the loss mask and divide by the
    global token count of the optimizer step themselves (``ActorTrainer.train_step``).
    """
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs - old_logprobs.detach())
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * adv)
    if ref_logprobs is not None and kl_coef:
        per_token = per_token + kl_coef * kl_k3(logprobs, ref_logprobs.detach())
    return per_token
