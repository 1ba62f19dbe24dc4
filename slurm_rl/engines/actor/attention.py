"""The actor's core attention: ``torch.nn.functional.scaled_dot_product_attention`` in megatron-core's
local layer spec (``actor.attention_backend: sdpa``, the default), or megatron-core's own unfused
``DotProductAttention`` (``local``).

megatron-core's local spec computes attention as two batched matmuls around a softmax, materialising
the ``[batch * heads, s, s]`` score matrix (in a process-wide scratch buffer) and its probabilities;
SDPA picks a fused kernel that does not (the fused flash kernel on cpu, measured here; flash /
memory-efficient on cuda, which has not run on a GPU yet). :class:`SDPAttention` is a drop-in ``core_attention`` submodule: the same constructor (its
per-partition head counts and softmax scale come from ``DotProductAttention``'s) and the same
``forward`` contract (query ``[sq, b, np, hn]``, key and value ``[sk, b, ng, hn]``, a boolean mask
``[b, 1, sq, sk]`` with True = masked; out ``[sq, b, np * hn]``). Transformer Engine's spec would be
the third backend where ``transformer_engine`` imports; this venv has none.

A packed row (``train.use_remove_padding``: megatron-core's THD format, ``packed_seq_params``) is computed
per sample or under a block-diagonal mask, whichever :func:`packed_attention_form` says is cheaper.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from slurm_rl.config import ATTENTION_BACKENDS


class SDPAttention(DotProductAttention):
    """megatron-core's ``core_attention`` computed by ``scaled_dot_product_attention``."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: AttnMaskType | None = None,
                attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        if attention_bias is not None:
            raise NotImplementedError("SDPAttention: attention bias is not supported")
        if packed_seq_params is not None:
            return self._packed(query, key, value, packed_seq_params)
        sq, b = query.shape[0], query.shape[1]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, hn]
        scale = self.softmax_scale * (self.layer_number if self.config.apply_query_key_layer_scaling else 1)
        mask, causal = None, False
        if attention_mask is None:
            causal = (attn_mask_type or self.attn_mask_type) == AttnMaskType.causal
        else:
            # True = attend; a row whose every key is masked (a query on left padding) attends to
            # itself so its output stays finite: the loss masks those positions out
            mask = ~attention_mask
            sk = mask.shape[-1]
            mask = mask | torch.eye(mask.shape[-2], sk, dtype=torch.bool, device=mask.device)
        dropout = self.attention_dropout.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal,
                                             scale=scale, enable_gqa=q.shape[1] != k.shape[1])
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)


    def _packed(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, params: Any) -> torch.Tensor:
        """THD attention of a packed row (query ``[t, np, hn]``, key and value ``[t, ng, hn]``): each sample
        ``cu_seqlens[i]:cu_seqlens[i + 1]`` attends causally to itself only. Out ``[t, np * hn]``.

        Two exact forms, chosen by :func:`packed_attention_form`: one fused causal SDPA call per sample (work:
        the samples' own squares, plus a call's fixed cost each), or one SDPA call over the row with a
        block-diagonal causal mask (work: the row's square, one call)."""
        if params.qkv_format != "thd":
            raise NotImplementedError(f"SDPAttention: packed format {params.qkv_format!r} (only thd)")
        cu = params.cu_seqlens_q.tolist()
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))  # [1, heads, t, hn]
        scale = self.softmax_scale * (self.layer_number if self.config.apply_query_key_layer_scaling else 1)
        dropout = self.attention_dropout.p if self.training else 0.0
        gqa = q.shape[1] != k.shape[1]
        if packed_attention_form(cu) == "mask":
            lengths = torch.tensor([b - a for a, b in zip(cu[:-1], cu[1:])], device=q.device)
            seg = torch.repeat_interleave(torch.arange(len(lengths), device=q.device), lengths)
            t = q.shape[2]
            mask = (seg[:, None] == seg[None, :]) & torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale,
                                                 enable_gqa=gqa)[0]
        else:
            parts = [F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], dropout_p=dropout,
                                                    is_causal=True, scale=scale, enable_gqa=gqa)[0]
                     for a, b in zip(cu[:-1], cu[1:])]
            out = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]  # [np, t, hn]
        return out.transpose(0, 1).reshape(query.shape[0], self.hidden_size_per_partition)


CALL_COST = 4096
"""A per-sample SDPA call's fixed cost in score entries (measured on cpu: 32 samples of 8 tokens attend ~2-5x
faster as one masked call, 4-8 samples of 20-560 tokens 3-5x faster one call each)."""


def packed_attention_form(cu_seqlens: list[int]) -> str:
    """``mask`` (one call, block-diagonal mask) where the row's square is cheaper than the samples' squares
    plus :data:`CALL_COST` per call, else ``per_sample``."""
    lengths = [b - a for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    own = sum(n * n for n in lengths) + CALL_COST * len(lengths)
    return "mask" if cu_seqlens[-1] ** 2 < own else "per_sample"


def use_attention(spec: Any, backend: str) -> Any:
    """``spec`` (a megatron-core GPT layer spec) with the core attention of ``backend``."""
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"actor.attention_backend {backend!r}: expected one of {', '.join(ATTENTION_BACKENDS)}")
    if backend == "sdpa":
        spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec
