"""Each rank of a tensor-parallel vLLM engine gets only its shard of the HF-named weights.

vLLM's TP layout of the Llama / Qwen2 / Qwen3 families, per HF tensor: the attention's q / k / v
projections (and their biases) split by heads along dim 0 (k / v replicated where the ranks outnumber
the KV heads: rank ``r`` holds KV head ``r // (tp / kv_heads)``), ``o_proj`` along dim 1, the MLP's
``gate_proj`` / ``up_proj`` along dim 0 and ``down_proj`` along dim 1, the embedding and output layer
by vocabulary rows of the vocabulary padded to a multiple of 64; norms whole on every rank.

:func:`shard_of` cuts a full tensor (the sender's side); :func:`expand_shard` places a received shard
in a zero tensor of the full shape, which vLLM's own loader (``reload_weights``) narrows back to the
rank's part, so only ``1 / tp`` of each split tensor crosses the wire.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch
from torch import Tensor

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE


@dataclass(frozen=True)
class ShardSpec:
    """Where rank ``rank``'s part of one HF tensor lies: ``start:stop`` along ``dim`` (``dim`` None:
    the whole tensor)."""

    dim: int | None
    start: int = 0
    stop: int = 0


def shard_spec(name: str, shape: tuple[int, ...], tp: int, rank: int, heads: int, kv_heads: int) -> ShardSpec:
    """Rank ``rank``'s part of the HF tensor ``name`` of ``shape`` in a TP-``tp`` vLLM engine."""
    if tp == 1 or len(shape) == 0:
        return ShardSpec(None)
    leaf = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else name
    if leaf in ("q_proj", "gate_proj", "up_proj"):
        per = shape[0] // tp
        return ShardSpec(0, rank * per, (rank + 1) * per)
    if leaf in ("k_proj", "v_proj"):
        head_dim = shape[0] // kv_heads
        if kv_heads >= tp:
            per = shape[0] // tp
            return ShardSpec(0, rank * per, (rank + 1) * per)
        head = rank // (tp // kv_heads)
        return ShardSpec(0, head * head_dim, (head + 1) * head_dim)
    if leaf in ("o_proj", "down_proj") and name.endswith("weight"):
        per = shape[1] // tp
        return ShardSpec(1, rank * per, (rank + 1) * per)
    if leaf in ("embed_tokens", "lm_head"):
        per = math.ceil(shape[0] / VOCAB_PADDING) * VOCAB_PADDING // tp
        return ShardSpec(0, min(rank * per, shape[0]), min((rank + 1) * per, shape[0]))
    return ShardSpec(None)


def shard_of(name: str, full: Tensor, tp: int, rank: int, heads: int, kv_heads: int) -> Tensor:
    """The part of ``full`` that rank ``rank`` holds (a contiguous copy; the tensor itself when whole)."""
    spec = shard_spec(name, tuple(full.shape), tp, rank, heads, kv_heads)
    if spec.dim is None:
        return full
    return full.narrow(spec.dim, spec.start, spec.stop - spec.start).contiguous()


def expand_shard(name: str, shard: Tensor, shape: tuple[int, ...], tp: int, rank: int, heads: int,
                 kv_heads: int) -> Tensor:
    """A tensor of the full ``shape``, zero but for the rank's part, which holds ``shard``."""
    spec = shard_spec(name, shape, tp, rank, heads, kv_heads)
    if spec.dim is None:
        return shard
    full = torch.zeros(shape, dtype=shard.dtype, device=shard.device)
    full.narrow(spec.dim, spec.start, spec.stop - spec.start).copy_(shard)
    return full


def expand_shards(shards: Iterable[tuple[str, Tensor]], shapes: dict[str, tuple[int, ...]], tp: int, rank: int,
                  heads: int, kv_heads: int) -> Iterator[tuple[str, Tensor]]:
    """:func:`expand_shard` over named shards (``shapes``: each name's full shape)."""
    for name, shard in shards:
        yield name, expand_shard(name, shard, shapes[name], tp, rank, heads, kv_heads)


def send_shards(named: Iterable[tuple[str, Tensor]], engine_ranks: Sequence[int], heads: int, kv_heads: int,
                group: Any = None, timeout_s: float = 600.0) -> tuple[list[tuple[str, Tensor]], int]:
    """Send every rank of the engine (global ranks ``engine_ranks``, in TP order) its shard of each tensor
    of ``named`` (point to point); returns this rank's own shards, if it is one of them, and the bytes
    sent."""
    import datetime

    import torch.distributed as dist

    from slurm_rl.engines.weight_sync import _wait

    me, tp, own, sent = dist.get_rank(), len(engine_ranks), [], 0
    timeout = datetime.timedelta(seconds=timeout_s)
    for name, full in named:
        for r, dst in enumerate(engine_ranks):
            shard = shard_of(name, full.detach().contiguous(), tp, r, heads, kv_heads)
            if dst == me:
                own.append((name, shard))
                continue
            _wait(dist.isend(shard, dst, group=group), timeout, f"shard of {name} to rank {dst}")
            sent += shard.numel() * shard.element_size()
    return own, sent


def recv_shards(shapes: Mapping[str, tuple[tuple[int, ...], torch.dtype]], src: int, tp: int, rank: int,
                heads: int, kv_heads: int, group: Any = None, timeout_s: float = 600.0
                ) -> tuple[list[tuple[str, Tensor]], int]:
    """Receive from global rank ``src`` this rank's shard (TP rank ``rank``) of each tensor of ``shapes``
    (name -> full shape and dtype, in the sender's order); returns the shards and the bytes received."""
    import datetime

    import torch.distributed as dist

    from slurm_rl.engines.weight_sync import _wait

    out, got = [], 0
    timeout = datetime.timedelta(seconds=timeout_s)
    for name, (shape, dtype) in shapes.items():
        spec = shard_spec(name, tuple(shape), tp, rank, heads, kv_heads)
        part = list(shape)
        if spec.dim is not None:
            part[spec.dim] = spec.stop - spec.start
        buf = torch.empty(part, dtype=dtype)
        _wait(dist.irecv(buf, src, group=group), timeout, f"shard of {name} from rank {src}")
        out.append((name, buf))
        got += buf.numel() * buf.element_size()
    return out, got


__all__ = ["ShardSpec", "expand_shard", "expand_shards", "recv_shards", "send_shards", "shard_of", "shard_spec"]
