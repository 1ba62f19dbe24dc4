"""Plan and execute an in-place DP reshard: who sends which slice of which flat array.

The plan is a pure function of the old and new rank lists and the array layout, so every rank
of the transition computes the same plan without talking to the others.

* Replicated state (parameters; Adam moments without ZeRO) is needed whole by every joining
  rank, so it moves as ONE ``broadcast`` of one contiguous buffer from one holder
  (:func:`broadcast_source`) over the group of that holder and the joiners
  (:func:`broadcast_ranks`): that is the bandwidth bound itself.
* Sharded state (ZeRO-1 Adam moments) moves from the owner of each old slice to the owner of
  each new slice (:func:`plan_reshard`), packed into one message per (source, destination)
  pair (:func:`execute_plan`); what a rank already holds is copied locally.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist

from .optimizer import shard_range


@dataclass(frozen=True)
class Transfer:
    """Send ``array[lo:hi]`` (flat indices) from global rank ``src`` to global rank ``dst``."""

    array: str
    src: int
    dst: int
    lo: int
    hi: int


def holding(ranks: Sequence[int], numel: int, sharded: bool) -> dict[int, tuple[int, int]]:
    """Range of a flat array each rank holds: everything, or its ZeRO-1 slice."""
    ordered = sorted(ranks)
    if not sharded:
        return {r: (0, numel) for r in ordered}
    return {r: shard_range(numel, len(ordered), i) for i, r in enumerate(ordered)}


def _minus(need: tuple[int, int], have: tuple[int, int] | None) -> list[tuple[int, int]]:
    lo, hi = need
    if have is None or have[1] <= lo or have[0] >= hi or have[0] >= have[1]:
        return [(lo, hi)] if lo < hi else []
    parts = []
    if lo < have[0]:
        parts.append((lo, have[0]))
    if have[1] < hi:
        parts.append((have[1], hi))
    return parts


def plan_reshard(old_ranks: Sequence[int], new_ranks: Sequence[int],
                 arrays: Mapping[str, tuple[int, bool]]) -> list[Transfer]:
    """Transfers that give every new rank its range of each array.

    ``arrays`` maps an array name to ``(numel, sharded)``; sharding is with respect to the
    old resp. new DP size.
    """
    old, new = sorted(old_ranks), sorted(new_ranks)
    plan: list[Transfer] = []
    for name, (numel, sharded) in arrays.items():
        before = holding(old, numel, sharded)
        after = holding(new, numel, sharded)
        for k, dst in enumerate(new):
            for lo, hi in _minus(after[dst], before.get(dst)):
                if sharded:
                    for src in old:
                        a, b = max(lo, before[src][0]), min(hi, before[src][1])
                        if a < b:
                            plan.append(Transfer(name, src, dst, a, b))
                    continue
                # Replicated: split the missing range over all old holders, rotated per
                # destination so each holder sends a similar amount.
                n = len(old)
                for j in range(n):
                    src = old[(j + k) % n]
                    a = lo + (hi - lo) * j // n
                    b = lo + (hi - lo) * (j + 1) // n
                    if a < b:
                        plan.append(Transfer(name, src, dst, a, b))
    return plan


def broadcast_source(old_ranks: Sequence[int], new_ranks: Sequence[int]) -> int:
    """The holder that broadcasts replicated state: the first old rank that stays, else the
    first old rank."""
    old, new = sorted(set(old_ranks)), set(new_ranks)
    if not old:
        raise ValueError(f"no old ranks to reshard from (new ranks {sorted(new)})")
    staying = [r for r in old if r in new]
    return staying[0] if staying else old[0]


def broadcast_ranks(old_ranks: Sequence[int], new_ranks: Sequence[int]) -> list[int]:
    """Ranks of the replicated-state broadcast: the source and the joining ranks, or ``[]``
    when no rank joins."""
    joiners = sorted(set(new_ranks) - set(old_ranks))
    if not joiners or not old_ranks:
        return []
    return sorted({broadcast_source(old_ranks, new_ranks), *joiners})


def plan_bytes(plan: Sequence[Transfer], itemsize: int = 4) -> int:
    """Total bytes the plan moves between ranks."""
    return sum((t.hi - t.lo) * itemsize for t in plan)


def execute_plan(plan: Sequence[Transfer], me: int, group: dist.ProcessGroup,
                 sources: Mapping[str, tuple[torch.Tensor, int]],
                 targets: Mapping[str, tuple[torch.Tensor, int]]) -> tuple[int, int]:
    """Run this rank's sends and receives of ``plan`` over ``group``, one message per peer.

    ``sources[name] = (buffer, offset)``: this rank's old holding of the array, where
    ``buffer[0]`` is flat index ``offset``; ``targets`` likewise for the new holding. All
    pieces a rank sends to one peer are packed into one contiguous buffer (no copy when there
    is a single piece) and unpacked on arrival. Returns ``(bytes_sent, bytes_received)``.
    """
    outgoing: dict[int, list[torch.Tensor]] = {}
    incoming: dict[int, list[torch.Tensor]] = {}
    for t in plan:
        if t.src == me and t.dst != me:
            buf, off = sources[t.array]
            outgoing.setdefault(t.dst, []).append(buf[t.lo - off:t.hi - off])
        elif t.dst == me and t.src != me:
            buf, off = targets[t.array]
            incoming.setdefault(t.src, []).append(buf[t.lo - off:t.hi - off])
    ops: list[dist.P2POp] = []
    unpack: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
    sent = received = 0
    for peer, pieces in outgoing.items():
        packed = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        ops.append(dist.P2POp(dist.isend, packed, peer, group))
        sent += packed.numel() * packed.element_size()
    for peer, pieces in incoming.items():
        if len(pieces) == 1:
            packed = pieces[0]
        else:
            packed = torch.empty(sum(p.numel() for p in pieces), dtype=pieces[0].dtype,
                                 device=pieces[0].device)
            unpack.append((packed, pieces))
        ops.append(dist.P2POp(dist.irecv, packed, peer, group))
        received += packed.numel() * packed.element_size()
    exchange(ops, unpack)
    return sent, received


def exchange(ops: Sequence[dist.P2POp], unpack: Sequence[tuple[torch.Tensor, Sequence[torch.Tensor]]]) -> None:
    """Post every send and receive at once, wait for them, then copy each packed receive buffer into
    its pieces (views of any shape, filled in order)."""
    if ops:
        for work in dist.batch_isend_irecv(list(ops)):
            work.wait()
    for packed, pieces in unpack:
        offset = 0
        for piece in pieces:
            piece.copy_(packed[offset:offset + piece.numel()].view(piece.shape))
            offset += piece.numel()


def copy_local(me: int, old_ranks: Sequence[int], new_ranks: Sequence[int], numel: int,
               sharded: bool, source: torch.Tensor | None, target: torch.Tensor) -> None:
    """Copy the overlap of this rank's old and new holding of an array (no communication)."""
    if me not in old_ranks or source is None:
        return
    a0, b0 = holding(old_ranks, numel, sharded)[me]
    a1, b1 = holding(new_ranks, numel, sharded)[me]
    lo, hi = max(a0, a1), min(b0, b1)
    if lo < hi and source.data_ptr() != target.data_ptr():
        target[lo - a1:hi - a1].copy_(source[lo - a0:hi - a0])


def broadcast_json(obj: Any, src: int, group: dist.ProcessGroup) -> Any:
    """Broadcast a JSON-serialisable object from global rank ``src`` (no pickle)."""
    me = dist.get_rank()
    if me == src:
        payload = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(size, src=src, group=group)
    if me != src:
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(payload, src=src, group=group)
    return json.loads(bytes(payload.numpy()).decode())


def encode_tensor(t: torch.Tensor) -> str:
    """A small uint8 tensor (e.g. an RNG state) as base64 text."""
    return base64.b64encode(t.contiguous().numpy().tobytes()).decode()


def decode_tensor(text: str) -> torch.Tensor:
    """Inverse of :func:`encode_tensor`."""
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()
