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
from .reshard import _minus


@dataclass(frozen=True)
class Piece:
    """Parameter ``param``'s split-axis range ``[lo, hi)`` (full coordinates), ``src`` -> ``dst``."""

    param: int
    src: int
    dst: int
    lo: int
    hi: int


def keeps_arrays(rank: int, old: Layout, new: Layout) -> bool:
    """Whether ``rank`` holds the same shards in both layouts with the same TP peers (its arrays
    and model stay; only its DP group may change)."""
    return rank in old and rank in new and old.tp_group(rank) == new.tp_group(rank)


def plan_layout_change(old: Layout, new: Layout, specs: Sequence[ParamSpec]) -> list[Piece]:
    """Pieces that give every rank of ``new`` its shards, from the holders in ``old``."""
    pieces: list[Piece] = []
    for k, dst in enumerate(new.ranks):
        if keeps_arrays(dst, old, new):
            continue
        for i, spec in enumerate(specs):
            need = spec.interval(new.tp, new.tp_rank(dst))
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
        outer, _, inner = specs[p.param].blocks
        total += outer * (p.hi - p.lo) * inner
    return total * arrays * itemsize


class _Shards:
    """Views of one rank's flat arrays as split-axis ranges of each parameter."""

    def __init__(self, arrays: Sequence[torch.Tensor], specs: Sequence[ParamSpec], layout: Layout,
                 rank: int) -> None:
        self.arrays, self.specs, self.layout, self.rank = arrays, specs, layout, rank
        self.offsets = local_offsets(specs, layout.tp)

    def view(self, array: int, param: int, lo: int, hi: int) -> torch.Tensor:
        spec, tp = self.specs[param], self.layout.tp
        off = self.offsets[param]
        local = self.arrays[array][off:off + spec.local_numel(tp)]
        start = spec.interval(tp, self.layout.tp_rank(self.rank))[0]
        return spec.view(local, tp)[:, lo - start:hi - start]


def execute_layout_change(pieces: Sequence[Piece], specs: Sequence[ParamSpec], me: int, old: Layout,
                          new: Layout, group: dist.ProcessGroup,
                          sources: Sequence[torch.Tensor] | None,
                          targets: Sequence[torch.Tensor] | None) -> tuple[int, int]:
    """This rank's part of the plan over ``group``: local copies, then one message per peer.

    ``sources`` are this rank's arrays in ``old`` (None when it held none), ``targets`` its arrays
    in ``new`` (None when it holds none, or when it keeps its arrays). Returns ``(sent, received)``
    bytes.
    """
    src = _Shards(sources, specs, old, me) if sources is not None else None
    dst = _Shards(targets, specs, new, me) if targets is not None else None
    narrays = len(sources if sources is not None else targets or ())
    if dst is not None and src is not None:  # what this rank held of its new shards
        for i, spec in enumerate(specs):
            need = spec.interval(new.tp, new.tp_rank(me))
            have = spec.interval(old.tp, old.tp_rank(me))
            lo, hi = max(need[0], have[0]), min(need[1], have[1])
            if lo < hi:
                for a in range(narrays):
                    dst.view(a, i, lo, hi).copy_(src.view(a, i, lo, hi))
    outgoing: dict[int, list[torch.Tensor]] = {}
    incoming: dict[int, list[torch.Tensor]] = {}
    for p in pieces:
        if p.src == me and p.dst != me:
            assert src is not None
            outgoing.setdefault(p.dst, []).extend(src.view(a, p.param, p.lo, p.hi) for a in range(narrays))
        elif p.dst == me and p.src != me:
            assert dst is not None
            incoming.setdefault(p.src, []).extend(dst.view(a, p.param, p.lo, p.hi) for a in range(narrays))
    ops: list[dist.P2POp] = []
    unpack: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
    sent = received = 0
    for peer, views in outgoing.items():
        packed = torch.cat([v.reshape(-1) for v in views])
        ops.append(dist.P2POp(dist.isend, packed, peer, group))
        sent += packed.numel() * packed.element_size()
    for peer, views in incoming.items():
        packed = torch.empty(sum(v.numel() for v in views), dtype=views[0].dtype, device=views[0].device)
        unpack.append((packed, views))
        ops.append(dist.P2POp(dist.irecv, packed, peer, group))
        received += packed.numel() * packed.element_size()
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    for packed, views in unpack:
        offset = 0
        for v in views:
            v.copy_(packed[offset:offset + v.numel()].view(v.shape))
            offset += v.numel()
    return sent, received
