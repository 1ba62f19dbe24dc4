"""megatron-core's RoPE and SwiGLU computed without their concatenations (slurm_rl.engines.actor.plain_ops): the
same values bitwise, forward and backward, with ``cos``/``sin`` computed once per frequency tensor. The plain TP 1
linears and MLPs are compared with megatron-core's on a whole model in tests/test_actor_model.py (they need a
process group)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from megatron.core.models.common.embeddings import rope_utils

from slurm_rl.engines.actor import plain_ops

CONFIG = SimpleNamespace(apply_rope_fusion=False, rotary_interleaved=False, multi_latent_attention=False)
CP_GROUP = "unused by the [s, b, heads, dim] form"  # megatron asks parallel_state for one when given None


def _freqs(seq: int, dim: int) -> torch.Tensor:
    """megatron's ``RotaryEmbedding.get_emb``: ``[seq, 1, 1, dim]`` angles, each frequency twice."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    return torch.cat((angles, angles), dim=-1)[:, None, None, :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mscale", [1.0, 0.75])
def test_rope_equals_megatrons_bitwise_forward_and_backward(dtype: torch.dtype, mscale: float) -> None:
    freqs = _freqs(9, 32)
    t = torch.randn(9, 2, 4, 32, generator=torch.Generator().manual_seed(0)).to(dtype)
    upstream = torch.randn(9, 2, 4, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    outs, grads = [], []
    for fn in (plain_ops.apply_rotary_pos_emb, rope_utils.apply_rotary_pos_emb):
        x = t.clone().requires_grad_(True)
        out = fn(x, freqs, CONFIG, mscale=mscale, cp_group=CP_GROUP)
        (out * upstream).sum().backward()
        outs.append(out.detach())
        grads.append(x.grad)
    assert outs[0].dtype == dtype
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])


def test_cos_and_sin_are_computed_once_per_frequency_tensor() -> None:
    freqs = _freqs(5, 32)
    q, k = torch.randn(5, 1, 2, 32), torch.randn(5, 1, 2, 32)
    plain_ops.apply_rotary_pos_emb(q, freqs, CONFIG)
    cached = dict(getattr(freqs, plain_ops._COS_SIN))
    plain_ops.apply_rotary_pos_emb(k, freqs, CONFIG)  # the key of the same layer, then the next layers
    assert list(getattr(freqs, plain_ops._COS_SIN)) == [(torch.float32, 1.0)]
    assert all(a is b for a, b in zip(getattr(freqs, plain_ops._COS_SIN)[(torch.float32, 1.0)], cached[(torch.float32, 1.0)]))
    plain_ops.apply_rotary_pos_emb(q.bfloat16(), freqs, CONFIG)  # another dtype: its own entry
    assert len(getattr(freqs, plain_ops._COS_SIN)) == 2


def test_partial_rotary_goes_to_megatrons_function() -> None:
    freqs = _freqs(6, 16)  # rotates 16 of the 32 channels: megatron's function passes the rest through
    t = torch.randn(6, 2, 2, 32, generator=torch.Generator().manual_seed(3))
    out = plain_ops.apply_rotary_pos_emb(t, freqs, CONFIG, cp_group=CP_GROUP)
    assert torch.equal(out, rope_utils.apply_rotary_pos_emb(t, freqs, CONFIG, cp_group=CP_GROUP))
    assert torch.equal(out[..., 16:], t[..., 16:])
    assert not hasattr(freqs, plain_ops._COS_SIN)


def test_use_fast_rope_installs_it_where_self_attention_looks_it_up() -> None:
    from megatron.core.transformer import attention

    plain_ops.use_fast_rope()
    plain_ops.use_fast_rope()
    assert attention.apply_rotary_pos_emb is plain_ops.apply_rotary_pos_emb
    assert rope_utils.apply_rotary_pos_emb is not plain_ops.apply_rotary_pos_emb  # megatron's stays for the rest


def _layouts_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return plain_ops._CpuBf16Linear.apply(x, w) + bias


@pytest.mark.parametrize("linear", [plain_ops._plain_linear, _layouts_linear], ids=["this-cpu", "layouts"])
@pytest.mark.parametrize("frozen", [False, True])
def test_bf16_cpu_linear_computes_the_product_and_its_gradients(frozen: bool, linear) -> None:
    """The layouts change how the bf16 products are computed, not what: each within bf16 rounding of the fp32
    product of the same bf16 operands (relative to the largest entry; bf16 keeps 8 bits); the linear a model gets on
    this cpu (the layouts where it has no native bf16 kernels) and the layouts' one, on every cpu."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 5, 64, generator=g).bfloat16().requires_grad_(True)
    w = torch.randn(48, 64, generator=g).bfloat16().requires_grad_(not frozen)
    bias = torch.randn(48, generator=g).bfloat16()
    upstream = torch.randn(3, 5, 48, generator=g).bfloat16()
    out = linear(x, w, bias)
    (out * upstream).sum().backward()
    xf, wf = x.detach().float().requires_grad_(True), w.detach().float().requires_grad_(True)
    ref = xf @ wf.t() + bias.float()
    (ref * upstream.float()).sum().backward()

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return float((a.float() - b).abs().max() / b.abs().max()) < 1e-2

    assert out.dtype == torch.bfloat16 and out.shape == (3, 5, 48)
    assert close(out, ref) and close(x.grad, xf.grad)
    assert (w.grad is None) if frozen else close(w.grad, wf.grad)


def test_mm_of_bf16_cpu_operands_in_every_layout_the_loss_uses() -> None:
    """``plain_ops.mm`` (the chunked log-probs' products) of row- and column-major bf16 operands: within bf16
    rounding of the fp32 product; other dtypes exactly ``a @ b``."""
    g = torch.Generator().manual_seed(5)
    a, w = torch.randn(40, 24, generator=g).bfloat16(), torch.randn(56, 24, generator=g).bfloat16()
    for left, right in ((a, w.t()), (a @ w.t(), w), ((a @ w.t()).t(), a)):
        ref = left.float() @ right.float()
        for out in (plain_ops.mm(left, right), plain_ops._cpu_bf16_mm(left, right)):  # this cpu's, the layouts'
            assert out.dtype == torch.bfloat16 and float((out.float() - ref).abs().max() / ref.abs().max()) < 1e-2
    assert torch.equal(plain_ops.mm(a.float(), w.float().t()), a.float() @ w.float().t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_equals_megatrons_bitwise_forward_and_backward(dtype: torch.dtype) -> None:
    x0 = torch.randn(7, 2, 2 * 48, generator=torch.Generator().manual_seed(4)).to(dtype)
    upstream = torch.randn(7, 2, 48, generator=torch.Generator().manual_seed(5)).to(dtype)

    def megatrons(x: torch.Tensor) -> torch.Tensor:  # MLP.forward's unfused glu
        x_glu, x_linear = torch.chunk(x, 2, dim=-1)
        return torch.nn.functional.silu(x_glu) * x_linear

    outs, grads = [], []
    for fn in (plain_ops._SwiGLU.apply, megatrons):
        x = x0.clone().requires_grad_(True)
        out = fn(x)
        (out * upstream).sum().backward()
        outs.append(out.detach())
        grads.append(x.grad)
    assert outs[0].dtype == dtype and grads[0].shape == x0.shape
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])
