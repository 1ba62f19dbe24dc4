"""Plan and execute an in-place change of the actor's layout (TP and DP at once) with its state.

The state of a rank is a list of flat arrays (fp32 master weights, Adam ``exp_avg`` and
``exp_avg_sq``), each the concatenation of the rank's local parameter tensors
(``layout.local_offsets``). A new rank needs, for every parameter, the range ``[lo, hi)`` of the
split axis its new TP rank holds (``ParamSpec.interval``); whatever of it the rank held before is
copied locally, the rest comes from the old holders of that range -- the DP replicas of the old
TP rank(s) that held it, the range split evenly over them (rotated per destination), so a joiner
receives from every replica at once. A rank whose TP group does not change keeps its arrays and
takes part only as a source. The plan is a pure function of the two layouts and the parameter
specs: every rank computes the same plan without talking to the others. All pieces one rank sends
to one peer (over all arrays) travel as one message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from .layout import Layout, ParamSpec, local_offsets
from .reshard import _minus, exchange


WHOLE = -1
"""``Piece.param`` of a piece of a rank's whole local arrays (flat offsets ``[lo, hi)`` of each
array), used when source and destination hold the same TP shard: a DP join."""


@dataclass(frozen=True)
class Piece:
    """Parameter ``param``'s split-axis range ``[lo, hi)`` (full coordinates), ``src`` -> ``dst``;
    with ``param == WHOLE``, the flat range ``[lo, hi)`` of every array."""

    param: int
    src: int
    dst: int
    lo: int
    hi: int


def keeps_arrays(rank: int, old: Layout, new: Layout) -> bool:
    """Whether ``rank`` holds the same shards in both layouts with the same TP peers (its arrays
    and model stay; only its DP group may change)."""
    return rank in old and rank in new and old.tp_group(rank) == new.tp_group(rank)


def local_numel(specs: Sequence[ParamSpec], tp: int) -> int:
    """Elements of one local array at TP ``tp``."""
    return sum(s.local_numel(tp) for s in specs)


def plan_layout_change(old: Layout, new: Layout, specs: Sequence[ParamSpec]) -> list[Piece]:
    """Pieces that give every rank of ``new`` its shards, from the holders in ``old``.

    A rank that needs a TP shard the old layout holds whole (same TP size, same TP rank: a DP
    join) gets the whole local arrays in as many contiguous chunks as there are holders, one
    from each; otherwise per parameter, each range from the holders of the old TP ranks that
    held it, split evenly over their DP replicas."""
    pieces: list[Piece] = []
    for k, dst in enumerate(new.ranks):
        if keeps_arrays(dst, old, new):
            continue
        r2 = new.tp_rank(dst)
        if new.tp == old.tp and not (dst in old and old.tp_rank(dst) == r2):
            holders = old.ranks[r2::old.tp]
            n, total = len(holders), local_numel(specs, new.tp)
            for j in range(n):
                x, y = total * j // n, total * (j + 1) // n
                if x < y:
                    pieces.append(Piece(WHOLE, holders[(j + k) % n], dst, x, y))
            continue
        for i, spec in enumerate(specs):
            need = spec.interval(new.tp, r2)
            have = spec.interval(old.tp, old.tp_rank(dst)) if dst in old else None
            for lo, hi in _minus(need, have):
                old_parts = old.tp if spec.split(old.tp) else 1
                for r1 in range(old_parts):
                    a, b = spec.interval(old.tp, r1)
                    a, b = max(a, lo), min(b, hi)
                    if a >= b:
                        continue
                    holders = old.ranks[r1::old.tp] if spec.split(old.tp) else old.ranks
                    n = len(holders)
                    for j in range(n):
                        x, y = a + (b - a) * j // n, a + (b - a) * (j + 1) // n
                        if x < y:
                            pieces.append(Piece(i, holders[(j + k) % n], dst, x, y))
    return pieces


def pieces_bytes(pieces: Sequence[Piece], specs: Sequence[ParamSpec], arrays: int = 3,
                 itemsize: int = 4) -> int:
    """Bytes the plan moves between ranks."""
    total = 0
    for p in pieces:
        if p.param == WHOLE:
            total += p.hi - p.lo
            continue
        outer, _, inner = specs[p.param].blocks
        total += outer * (p.hi - p.lo) * inner
    return total * arrays * itemsize


class _Side:
    """Where a piece lies in one rank's local arrays (layout ``layout``, rank ``rank``), from the
    specs alone: both ends of a transfer compute both sides' placement without talking."""

    def __init__(self, specs: Sequence[ParamSpec], layout: Layout, rank: int) -> None:
        self.specs, self.layout, self.rank = specs, layout, rank
        self.offsets = local_offsets(specs, layout.tp)

    def run(self, piece: Piece) -> tuple[int, int] | None:
        """``(flat start, length)`` of the piece in each array when it is contiguous there, else None."""
        if piece.param == WHOLE:
            return piece.lo, piece.hi - piece.lo
        spec, tp = self.specs[piece.param], self.layout.tp
        outer, _, inner = spec.blocks
        a, b = spec.interval(tp, self.layout.tp_rank(self.rank))
        if outer != 1 and (piece.lo, piece.hi) != (a, b):
            return None
        return self.offsets[piece.param] + (piece.lo - a) * inner, outer * (piece.hi - piece.lo) * inner

    def view(self, arrays: Sequence[torch.Tensor], array: int, piece: Piece) -> torch.Tensor:
        """The piece in ``arrays[array]`` (strided when not contiguous)."""
        if piece.param == WHOLE:
            return arrays[array][piece.lo:piece.hi]
        spec, tp = self.specs[piece.param], self.layout.tp
        off = self.offsets[piece.param]
        local = arrays[array][off:off + spec.local_numel(tp)]
        start = spec.interval(tp, self.layout.tp_rank(self.rank))[0]
        return spec.view(local, tp)[:, piece.lo - start:piece.hi - start]


def _messages(pieces: Sequence[Piece], src: _Side, dst: _Side, narrays: int) -> list[tuple[bool, list[tuple[int, Piece]]]]:
    """The messages of one (src, dst) pair in order: ``(direct, [(array, piece), ...])``. A direct
    message is one contiguous run on both sides (sent and received in place, no copy); the others
    are packed by the sender and unpacked by the receiver. Both ends compute the same list."""
    out: list[tuple[bool, list[tuple[int, Piece]]]] = []
    ends: tuple[int, int] | None = None  # (src end, dst end) of the open direct message
    for a in range(narrays):
        ends = None
        for p in pieces:
            rs, rd = src.run(p), dst.run(p)
            if rs is not None and rd is not None:
                if out and out[-1][0] and ends == (rs[0], rd[0]):
                    out[-1][1].append((a, p))
                else:
                    out.append((True, [(a, p)]))
                ends = (rs[0] + rs[1], rd[0] + rd[1])
            else:
                if out and not out[-1][0]:
                    out[-1][1].append((a, p))
                else:
                    out.append((False, [(a, p)]))
                ends = None
    return out


def _flat_run(arrays: Sequence[torch.Tensor], side: _Side, items: list[tuple[int, Piece]]) -> torch.Tensor:
    """The contiguous span of a direct message in this rank's array."""
    a, first = items[0]
    start = side.run(first)
    assert start is not None
    length = sum(side.run(p)[1] for _, p in items)  # type: ignore[index]
    return arrays[a][start[0]:start[0] + length]


def execute_layout_change(pieces: Sequence[Piece], specs: Sequence[ParamSpec], me: int, old: Layout,
                          new: Layout, group: dist.ProcessGroup,
                          sources: Sequence[torch.Tensor] | None,
                          targets: Sequence[torch.Tensor] | None) -> tuple[int, int]:
    """This rank's part of the plan over ``group``: local copies, then its messages (see
    :func:`_messages`), all posted at once.

    ``sources`` are this rank's arrays in ``old`` (None when it held none), ``targets`` its arrays
    in ``new`` (None when it holds none, or when it keeps its arrays). Returns ``(sent, received)``
    bytes.
    """
    narrays = len(sources if sources is not None else targets or ())
    if targets is not None and sources is not None:  # what this rank held of its new shards
        src_side, dst_side = _Side(specs, old, me), _Side(specs, new, me)
        for i, spec in enumerate(specs):
            need = spec.interval(new.tp, new.tp_rank(me))
            have = spec.interval(old.tp, old.tp_rank(me))
            lo, hi = max(need[0], have[0]), min(need[1], have[1])
            if lo < hi:
                piece = Piece(i, me, me, lo, hi)
                for a in range(narrays):
                    dst_side.view(targets, a, piece).copy_(src_side.view(sources, a, piece))
    by_pair: dict[tuple[int, int], list[Piece]] = {}
    for p in pieces:
        if p.src != p.dst and me in (p.src, p.dst):
            by_pair.setdefault((p.src, p.dst), []).append(p)
    ops: list[dist.P2POp] = []
    unpack: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
    sent = received = 0
    for (s, d), mine in by_pair.items():
        src, dst = _Side(specs, old, s), _Side(specs, new, d)
        for direct, items in _messages(mine, src, dst, narrays):
            if s == me:
                assert sources is not None
                buf = (_flat_run(sources, src, items) if direct else
                       torch.cat([src.view(sources, a, p).reshape(-1) for a, p in items]))
                ops.append(dist.P2POp(dist.isend, buf, d, group))
                sent += buf.numel() * buf.element_size()
            else:
                assert targets is not None
                if direct:
                    buf = _flat_run(targets, dst, items)
                else:
                    views = [dst.view(targets, a, p) for a, p in items]
                    buf = torch.empty(sum(v.numel() for v in views), dtype=views[0].dtype, device=views[0].device)
                    unpack.append((buf, views))
                ops.append(dist.P2POp(dist.irecv, buf, s, group))
                received += buf.numel() * buf.element_size()
    exchange(ops, unpack)
    return sent, received
