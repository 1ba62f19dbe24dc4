"""Three of megatron-core 0.16's layer operations computed as plain PyTorch (``transformers``) computes them.

- **RoPE.** megatron-core's unfused RoPE (``rope_utils._apply_rotary_pos_emb_bshd``) recomputes ``cos`` and ``sin``
  of the frequencies for every query and key of every layer and concatenates the rotated part with an empty
  pass-through part (a full copy of q and k each time); ``transformers`` computes ``cos``/``sin`` once per forward.
  :func:`apply_rotary_pos_emb` gives the same values (the same operations on the same operands: bitwise equal) with
  ``cos``/``sin`` computed once per frequency tensor (megatron's ``RotaryEmbedding.forward`` returns one cached
  tensor per sequence length) and without the empty concatenation. Anything else (packed THD rows, fused RoPE,
  interleaved or partial rotary, multi-latent attention) goes to megatron-core's own function. The sign of
  ``rotate_half`` is folded into the cached ``sin`` (``cat(-t2, t1) * sin == cat(t2, t1) * cat(-sin1, sin2)``
  bit for bit), so no negated copy of ``t`` is made per call.
  :func:`use_fast_rope` installs it where megatron's self-attention looks it up: process-wide by nature, idempotent.
- **SwiGLU.** megatron-core's unfused gated MLP activation chunks the first linear's output and autograd
  concatenates the two halves' gradients back; :class:`_SwiGLU` writes each half's gradient into its place
  (:func:`use_plain_swiglu`, per module). Measured fwd+bwd of the activation alone: equal at the quickstart's
  width (0.59-0.71 ms against 0.72-0.83), 13.2 against 14.0 ms at Qwen2.5-0.5B's.
- **Linear layers at TP 1.** megatron-core's column- and row-parallel linears run through a Python autograd
  function (``LinearWithGradAccumulationAndAsyncCommunication``) built for tensor-parallel all-reduces and fused
  gradient accumulation; at TP 1 without either it computes ``input @ weight.T`` and its two gradients, as
  ``torch.matmul``'s own backward does. :func:`use_plain_linears` gives a TP 1 model's linears that. In bf16 on a
  cpu without native bf16 kernels the three products go through the operand layouts oneDNN's bf16 matmul is fast
  with there (:func:`_cpu_bf16_mm`): the default layouts of a linear's gradient-of-input product were 4-17x slower
  on an AVX2 host; with native bf16 kernels (:func:`cpu_has_bf16_kernels`) the plain layouts are faster.

Measured on the quickstart shape (fp32, SDPA, 60 alternating steps each, this 2-core cpu): a padded step took
82.2 ms (median) with megatron's RoPE against 78.4 with this one, and 85.8 with megatron's linears against 82.5
with plain ones, the same as ``transformers`` + AdamW's 82.3. In bf16 (8 alternating steps): 632 ms (min) with
plain linears, 305 with the bf16 layouts, 585 for ``transformers`` + AdamW (whose linears take the slow layouts).
"""

from __future__ import annotations

from typing import Any

import torch

_COS_SIN = "_slurm_rl_cos_sin"  # attribute of a frequency tensor: {(dtype, mscale): (cos, sin)}


def _cos_sin(freqs: torch.Tensor, dtype: torch.dtype, mscale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of ``freqs`` (scaled by ``mscale``, in ``dtype``; ``sin``'s first half of the last
    dimension negated), computed once per tensor."""
    cache: dict[tuple[torch.dtype, float], tuple[torch.Tensor, torch.Tensor]] = getattr(freqs, _COS_SIN, None) or {}
    key = (dtype, float(mscale))
    if key not in cache:
        with torch.no_grad():
            sin = (torch.sin(freqs) * mscale).to(dtype)
            h = sin.shape[-1] // 2
            cache[key] = ((torch.cos(freqs) * mscale).to(dtype), torch.cat((-sin[..., :h], sin[..., h:]), dim=-1))
        setattr(freqs, _COS_SIN, cache)
    return cache[key]


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, config: Any, cu_seqlens: torch.Tensor | None = None,
                         mscale: float = 1.0, cp_group: Any = None) -> torch.Tensor:
    """megatron-core's ``apply_rotary_pos_emb`` (same signature and values) for ``[s, b, heads, dim]``."""
    if (cu_seqlens is not None or config.apply_rope_fusion or config.rotary_interleaved
            or config.multi_latent_attention or freqs.shape[-1] != t.shape[-1] or freqs.requires_grad):
        from megatron.core.models.common.embeddings import rope_utils

        return rope_utils.apply_rotary_pos_emb(t, freqs, config, cu_seqlens=cu_seqlens, mscale=mscale, cp_group=cp_group)
    cos, sin_signed = _cos_sin(freqs, t.dtype, mscale)
    h = t.shape[-1] // 2
    # rotate_half(t) * sin = cat(-t2, t1) * sin = cat(t2, t1) * cat(-sin1, sin2): the same products bit for bit
    # ((-a) * b == a * (-b)), with the sign folded into the cached sin instead of negating t every call
    return (t * cos) + (torch.cat((t[..., h:], t[..., :h]), dim=-1) * sin_signed)


class _SwiGLU(torch.autograd.Function):
    """``silu(x1) * x2`` of the halves of ``x``'s last dimension (megatron-core's gated MLP activation) with
    the gradient of each half written into its place: megatron-core's values bit for bit (it keeps what
    autograd keeps: ``x`` and ``silu(x1)``), without the concatenation its ``torch.chunk`` costs in the
    backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        a, b = torch.chunk(x, 2, dim=-1)
        s = torch.nn.functional.silu(a)
        ctx.save_for_backward(x, s)
        return s * b

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x, s = ctx.saved_tensors
        a, b = torch.chunk(x, 2, dim=-1)
        out = torch.empty_like(x)
        ga, gb = torch.chunk(out, 2, dim=-1)
        torch.mul(g, s, out=gb)
        torch.ops.aten.silu_backward.grad_input(g * b, a, grad_input=ga)
        return out


def _swiglu_mlp_forward(mlp: Any, hidden_states: torch.Tensor, per_token_scale: Any = None,
                        **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """megatron-core's ``MLP.forward`` for a SwiGLU MLP (its unfused path) with :class:`_SwiGLU`."""
    if per_token_scale is not None:
        return type(mlp).forward(mlp, hidden_states, per_token_scale=per_token_scale, **kwargs)
    x, bias = mlp.linear_fc1(hidden_states)
    if bias is not None:
        x = x + bias
    return mlp.linear_fc2(_SwiGLU.apply(x))


def cpu_has_bf16_kernels() -> bool:
    """Whether oneDNN has native bf16 matmul kernels for this cpu (AVX-512 and up). There the plain layouts are the
    fast ones (measured on an AMD EPYC with AVX-512 BF16, 1,311 tokens at Qwen2.5-0.5B's widths: ``x @ w.T`` with
    the 152K-vocabulary output layer 1.20 s plain against 1.76 s through :func:`_cpu_bf16_mm`, 896 x 4864 28.9
    against 38.6 ms), so :func:`_cpu_bf16_mm` is for the cpus without them."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# A fact of the hardware, read once: whether bf16 cpu products take :func:`_cpu_bf16_mm`'s layouts.
_BF16_LAYOUTS = not cpu_has_bf16_kernels()


def _cpu_bf16(*tensors: torch.Tensor) -> bool:
    """Whether every tensor is a bf16 cpu tensor and this cpu has no native bf16 kernels (the layouts help)."""
    return _BF16_LAYOUTS and all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in tensors)


def _cpu_bf16_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of 2-D bf16 cpu tensors with ``a`` column-major and ``b`` row-major: the layouts oneDNN's bf16
    matmul is fast with on a cpu without bf16 units (measured on this AVX2 host, M = 1152: K = 64, N = 512 took
    3.2 ms in these layouts against 55 ms with both row-major, the layouts of a linear's gradient of its input;
    K = 512, N = 64 3.4 against 32 ms). The copies are of one operand each: small against the product."""
    return torch.mm(a.t().contiguous().t(), b.contiguous())


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of 2-D tensors; bf16 cpu ones through :func:`_cpu_bf16_mm`."""
    return _cpu_bf16_mm(a, b) if _cpu_bf16(a, b) else a @ b


class _CpuBf16Linear(torch.autograd.Function):
    """``x @ w.T`` and its gradients with every product through :func:`_cpu_bf16_mm`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, w)
        return _cpu_bf16_mm(x.reshape(-1, x.shape[-1]), w.t()).view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:  # type: ignore[override]
        x, w = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        gx = _cpu_bf16_mm(g, w).view(x.shape) if ctx.needs_input_grad[0] else None
        gw = _cpu_bf16_mm(g.t(), x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
        return gx, gw


def _plain_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  *args: Any, **kwargs: Any) -> torch.Tensor:
    """megatron-core's ``_forward_impl`` of a linear at TP 1: ``input @ weight.T`` (+ ``bias``), plain autograd
    (in bf16 on cpu: :class:`_CpuBf16Linear`)."""
    out = _CpuBf16Linear.apply(input, weight) if _cpu_bf16(input, weight) else torch.matmul(input, weight.t())
    return out if bias is None else out + bias


def use_plain_linears(model: torch.nn.Module) -> int:
    """Give every column- and row-parallel linear of a TP 1 ``model`` :func:`_plain_linear` (an attribute of each
    module: nothing process-wide); the number of linears changed."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    linears = [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    for m in linears:
        if m.tp_group.size() != 1 or m.sequence_parallel or m.gradient_accumulation_fusion:
            raise ValueError(f"use_plain_linears: {type(m).__name__} is tensor-parallel, sequence-parallel or fuses "
                             "gradient accumulation; the plain linear computes none of that")
        m._forward_impl = _plain_linear
    return len(linears)


def use_plain_swiglu(model: torch.nn.Module) -> int:
    """Give every SwiGLU MLP of ``model`` that megatron-core computes unfused (``silu``, gated, no fused
    bias-activation, no clamp or offset) :func:`_swiglu_mlp_forward` (an attribute of each module); the number
    changed."""
    import functools

    from megatron.core.transformer.mlp import MLP

    changed = 0
    for m in model.modules():
        c = getattr(m, "config", None)
        if (type(m) is MLP and c.gated_linear_unit and c.activation_func is torch.nn.functional.silu
                and not c.bias_activation_fusion and not c.use_te_activation_func
                and c.activation_func_clamp_value is None and not c.glu_linear_offset):
            m.forward = functools.partial(_swiglu_mlp_forward, m)
            changed += 1
    return changed


def use_fast_rope() -> None:
    """Make megatron-core's self-attention apply RoPE with :func:`apply_rotary_pos_emb`. Idempotent."""
    from megatron.core.transformer import attention

    attention.apply_rotary_pos_emb = apply_rotary_pos_emb
