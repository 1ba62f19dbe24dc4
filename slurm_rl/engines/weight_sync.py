"""Actor -> rollout weight sync over torch.distributed (bucketed broadcast).

The source rank streams converted (HF-named) tensors into flat buckets of one dtype up to
``bucket_bytes``. Each bucket is preceded by a JSON header (names, shapes, dtype, offsets)
broadcast as a uint8 tensor — no pickling — so receivers need no prior knowledge of the model;
``expected`` (name -> shape) lets them validate what arrived. The last header is ``{"end": true}``.

Before any data moves, all ranks of ``group`` meet in ``monitored_barrier`` (gloo) so a missing
rank is named within ``timeout``; every collective is waited on with the same timeout.
"""

from __future__ import annotations

import datetime
import json
import socket
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from slurm_rl.errors import EngineError

_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}


class WeightSyncError(EngineError, RuntimeError):
    """A weight sync did not complete (missing rank, timeout, mismatched tensors)."""


@dataclass
class SyncStats:
    """Figures of one sync as seen by this rank."""

    bytes: int
    tensors: int
    buckets: int
    seconds: float
    barrier_seconds: float


def _wait(work: Any, timeout: datetime.timedelta, what: str) -> None:
    try:
        ok = work.wait(timeout=timeout)
    except RuntimeError as err:
        raise WeightSyncError(f"{what}: {err}") from err
    if ok is False:
        raise WeightSyncError(f"{what}: timed out after {timeout.total_seconds():.0f}s")


def _bcast(t: Tensor, src: int, group: Any, timeout: datetime.timedelta, what: str) -> None:
    _wait(dist.broadcast(t, src=src, group=group, async_op=True), timeout, what)


def _bcast_json(obj: Any, src: int, group: Any, device: torch.device,
                timeout: datetime.timedelta, what: str) -> Any:
    is_src = dist.get_rank() == src
    raw = json.dumps(obj).encode() if is_src else b""
    n = torch.tensor([len(raw)], dtype=torch.int64, device=device)
    _bcast(n, src, group, timeout, what + " (header length)")
    buf = (torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device) if is_src
           else torch.empty(int(n.item()), dtype=torch.uint8, device=device))
    _bcast(buf, src, group, timeout, what + " (header)")
    return obj if is_src else json.loads(buf.cpu().numpy().tobytes().decode())


def _buckets(named: Iterable[tuple[str, Tensor]], bucket_bytes: int
             ) -> Iterator[list[tuple[str, Tensor]]]:
    bucket: list[tuple[str, Tensor]] = []
    size, dtype = 0, None
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if bucket and (t.dtype != dtype or size + nbytes > bucket_bytes):
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size, dtype = size + nbytes, t.dtype
    if bucket:
        yield bucket


def broadcast_weights(named_tensors: Iterable[tuple[str, Tensor]] | None, src_rank: int,
                      group: Any, expected: Mapping[str, Sequence[int]] | None = None,
                      timeout: float = 300.0, bucket_bytes: int = 64 << 20,
                      device: str | torch.device = "cpu", barrier_group: Any | None = None,
                      what: str = "weight sync") -> tuple[list[tuple[str, Tensor]], SyncStats]:
    """Broadcast ``named_tensors`` from ``src_rank`` (global rank) to every rank of ``group``.

    The source passes its tensors (other ranks pass ``None``) and gets ``[]`` back; receivers
    get the ``(name, tensor)`` list to hand to ``RolloutEngine.update_weights``. ``barrier_group``
    must be a gloo group over the same ranks when ``group`` is NCCL. ``what`` names the sync in
    errors (e.g. ``"weight sync v12"``).
    """
    device = torch.device(device)
    td = datetime.timedelta(seconds=timeout)
    rank = dist.get_rank()
    is_src = rank == src_rank
    if is_src and named_tensors is None:
        raise ValueError(f"{what}: source rank {src_rank} passed no tensors")
    ranks = dist.get_process_group_ranks(group)
    where = (f"{what} on rank {rank} ({socket.gethostname()}), source rank {src_rank}, "
             f"group ranks {ranks}")
    t0 = time.perf_counter()
    try:
        dist.monitored_barrier(group=barrier_group or group, timeout=td, wait_all_ranks=True)
    except RuntimeError as err:
        raise WeightSyncError(f"{where}: not all ranks arrived within {timeout:.0f}s: {err}"
                              ) from err
    t_barrier = time.perf_counter() - t0
    received: list[tuple[str, Tensor]] = []
    total = tensors = buckets = 0
    source = _buckets(named_tensors, bucket_bytes) if is_src else None
    while True:
        bucket = next(source, None) if is_src else None
        if is_src:
            header: dict[str, Any] = {"end": True} if bucket is None else {
                "dtype": str(bucket[0][1].dtype),
                "entries": [[n, list(t.shape)] for n, t in bucket]}
        header = _bcast_json(header if is_src else None, src_rank, group, device, td,
                             f"{where}, bucket {buckets}")
        if header.get("end"):
            break
        dtype = _DTYPES[header["dtype"]]
        numels = [int(torch.Size(s).numel()) for _, s in header["entries"]]
        if is_src:
            flat = torch.cat([t.detach().reshape(-1).to(device) for _, t in bucket])
        else:
            flat = torch.empty(sum(numels), dtype=dtype, device=device)
        _bcast(flat, src_rank, group, td, f"{where}, bucket {buckets} data")
        if not is_src:
            for (name, shape), part in zip(header["entries"], torch.split(flat, numels)):
                received.append((name, part.view(shape)))
        total += flat.numel() * flat.element_size()
        tensors += len(numels)
        buckets += 1
    if expected is not None and not is_src:
        got = {n: tuple(t.shape) for n, t in received}
        want = {n: tuple(s) for n, s in expected.items()}
        if got != want:
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            bad = sorted(n for n in set(got) & set(want) if got[n] != want[n])
            raise WeightSyncError(f"{where}: tensors differ from the expected model: missing "
                                  f"{missing[:5]}, unexpected {extra[:5]}, bad shape {bad[:5]}")
    return received, SyncStats(bytes=total, tensors=tensors, buckets=buckets,
                               seconds=time.perf_counter() - t0, barrier_seconds=t_barrier)
