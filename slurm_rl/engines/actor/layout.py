"""The actor's parallel layout (TP x DP over a rank list) and how each parameter is split over TP.

A :class:`Layout` puts ``tp`` consecutive ranks of the sorted actor rank list into one
tensor-parallel group (megatron-core TP); the ``i``-th ranks of the TP groups form a DP group.
Rank ``ranks[j]`` has TP rank ``j % tp`` and DP rank ``j // tp``.

A :class:`ParamSpec` says which part of the *full* (TP 1) parameter a TP rank holds. megatron-core
splits a parameter along one dimension (``partition_dim``): the vocabulary of the embedding and the
output layer, the rows of ``linear_qkv`` (whole query groups) and ``linear_fc1``, the columns of
``linear_proj`` and ``linear_fc2``; norms are replicated. ``linear_fc1`` stacks gate and up
projections, and a TP rank holds its slice of *each* (``[gate_r; up_r]``): a stride of 2. Viewing
the full tensor as ``[outer, C, inner]`` (``outer`` = the dimensions before the split one times the
stride, ``C`` = the split length per stride block, ``inner`` = the dimensions after it), TP rank
``r`` of ``t`` holds ``[:, r*C/t:(r+1)*C/t, :]`` -- its local tensor, contiguous in that order. A
replicated parameter is ``[1, numel, 1]`` held whole by every TP rank. Every reshard, gather and
shard of this package goes through these three numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

# megatron parameter name suffix -> (partition dim, stride); other parameters are replicated
_SPLITS: tuple[tuple[str, int, int], ...] = (
    ("embedding.word_embeddings.weight", 0, 1),
    ("output_layer.weight", 0, 1),
    ("self_attention.linear_qkv.weight", 0, 1),
    ("self_attention.linear_qkv.bias", 0, 1),
    ("self_attention.linear_proj.weight", 1, 1),
    ("mlp.linear_fc1.weight", 0, 2),
    ("mlp.linear_fc2.weight", 1, 1),
)


@dataclass(frozen=True)
class Layout:
    """``tp`` x ``dp`` over sorted ``ranks``: TP groups of consecutive ranks."""

    ranks: tuple[int, ...]
    tp: int = 1

    def __post_init__(self) -> None:
        ranks = tuple(sorted(set(int(r) for r in self.ranks)))
        object.__setattr__(self, "ranks", ranks)
        if self.tp < 1 or len(ranks) % self.tp:
            raise ValueError(f"actor layout: {len(ranks)} ranks {list(ranks)} do not split into "
                             f"tensor-parallel groups of {self.tp}")

    @property
    def dp(self) -> int:
        """Data-parallel size."""
        return len(self.ranks) // self.tp

    def __contains__(self, rank: int) -> bool:
        return rank in self.ranks

    def tp_rank(self, rank: int) -> int:
        """``rank``'s index in its TP group."""
        return self.ranks.index(rank) % self.tp

    def dp_rank(self, rank: int) -> int:
        """``rank``'s index in its DP group (the index of its TP group)."""
        return self.ranks.index(rank) // self.tp

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """The TP group of ``rank`` (``tp`` consecutive ranks)."""
        start = self.dp_rank(rank) * self.tp
        return self.ranks[start:start + self.tp]

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """The DP group of ``rank``: the ranks with its TP rank."""
        return self.ranks[self.tp_rank(rank)::self.tp]

    def tp_groups(self) -> list[tuple[int, ...]]:
        """Every TP group, in order."""
        return [self.ranks[i:i + self.tp] for i in range(0, len(self.ranks), self.tp)]

    def dp_groups(self) -> list[tuple[int, ...]]:
        """Every DP group, by TP rank."""
        return [self.ranks[r::self.tp] for r in range(self.tp)]

    def describe(self) -> str:
        return f"TP {self.tp} x DP {self.dp} on ranks {list(self.ranks)}"


@dataclass(frozen=True)
class ParamSpec:
    """How one parameter is split over TP (see the module docstring)."""

    name: str
    full_shape: tuple[int, ...]
    dim: int | None  # None: replicated
    stride: int = 1

    @property
    def blocks(self) -> tuple[int, int, int]:
        """``(outer, C, inner)`` of the full tensor."""
        if self.dim is None:
            return 1, math.prod(self.full_shape), 1
        outer = math.prod(self.full_shape[:self.dim]) * self.stride
        return outer, self.full_shape[self.dim] // self.stride, math.prod(self.full_shape[self.dim + 1:])

    @property
    def numel(self) -> int:
        return math.prod(self.full_shape)

    def split(self, tp: int) -> bool:
        """Whether TP ``tp`` splits this parameter."""
        return self.dim is not None and tp > 1

    def interval(self, tp: int, tp_rank: int) -> tuple[int, int]:
        """The ``[lo, hi)`` range of ``C`` held by ``tp_rank`` of ``tp``."""
        _, c, _ = self.blocks
        if not self.split(tp):
            return 0, c
        if c % tp:
            raise ValueError(f"{self.name}: dimension {self.dim} of {list(self.full_shape)} "
                             f"does not split into {tp} tensor-parallel parts")
        return tp_rank * c // tp, (tp_rank + 1) * c // tp

    def local_shape(self, tp: int) -> tuple[int, ...]:
        """The shape a TP rank holds."""
        if not self.split(tp):
            return self.full_shape
        shape = list(self.full_shape)
        assert self.dim is not None
        shape[self.dim] //= tp
        return tuple(shape)

    def local_numel(self, tp: int) -> int:
        return math.prod(self.local_shape(tp))

    def view(self, local: torch.Tensor, tp: int) -> torch.Tensor:
        """``local`` (this parameter at TP ``tp``, any shape) as ``[outer, C/tp, inner]``."""
        outer, c, inner = self.blocks
        lo, hi = self.interval(tp, 0)
        return local.reshape(outer, hi - lo, inner)

    def shard(self, full: torch.Tensor, tp: int, tp_rank: int) -> torch.Tensor:
        """TP rank ``tp_rank``'s part of the full tensor, in its local shape (a copy when split)."""
        if not self.split(tp):
            return full
        outer, c, inner = self.blocks
        lo, hi = self.interval(tp, tp_rank)
        return full.reshape(outer, c, inner)[:, lo:hi].reshape(self.local_shape(tp))

    def unshard(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """The full tensor from the local tensors of TP ranks ``0..len(parts)-1``."""
        tp = len(parts)
        if not self.split(tp):
            return parts[0].reshape(self.full_shape)
        return torch.cat([self.view(p, tp) for p in parts], dim=1).reshape(self.full_shape)


def split_rule(name: str) -> tuple[int, int] | None:
    """``(partition dim, stride)`` of a megatron parameter name, None when replicated."""
    for suffix, dim, stride in _SPLITS:
        if name.endswith(suffix):
            return dim, stride
    return None


def param_specs(named_local: Iterable[tuple[str, Sequence[int]]], tp: int) -> list[ParamSpec]:
    """Specs from ``(name, local shape)`` pairs of a model built at TP ``tp``."""
    specs = []
    for name, shape in named_local:
        rule = split_rule(name)
        full = list(shape)
        if rule is not None:
            full[rule[0]] *= tp
        specs.append(ParamSpec(name, tuple(full), rule[0] if rule else None, rule[1] if rule else 1))
    return specs


def local_offsets(specs: Sequence[ParamSpec], tp: int) -> list[int]:
    """Offset of each parameter in a TP rank's flat buffer (parameters in order, local shapes)."""
    out, total = [], 0
    for s in specs:
        out.append(total)
        total += s.local_numel(tp)
    return out
