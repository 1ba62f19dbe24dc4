"""Park tensors' memory in host buffers and restore it in place (warm switching of engines).

When a job's phase is not granted the GPUs, its engines *park*: the contents of every storage
that matters are copied into host buffers (pinned CPU memory when the storage is on CUDA) and the
storage itself is shrunk to zero bytes with ``untyped_storage().resize_(0)``. The tensor objects
(parameters, their views in flat buffers, optimizer moments) are left untouched, so every
reference held by a model or an optimizer stays valid: *unparking* grows the same storages back
and copies the host buffers in. Nothing is rebuilt.

A storage shrunk to zero bytes has a null data pointer, and most torch kernels do not check
storage bounds: touching a parked tensor directly (``t + 1``, ``repr(t)``) may crash the process
instead of raising. Engines therefore refuse their own calls while parked, and
:meth:`HostParking.park` installs forward pre-hooks on the modules it is given so that a forward
raises :class:`ParkedError` instead.

Storages are parked once each however many tensors view them (parameters that are views of one
flat buffer, tied embeddings). ``drop`` storages (gradient buffers that the next step overwrites)
are freed without a copy and come back zero-filled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch
from torch import Tensor

from slurm_rl.engines.errors import EngineError, EngineStateError


class ParkedError(EngineError, RuntimeError):
    """A call that needs an engine's device memory while its state is parked in host memory."""


@dataclass
class _Parked:
    """One parked storage: the storage object (kept alive), its size and its host copy."""

    storage: torch.UntypedStorage
    nbytes: int
    keep: bool  # contents matter: copied to host (else dropped, restored zero-filled)
    host: Tensor | None = None  # uint8 [nbytes] while parked (kept storages)


@dataclass
class _RNGState:
    """torch's global CPU RNG state and, per CUDA device involved, the CUDA RNG state."""

    cpu: Tensor
    cuda: dict[int, Tensor] = field(default_factory=dict)


def _bytes_of(storage: torch.UntypedStorage) -> Tensor:
    """A uint8 tensor over the whole of ``storage`` (valid while its size is unchanged)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _synchronize(devices: Iterable[torch.device]) -> None:
    for dev in {d for d in devices if d.type == "cuda"}:
        torch.cuda.synchronize(dev)


class HostParking:
    """Parks the storages of a set of tensors in host memory and restores them in place.

    ``what`` names the owner in errors (e.g. ``"actor rank 3"``). ``keep_host`` keeps the host
    buffers allocated after :meth:`unpark` so that the next park reuses them (default: only for
    pinned buffers, whose allocation is slow; on CPU the copy is dropped so that the memory is
    not held twice while live).
    """

    def __init__(self, what: str, keep_host: bool | None = None) -> None:
        self.what = what
        self.keep_host = keep_host
        self._parked: dict[int, _Parked] = {}
        self._spare: dict[int, Tensor] = {}  # host buffers kept for reuse, by storage id
        self._hooks: list[Any] = []
        self._rng: _RNGState | None = None
        self._active = False

    # ----------------------------------------------------------------- state
    @property
    def parked(self) -> bool:
        """Whether the tensors are parked (device storage freed, contents in host buffers)."""
        return self._active

    def check_live(self, what: str) -> None:
        """Raise :class:`ParkedError` naming ``what`` if the tensors are parked."""
        if self._active:
            raise ParkedError(f"{self.what}: {what} called while its state is parked in host "
                              "memory (device storage freed); call unpark() first")

    # ----------------------------------------------------------------- park / unpark
    def park(self, keep: Iterable[Tensor], drop: Iterable[Tensor] = (),
             guard: Iterable[torch.nn.Module] = (), rng: bool = False) -> dict[str, float]:
        """Copy the storages of ``keep`` to host buffers, then free them and those of ``drop``.

        Storages are shrunk in place to zero bytes; a storage both kept and dropped is kept;
        empty storages are skipped. ``guard`` modules get a forward pre-hook raising
        :class:`ParkedError` until :meth:`unpark`. ``rng=True`` also saves torch's global CPU
        RNG state and the CUDA RNG state of every CUDA device involved; :meth:`unpark` restores
        them. Every storage is checked to be resizable before anything is changed. On CUDA the
        freed blocks are returned to the driver (``torch.cuda.empty_cache``).

        Returns ``bytes`` (copied to host), ``device_bytes`` (storage bytes released, copied or
        dropped) and ``seconds``. A no-op returning zeros when already parked.
        """
        if self._active:
            return {"bytes": 0.0, "device_bytes": 0.0, "seconds": 0.0}
        t0 = time.perf_counter()
        kept: dict[int, torch.UntypedStorage] = {}
        dropped: dict[int, torch.UntypedStorage] = {}
        for target, tensors in ((kept, keep), (dropped, drop)):
            for t in tensors:
                storage = t.untyped_storage()
                if storage.nbytes() > 0:
                    target.setdefault(storage._cdata, storage)
        for key in kept:
            dropped.pop(key, None)
        for storage in (*kept.values(), *dropped.values()):
            if not storage.resizable():
                raise ValueError(f"{self.what}: cannot park a tensor whose storage is not "
                                 f"resizable ({storage.nbytes()} bytes on {storage.device})")
        devices = [s.device for s in (*kept.values(), *dropped.values())]
        parked = {k: _Parked(st, st.nbytes(), True) for k, st in kept.items()}
        parked.update({k: _Parked(st, st.nbytes(), False) for k, st in dropped.items()})
        spare, self._spare = self._spare, {}  # buffers of storages not parked now are let go
        try:
            for key, entry in parked.items():
                if entry.keep:
                    entry.host = self._copy_out(entry, spare.pop(key, None))
                    if not entry.host.is_pinned():  # synchronous copy: free the source now
                        entry.storage.resize_(0)
            _synchronize(devices)  # host copies complete before their sources are freed
        except BaseException:
            for entry in parked.values():  # leave everything as it was
                if entry.host is not None and entry.storage.nbytes() == 0:
                    self._copy_in(entry)
            raise
        for entry in parked.values():
            if entry.storage.nbytes():
                entry.storage.resize_(0)
        if any(d.type == "cuda" for d in devices):
            torch.cuda.empty_cache()
        if rng:
            self._rng = _RNGState(cpu=torch.get_rng_state(), cuda={
                d.index if d.index is not None else torch.cuda.current_device():
                torch.cuda.get_rng_state(d) for d in set(devices) if d.type == "cuda"})
        self._parked = parked
        self._hooks = [m.register_forward_pre_hook(self._refuse_forward) for m in guard]
        self._active = True
        return {"bytes": float(sum(p.nbytes for p in parked.values() if p.keep)),
                "device_bytes": float(sum(p.nbytes for p in parked.values())),
                "seconds": time.perf_counter() - t0}

    def unpark(self) -> dict[str, float]:
        """Grow every parked storage back in place, copy its host buffer in (zero-fill a dropped
        one), restore the RNG state saved by :meth:`park` and remove the forward guards.

        If growing a storage fails (e.g. out of device memory) the storages already grown are
        freed again and the state stays parked. Returns ``bytes`` (copied back),
        ``device_bytes`` (storage bytes allocated again) and ``seconds``. A no-op returning
        zeros when not parked.
        """
        if not self._active:
            return {"bytes": 0.0, "device_bytes": 0.0, "seconds": 0.0}
        t0 = time.perf_counter()
        entries = list(self._parked.values())
        devices = [p.storage.device for p in entries]
        try:
            for entry in entries:
                self._copy_in(entry)
                if entry.host is not None and not entry.host.is_pinned() and not self.keep_host:
                    entry.host = None  # synchronous copy: do not hold the memory twice
            _synchronize(devices)  # contents in place before the host buffers are reused/freed
        except BaseException:  # stay parked: free what was grown again
            for entry in entries:
                if entry.keep and entry.host is None:  # its host copy was let go: copy again
                    entry.host = self._copy_out(entry, None)
            _synchronize(devices)
            for entry in entries:
                if entry.storage.nbytes():
                    entry.storage.resize_(0)
            if any(d.type == "cuda" for d in devices):
                torch.cuda.empty_cache()
            raise
        keep = self.keep_host
        self._spare = {k: p.host for k, p in self._parked.items() if p.host is not None
                       and (keep if keep is not None else p.host.is_pinned())}
        self._restore_rng()
        self._finish()
        return {"bytes": float(sum(p.nbytes for p in entries if p.keep)),
                "device_bytes": float(sum(p.nbytes for p in entries)),
                "seconds": time.perf_counter() - t0}

    def discard(self) -> None:
        """Forget the parked state: drop the host copies and guards, leave the storages freed.

        For an owner that is dropping the parked tensors altogether (nothing to restore).
        """
        self._rng = None
        self._spare = {}
        self._finish()

    # ----------------------------------------------------------------- host copies
    def host_view(self, t: Tensor) -> Tensor:
        """While parked: the host copy of ``t`` (same dtype, shape, strides and offset).

        Writes into it are what :meth:`unpark` restores. Raises ``EngineStateError`` when not
        parked and ``KeyError`` when ``t``'s storage was not parked with a host copy.
        """
        if not self._active:
            raise EngineStateError(f"{self.what}: host_view called while not parked")
        entry = self._parked.get(t.untyped_storage()._cdata)
        if entry is None or entry.host is None:
            raise KeyError(f"{self.what}: tensor of shape {tuple(t.shape)} was not parked "
                           "with a host copy")
        return torch.empty(0, dtype=t.dtype).set_(entry.host.untyped_storage(),
                                                  t.storage_offset(), t.size(), t.stride())

    # ----------------------------------------------------------------- internals
    @staticmethod
    def _copy_out(entry: _Parked, host: Tensor | None) -> Tensor:
        """Copy ``entry``'s storage into ``host`` (a new buffer, pinned for CUDA, when None or
        of another size); asynchronous for a pinned buffer."""
        storage = entry.storage
        if host is None or host.numel() != entry.nbytes:
            host = torch.empty(entry.nbytes, dtype=torch.uint8,
                               pin_memory=storage.device.type == "cuda")
        host.copy_(_bytes_of(storage), non_blocking=host.is_pinned())
        return host

    @staticmethod
    def _copy_in(entry: _Parked) -> None:
        """Grow ``entry``'s storage back and fill it from its host copy (zeros when dropped)."""
        entry.storage.resize_(entry.nbytes)
        data = _bytes_of(entry.storage)
        if entry.host is None:
            data.zero_()
        else:
            data.copy_(entry.host, non_blocking=entry.host.is_pinned())

    def _refuse_forward(self, module: torch.nn.Module, args: Any) -> None:
        self.check_live(f"forward of {type(module).__name__}")

    def _restore_rng(self) -> None:
        if self._rng is None:
            return
        torch.set_rng_state(self._rng.cpu)
        for index, state in self._rng.cuda.items():
            torch.cuda.set_rng_state(state, index)
        self._rng = None

    def _finish(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._parked = {}
        self._active = False
