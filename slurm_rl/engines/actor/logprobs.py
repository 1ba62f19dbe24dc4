"""Next-token log-probabilities (and entropies) of a micro-batch, padded or packed, without the full logits.

The actor's loss needs, per position, the log-probability of the next token and optionally the entropy of
the next-token distribution. Computed naively from the model's logits, a micro-batch holds ``tokens x vocab``
logits in the model's dtype plus their fp32 copy and the softmax's gradient (at Qwen2.5's 151,936-token
vocabulary and 4K tokens: 2.5 GB each in fp32). :func:`chunked_logprobs` instead takes the hidden states
before the output layer and the output weight and computes the logits a chunk of tokens at a time, turning
each into log-probabilities in place. A micro-batch that fits one chunk keeps it for the backward (no extra
work); with several chunks the backward recomputes each (one extra matmul of the output layer) rather than
keeping them, so the peak holds about one chunk (``chunk_bytes``) whatever the micro-batch's size.

At TP > 1 the output layer is split over the vocabulary (megatron's ``ColumnParallelLinear``) and the model
gathers the logits (``parallel_output=False``); there the log-probs come from the gathered logits as before.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import torch
from torch import Tensor

from .microbatch import is_packed
from .plain_ops import mm

CHUNK_BYTES = 1 << 30
"""fp32 logits held at once by :func:`chunked_logprobs` (a chunk of tokens x the vocabulary): 1 GiB, so that a
micro-batch of up to ~1,760 tokens at Qwen2.5's vocabulary is one chunk (kept for the backward: no recompute)."""


SUB = 8
"""Row-wise reductions over a chunk's logits run over this many parts (their temporaries: a part's size)."""


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the logits' softmax: fp32, or the inputs' where wider (fp64 in the tests)."""
    return torch.promote_types(dtype, torch.float32)


def _chunks(n: int, vocab: int, chunk_bytes: int) -> list[tuple[int, int]]:
    step = max(1, chunk_bytes // (4 * vocab))
    return [(a, min(n, a + step)) for a in range(0, n, step)]


class _ChunkedLogprobs(torch.autograd.Function):
    """``(hidden [N, h], weight [V, h], targets [N])`` -> fp32 log-probs ``[N]`` and entropies ``[N]``
    (zeros unless asked), the logits ``hidden @ weight.T`` computed a chunk of tokens at a time and turned into
    log-probabilities in place. With one chunk they are kept for the backward (they fit the bound); with several
    each chunk is recomputed there."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, entropy: bool,
                chunk_bytes: int) -> tuple[Tensor, Tensor]:
        n, acc = hidden.shape[0], _accumulation(hidden.dtype)
        logprobs = hidden.new_empty(n, dtype=acc)
        lse = hidden.new_empty(n, dtype=acc)
        ent = hidden.new_zeros(n, dtype=acc)
        chunks = _chunks(n, weight.shape[0], chunk_bytes)
        z = None
        for a, b in chunks:
            z = mm(hidden[a:b], weight.t()).to(acc)
            # the row-wise reductions an eighth of the chunk at a time: their temporaries stay small
            for i, j in _chunks(b - a, weight.shape[0], max(1, chunk_bytes // SUB)):
                lse[a + i:a + j] = torch.logsumexp(z[i:j], dim=-1)
                if entropy:
                    ent[a + i:a + j] = lse[a + i:a + j] - (torch.softmax(z[i:j], dim=-1) * z[i:j]).sum(-1)
            logprobs[a:b] = z.gather(-1, targets[a:b, None]).squeeze(-1) - lse[a:b]
            z.sub_(lse[a:b, None])  # log p, in place
        kept = z if len(chunks) == 1 and z is not None else hidden.new_empty(0, dtype=acc)
        ctx.save_for_backward(hidden, weight, targets, lse, ent, kept)
        ctx.entropy, ctx.chunk_bytes = entropy, chunk_bytes
        if not entropy:
            ctx.mark_non_differentiable(ent)
        return logprobs, ent

    @staticmethod
    def backward(ctx: Any, g_logprobs: Tensor | None, g_ent: Tensor | None) -> tuple[Any, ...]:
        if getattr(ctx, "consumed", False):
            raise RuntimeError("chunked_logprobs: its backward runs once (the kept logits are overwritten)")
        ctx.consumed = True
        hidden, weight, targets, lse, ent, kept = ctx.saved_tensors
        n, acc = hidden.shape[0], _accumulation(hidden.dtype)
        chunks = _chunks(n, weight.shape[0], ctx.chunk_bytes)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        # several chunks accumulate the output weight's gradient in fp32; one chunk's is its product alone (no
        # vocabulary-sized zeros, copies and sums: 545 MB each at Qwen2.5's, the same values)
        several = ctx.needs_input_grad[1] and len(chunks) > 1
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if several else None
        use_ent = ctx.entropy and g_ent is not None
        for a, b in chunks:
            # every step in place on one chunk-sized buffer (a second one only for the entropy's gradient)
            logp = kept if kept.numel() else mm(hidden[a:b], weight.t()).to(acc).sub_(lse[a:b, None])
            if use_ent:
                g = logp.exp()
                # dH / dz_j = -p_j (log p_j + H)
                logp.add_(ent[a:b, None]).mul_(g).mul_(-g_ent[a:b, None])
            else:
                g = logp.exp_()
            # d log p_t / dz_j = 1[j = t] - p_j
            g.mul_(-g_logprobs[a:b, None] if g_logprobs is not None else 0.0)
            if g_logprobs is not None:
                g.scatter_add_(-1, targets[a:b, None], g_logprobs[a:b, None])
            if use_ent:
                g.add_(logp)
            g = g.to(hidden.dtype)
            if grad_h is not None:
                grad_h[a:b] = mm(g, weight)
            if ctx.needs_input_grad[1] and not several:
                grad_w = mm(g.t(), hidden[a:b])
            elif several and acc == hidden.dtype:
                grad_w.addmm_(g.t(), hidden[a:b])
            elif several:
                grad_w += mm(g.t(), hidden[a:b]).to(acc)
            del logp, g
        return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None), None, None, None


def chunked_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, entropy: bool = False,
                     chunk_bytes: int = CHUNK_BYTES) -> tuple[Tensor, Tensor | None]:
    """Log-probability of ``targets`` under ``softmax(hidden @ weight.T)`` per row of ``hidden`` ``[N, h]``
    (fp32 ``[N]``, fp64 for fp64 inputs; differentiable in ``hidden`` and ``weight``) and, with ``entropy``, the entropy of each
    row's distribution; at most ``chunk_bytes`` of fp32 logits exist at any time, forward or backward."""
    logprobs, ent = _ChunkedLogprobs.apply(hidden, weight, targets, entropy, chunk_bytes)
    return logprobs, (ent if entropy else None)


def full_logprobs(logits: Tensor, targets: Tensor, entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """The same from materialised ``logits [..., V]`` (the TP > 1 path and the reference of the tests)."""
    logits = logits.to(_accumulation(logits.dtype))
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    norm = torch.logsumexp(logits, dim=-1)
    if not entropy:
        return picked - norm, None
    probs = torch.softmax(logits, dim=-1)
    return picked - norm, norm - (probs * logits).sum(dim=-1)


@contextmanager
def hidden_output(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, ``model``'s output layer returns its input: a forward gives the final hidden
    states ``[B, T, h]`` in place of the logits (the same final norm, no vocabulary projection)."""
    layer = model.output_layer

    def identity(hidden_states: Tensor, weight: Tensor | None = None, runtime_gather_output: Any = None
                 ) -> tuple[Tensor, None]:
        return hidden_states, None

    layer.forward = identity
    try:
        yield
    finally:
        del layer.forward


def output_weight(model: torch.nn.Module) -> Tensor:
    """The vocabulary projection ``[V, h]`` (the input embedding where the two are tied)."""
    if getattr(model, "share_embeddings_and_output_weights", False):
        return model.shared_embedding_or_output_weight()
    return model.output_layer.weight


def packed_seq_params(batch: Mapping[str, Tensor], device: torch.device | str) -> Any:
    """megatron-core's THD ``PackedSeqParams`` of a packed row (:func:`~.microbatch.collate_packed`)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = batch["cu_seqlens"].to(device=device, dtype=torch.int32)
    longest = int(batch["max_seqlen"])
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                           max_seqlen_kv=longest)


def model_forward(model: torch.nn.Module, batch: Mapping[str, Tensor], device: torch.device | str) -> Tensor:
    """``model``'s output ``[B, T, *]`` for a micro-batch: right-padded rows under a causal + key-padding mask,
    or one packed row with positions restarting per sample and attention inside each (THD)."""
    from .model import attention_mask_4d

    ids = batch["input_ids"].to(device)
    if is_packed(batch):
        return model(ids, batch["position_ids"].to(device), attention_mask=None,
                     packed_seq_params=packed_seq_params(batch, device))
    rows, seq = ids.shape
    position_ids = torch.arange(seq, device=ids.device).unsqueeze(0).expand(rows, seq)
    keep = batch.get("attention_mask")
    if causal_suffices(model) and (keep is None or bool((keep[:, 1:] <= keep[:, :-1]).all())):
        # right padding: a real token's query sees only keys before it, all real, so the causal mask alone gives
        # its exact attention (padded queries are masked out of the loss) -- SDPA's causal kernel, no [B, T, T] mask
        return model(ids, position_ids, attention_mask=None)
    mask = attention_mask_4d(keep, rows, seq, ids.device)
    return model(ids, position_ids, attention_mask=mask)


def causal_suffices(model: torch.nn.Module) -> bool:
    """Whether ``model``'s core attention takes no mask for a causal one (SDPA: yes; megatron's local: needs one)."""
    from .attention import SDPAttention

    layers = getattr(getattr(model, "decoder", None), "layers", None)
    return bool(layers) and isinstance(layers[0].self_attention.core_attention, SDPAttention)


def vocab_parallel(model: torch.nn.Module) -> bool:
    """Whether the output layer is split over the vocabulary (TP > 1)."""
    layer = getattr(model, "output_layer", None)
    group = getattr(layer, "tp_group", None)
    return group is not None and group.size() > 1


def batch_logprobs(model: torch.nn.Module, batch: Mapping[str, Tensor], device: torch.device | str,
                   entropy: bool = False, chunk_bytes: int = CHUNK_BYTES) -> tuple[Tensor, Tensor | None]:
    """Next-token log-probs ``[B, T-1]`` of a micro-batch (``[1, N-1]`` packed) and, with ``entropy``, the
    entropies; from chunked logits at TP 1 (:func:`chunked_logprobs`), from the gathered logits at TP > 1.
    Entries whose target is padding or the next sample of a packed row are meaningless: the loss mask drops them."""
    targets = batch["input_ids"][:, 1:].to(device)
    if vocab_parallel(model):
        return full_logprobs(model_forward(model, batch, device)[:, :-1], targets, entropy)
    with hidden_output(model):
        hidden = model_forward(model, batch, device)[:, :-1]
    rows, width, size = hidden.shape
    lp, ent = chunked_logprobs(hidden.reshape(rows * width, size), output_weight(model),
                               targets.reshape(-1), entropy, chunk_bytes)
    return lp.view(rows, width), (ent.view(rows, width) if ent is not None else None)
