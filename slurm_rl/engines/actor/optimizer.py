"""AdamW over one flat fp32 buffer, DP gradient all-reduce, optional ZeRO-1, global-norm clip.

The model's parameters and gradients are re-pointed at views of two flat buffers
(``FlatParams``), so a DP all-reduce is one collective and a ZeRO-1 shard is a contiguous
slice: with DP size ``d`` and ``N`` parameters, DP rank ``i`` owns ``[i*S, min((i+1)*S, N))``
with ``S = ceil(N / d)``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist

from .lr_schedule import LRScheduleConfig


@dataclass(frozen=True)
class OptimConfig:
    """AdamW hyper-parameters, the sample-driven LR schedule and sharding choice."""

    lr: float = 1e-3
    min_lr: float = 0.0
    lr_warmup_samples: int = 0
    lr_decay_samples: int | None = None
    lr_decay_style: str = "cosine"
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_grad: float | None = 1.0
    zero1: bool = False

    def __post_init__(self) -> None:
        self.schedule()  # validates the schedule fields
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ValueError(f"actor.beta1/beta2: got {self.beta1}, {self.beta2}; "
                             "expected values in [0, 1)")
        if self.clip_grad is not None and self.clip_grad <= 0:
            raise ValueError(f"actor.clip_grad: got {self.clip_grad}, expected > 0 or null")

    def schedule(self) -> LRScheduleConfig:
        """The LR schedule part of this config."""
        return LRScheduleConfig(lr=self.lr, min_lr=self.min_lr,
                                lr_warmup_samples=self.lr_warmup_samples,
                                lr_decay_samples=self.lr_decay_samples,
                                lr_decay_style=self.lr_decay_style)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "OptimConfig":
        """Build from a plain mapping; unknown keys are an error naming the key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"actor.{unknown[0]}: unknown key; allowed: {sorted(known)}")
        return cls(**dict(data))


def shard_range(numel: int, dp_size: int, dp_rank: int) -> tuple[int, int]:
    """The ZeRO-1 slice ``[lo, hi)`` of a flat buffer owned by ``dp_rank``."""
    size = -(-numel // dp_size)
    lo = min(numel, dp_rank * size)
    return lo, min(numel, lo + size)


def _no_decay(name: str, param: torch.Tensor) -> bool:
    return param.dim() < 2 or name.endswith("bias") or "layernorm" in name or "norm" in name


class FlatParams:
    """The model's trainable parameters: an fp32 master copy in one flat buffer, gradients in another.

    In fp32 the model's parameters *are* views of the master buffer. When the model was built in
    bf16 (``actor.precision: bf16``), its parameters are views of a flat bf16 *compute* buffer that
    :meth:`sync_compute` refreshes from the master; each parameter's bf16 gradient is added into the
    fp32 gradient buffer as soon as autograd has accumulated it (a post-accumulate hook) and then
    dropped, so micro-batch gradients are summed in fp32.

    ``slots > 1`` makes the master buffer the first of ``slots`` adjacent ``numel``-sized
    slots of one ``storage`` tensor; the optimizer keeps its (unsharded) Adam moments in slots
    1 and 2, so master weights plus optimizer state are one contiguous buffer that a reshard sends
    as a single message. ``copy_values=False`` skips copying the model's current values (a
    skeleton whose weights are about to be overwritten). ``full_master=False`` (bf16 only) holds no
    fp32 master here: under ZeRO-1 the optimizer keeps only its DP rank's slice of it
    (:attr:`DPAdamW.master`); ``data`` and ``storage`` are then empty.
    """

    def __init__(self, model: torch.nn.Module, slots: int = 1, copy_values: bool = True,
                 full_master: bool = True) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.shapes = [tuple(p.shape) for _, p in named]
        self.offsets: list[int] = []
        total = 0
        for _, p in named:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total
        self.slots = slots
        device = named[0][1].device if named else torch.device("cpu")
        self.compute_dtype = named[0][1].dtype if named else torch.float32
        # A skeleton's storage is zero-filled here so that its pages are resident before a
        # reshard receives into it (faulting them in during the receive made the transfer
        # ~2x slower than the broadcast bound); its gradients are zeroed by train_step.
        self.mixed = self.compute_dtype != torch.float32
        self.full_master = full_master or not self.mixed
        alloc = torch.empty if copy_values else torch.zeros
        self.storage = alloc(slots * total if self.full_master else 0, dtype=torch.float32, device=device)
        self.data = self.storage[:total]
        grad_alloc = torch.zeros if copy_values else torch.empty
        self.grad = grad_alloc(total, dtype=torch.float32, device=device)
        self.compute = (torch.zeros(total, dtype=self.compute_dtype, device=device) if self.mixed
                        else self.data)
        self.params = [p for _, p in named]
        self.decay_segments = [(o, o + p.numel()) for (n, p), o in zip(named, self.offsets)
                               if not _no_decay(n, p)]
        self._hooks = []
        with torch.no_grad():
            for p, off in zip(self.params, self.offsets):
                if copy_values and self.full_master:
                    self.data[off:off + p.numel()].copy_(p.detach().reshape(-1))
                if self.mixed:
                    if copy_values:
                        self.compute[off:off + p.numel()].copy_(p.detach().reshape(-1))
                    p.data = self.compute[off:off + p.numel()].view(p.shape)
                    p.grad = None
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._accumulate(off)))
                else:
                    p.data = self.data[off:off + p.numel()].view(p.shape)
                    p.grad = self.grad[off:off + p.numel()].view(p.shape)

    def _accumulate(self, off: int) -> Any:
        def hook(p: torch.Tensor) -> None:
            assert p.grad is not None
            self.grad[off:off + p.numel()].add_(p.grad.reshape(-1))
            p.grad = None
        return hook

    def sync_compute(self) -> None:
        """Copy the fp32 master weights into the bf16 compute parameters (no-op in fp32, and
        without a full master: the optimizer refreshes its slice and gathers the rest)."""
        if self.mixed and self.full_master:
            with torch.no_grad():
                self.compute.copy_(self.data)

    def slot(self, index: int) -> torch.Tensor:
        """Slot ``index`` of ``storage`` (slot 0 is the parameters)."""
        if not 0 <= index < self.slots:
            raise IndexError(f"slot {index} of a FlatParams with {self.slots} slots")
        return self.storage[index * self.numel:(index + 1) * self.numel]

    def release(self) -> None:
        """Drop the model's references to the flat buffers so that they are freed with this
        object even if the model sits in a reference cycle (no ``gc.collect`` needed)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        empty = torch.empty(0, dtype=torch.float32, device=self.data.device)
        for p in self.params:
            p.data = empty.to(p.dtype)
            p.grad = None
        self.params = []
        self.storage = self.data = self.grad = self.compute = empty

    def zero_grad(self) -> None:
        """Zero gradients, keeping every fp32 ``param.grad`` a view of the flat buffer."""
        self.grad.zero_()
        for p, off in zip(self.params, self.offsets):
            if self.mixed:
                p.grad = None
            elif p.grad is None or p.grad.data_ptr() != self.grad[off:].data_ptr():
                p.grad = self.grad[off:off + p.numel()].view(p.shape)

    def collect_grads(self) -> None:
        """Copy any gradient autograd did not accumulate in place into the flat buffer."""
        for p, off in zip(self.params, self.offsets):
            view = self.grad[off:off + p.numel()]
            if self.mixed:
                if p.grad is not None:  # no hook ran (e.g. a gradient set by hand)
                    view.add_(p.grad.reshape(-1).float())
                    p.grad = None
            elif p.grad is None:
                view.zero_()
                p.grad = view.view(p.shape)
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad.reshape(-1))
                p.grad = view.view(p.shape)

    def named_views(self, flat: torch.Tensor | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, view)`` pairs of ``flat`` (default: the parameters) in parameter shapes."""
        flat = self.data if flat is None else flat
        for name, shape, off in zip(self.names, self.shapes, self.offsets):
            yield name, flat[off:off + math.prod(shape)].view(shape)


class DPAdamW:
    """AdamW with fp32 state over a DP group; ZeRO-1 shards ``exp_avg``/``exp_avg_sq`` (and, in
    bf16, the fp32 master weights: :attr:`master`)."""

    def __init__(self, flat: FlatParams, cfg: OptimConfig, dp_group: dist.ProcessGroup | None,
                 dp_rank: int, dp_size: int, zero_state: bool = True,
                 tp_group: dist.ProcessGroup | None = None,
                 split_segments: Sequence[tuple[int, int]] = ()) -> None:
        """``zero_state=False`` leaves the moments uninitialised (about to be received).

        Under tensor parallelism ``tp_group`` is this rank's TP group and ``split_segments`` the
        ranges of the flat buffer whose parameters TP splits (the others are replicated over TP):
        the global gradient norm sums the split ranges over the TP group and counts the replicated
        ones once."""
        self.flat = flat
        self.cfg = cfg
        self.step_count = 0
        self.tp_group = tp_group
        self.split_segments = list(split_segments)
        self.set_group(dp_group, dp_rank, dp_size)
        lo, hi = self.state_range
        alloc = torch.zeros if zero_state else torch.empty
        if not cfg.zero1 and flat.slots >= 3:  # moments adjacent to the parameters
            self.exp_avg, self.exp_avg_sq = flat.slot(1), flat.slot(2)
            if zero_state:
                self.exp_avg.zero_()
                self.exp_avg_sq.zero_()
        else:
            self.exp_avg = alloc(hi - lo, dtype=torch.float32, device=flat.grad.device)
            self.exp_avg_sq = alloc(hi - lo, dtype=torch.float32, device=flat.grad.device)
        # without a full master (bf16 + ZeRO-1) this rank's own slice of it; set by the caller on a reshard
        self.master_slice: torch.Tensor | None = None
        if not flat.full_master:
            self.master_slice = (flat.compute[lo:hi].float() if zero_state
                                 else torch.empty(hi - lo, dtype=torch.float32, device=flat.grad.device))

    @property
    def master(self) -> torch.Tensor:
        """The fp32 master weights this rank updates (its :attr:`state_range`)."""
        if self.master_slice is not None:
            return self.master_slice
        lo, hi = self.state_range
        return self.flat.data[lo:hi]

    def set_group(self, dp_group: dist.ProcessGroup | None, dp_rank: int, dp_size: int) -> None:
        """Point the optimizer at a (new) DP group; state buffers are replaced by the caller."""
        self.dp_group, self.dp_rank, self.dp_size = dp_group, dp_rank, dp_size

    @property
    def state_range(self) -> tuple[int, int]:
        """The ``[lo, hi)`` range of the flat buffer whose Adam state this rank holds."""
        if self.cfg.zero1:
            return shard_range(self.flat.numel, self.dp_size, self.dp_rank)
        return 0, self.flat.numel

    def allreduce_grads(self) -> None:
        """Sum gradients over the DP group (each rank's loss is already globally normalised)."""
        self.flat.collect_grads()
        if self.dp_size > 1:
            dist.all_reduce(self.flat.grad, op=dist.ReduceOp.SUM, group=self.dp_group)

    def grad_norm(self) -> float:
        """The global L2 norm of the gradients (after the DP all-reduce)."""
        grad = self.flat.grad
        if self.tp_group is None or dist.get_world_size(self.tp_group) == 1:
            return float(torch.linalg.vector_norm(grad, dtype=torch.float64))
        squares = torch.zeros(2, dtype=torch.float64, device=grad.device)
        mask = torch.zeros(grad.numel(), dtype=torch.bool, device=grad.device)
        for a, b in self.split_segments:
            mask[a:b] = True
        squares[0] = grad[mask].double().square().sum()
        squares[1] = grad[~mask].double().square().sum()
        split = squares[:1].clone()
        dist.all_reduce(split, group=self.tp_group)
        return math.sqrt(float(split[0]) + float(squares[1]))

    def clip_grads(self) -> float:
        """Clip by global L2 norm (gradients are full on every DP rank after the all-reduce)."""
        norm = self.grad_norm()
        if self.cfg.clip_grad is not None and math.isfinite(norm) and norm > self.cfg.clip_grad:
            self.flat.grad.mul_(self.cfg.clip_grad / (norm + 1e-6))
        return norm

    @torch.no_grad()
    def step(self, lr: float) -> float:
        """All-reduce, clip, AdamW update of this rank's range, ZeRO-1 all-gather.

        Returns the global gradient norm before clipping.
        """
        self.allreduce_grads()
        norm = self.clip_grads()
        if not math.isfinite(norm):
            raise FloatingPointError(f"gradient norm is {norm} at optimizer step "
                                     f"{self.step_count + 1}")
        self.step_count += 1
        lo, hi = self.state_range
        cfg = self.cfg
        g = self.flat.grad[lo:hi]
        p = self.master
        if cfg.weight_decay:  # decoupled, on the decayed parameters only, before the update (as AdamW)
            for a, b in self.flat.decay_segments:
                a, b = max(a, lo), min(b, hi)
                if a < b:
                    p[a - lo:b - lo].mul_(1.0 - lr * cfg.weight_decay)
        if hasattr(torch, "_fused_adamw_"):
            # torch's fused AdamW kernel (what AdamW(fused=True) runs) over the one flat range: one pass over
            # the parameters, gradients and both moments instead of seven
            step = torch.tensor(float(self.step_count), device=p.device)
            torch._fused_adamw_([p], [g], [self.exp_avg], [self.exp_avg_sq], [], [step], lr=lr, beta1=cfg.beta1,
                                beta2=cfg.beta2, weight_decay=0.0, eps=cfg.eps, amsgrad=False, maximize=False)
        else:
            self.exp_avg.lerp_(g, 1.0 - cfg.beta1)
            self.exp_avg_sq.mul_(cfg.beta2).addcmul_(g, g, value=1.0 - cfg.beta2)
            bc1 = 1.0 - cfg.beta1 ** self.step_count
            bc2 = 1.0 - cfg.beta2 ** self.step_count
            denom = self.exp_avg_sq.sqrt().div_(math.sqrt(bc2)).add_(cfg.eps)
            p.addcdiv_(self.exp_avg, denom, value=-lr / bc1)
        if not self.flat.full_master:
            self.flat.compute[lo:hi].copy_(p)
        if cfg.zero1 and self.dp_size > 1:
            self._gather_params()
        self.flat.sync_compute()
        return norm

    def _gather_params(self) -> None:
        """Every DP rank's updated slice to all: the master (fp32), or without a full master the
        bf16 compute parameters made from each rank's master slice."""
        ranks = dist.get_process_group_ranks(self.dp_group)
        buf = self.flat.data if self.flat.full_master else self.flat.compute
        for i, src in enumerate(ranks):
            a, b = shard_range(self.flat.numel, self.dp_size, i)
            if a < b:
                dist.broadcast(buf[a:b], src=src, group=self.dp_group)
