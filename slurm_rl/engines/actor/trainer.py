"""ActorTrainer: one optimizer step per mini-batch and in-place DP resharding.

Every rank that may ever hold the actor creates an ``ActorTrainer``; ranks outside the
current actor rank list are *inactive* until a reshard adds them. An inactive rank holds no model
unless it was *warmed* (:meth:`ActorTrainer.warm`): then its model skeleton, flat buffers and
optimizer buffers are allocated and paged in ahead of time, so joining costs the transfer only.

An active rank whose job is not granted the devices *parks* (:meth:`ActorTrainer.park`): its
parameters and optimizer state go to host memory and the device storage is freed in place; it
*unparks* into the same model, optimizer and process groups when granted again.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from slurm_rl.engines.errors import ReshardError
from slurm_rl.engines.model_config import ModelConfig
from slurm_rl.engines.parking import HostParking, ParkedError  # noqa: F401 (re-exported)
from slurm_rl.errors import EngineError, WaitTimeout
from slurm_rl.rl.losses import LossAggregation

from .groups import GroupCache
from .lr_schedule import SampleLRScheduler
from .microbatch import BatchConfig, check_dp_size, collate_for, split_microbatches, token_and_sequence_counts
from .layout import Layout, ParamSpec, local_offsets, param_specs
from .layout_reshard import execute_layout_change, keeps_arrays, pieces_bytes, plan_layout_change
from .logprobs import batch_logprobs
from .model import build_gpt_model, preload_megatron
from .optimizer import DPAdamW, FlatParams, OptimConfig, shard_range
from .reshard import (broadcast_json, broadcast_ranks, broadcast_source, copy_local,
                      decode_tensor, encode_tensor, execute_plan, holding, plan_bytes,
                      plan_reshard)

LossFn = Callable[[torch.Tensor, dict[str, torch.Tensor]],
                  "torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]"]
"""``(logprobs [B, T-1], batch) -> per-token loss [B, T-1]``, or ``(per-token loss, {name: per-token
diagnostic})``. The trainer multiplies by ``batch["loss_mask"]``, sums, and divides by the mini-batch's
global token count."""


def _split(out: "torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A loss function's per-token loss and its diagnostics (none when it returns the loss alone)."""
    return out if isinstance(out, tuple) else (out, {})


class ReshardTimeoutError(EngineError, WaitTimeout):
    """Ranks of a reshard did not all arrive within the timeout."""


class InactiveActorError(EngineError, RuntimeError):
    """A training call on a rank that does not hold the actor."""


def drop_megatron_scratch() -> int:
    """Drop megatron-core's process-wide scratch buffers (the attention matmul input of
    ``DotProductAttention``, sized by the largest batch seen); megatron allocates them again on
    the next forward and overwrites them before reading. Returns the bytes dropped."""
    from megatron.core import parallel_state

    pool = getattr(parallel_state, "_GLOBAL_MEMORY_BUFFER", None)
    if pool is None:
        return 0
    nbytes = sum(t.numel() * t.element_size() for t in pool.buffer.values())
    pool.buffer.clear()
    return nbytes


def nll_loss(logprobs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-token negative log-likelihood (supervised loss)."""
    return -logprobs


class ActorTrainer:
    """Trains the megatron-core GPT actor over an explicit DP group and reshards it in place.

    The DP group is created on first use by its members (``GroupCache.get``). ``stay_warm=True``
    warms a non-member at construction (:meth:`warm`) and keeps a leaving rank's buffers.
    """

    control_via_store: bool | None = None
    """Reshard arrival barrier and metadata through the world's store instead of the union
    group; None: only when the group is not gloo (``monitored_barrier`` is gloo-only and the
    metadata travels as CPU tensors)."""

    def __init__(self, model_cfg: ModelConfig, optim_cfg: OptimConfig, batch_cfg: BatchConfig,
                 ranks: Sequence[int], group_cache: GroupCache, seed: int,
                 device: str = "cpu", stay_warm: bool = False,
                 checkpoint: str | None = None, tp: int = 1, precision: str = "fp32",
                 recompute: str = "none", attention: str = "sdpa") -> None:
        self.tp = int(tp)
        self.precision, self.recompute, self.attention = precision, recompute, attention
        check_dp_size(batch_cfg, Layout(tuple(ranks), self.tp).dp)
        self.model_cfg, self.optim_cfg, self.batch_cfg = model_cfg, optim_cfg, batch_cfg
        self.group_cache = group_cache
        self.seed = seed
        self.checkpoint = checkpoint  # HF checkpoint directory of the initial weights (None: random by seed)
        self.device = device
        self.me = dist.get_rank()
        self.ranks: list[int] = sorted(set(ranks))
        self.scheduler = SampleLRScheduler(optim_cfg.schedule())
        self.generator = torch.Generator().manual_seed(seed)
        self.data_state: dict[str, Any] = {}
        self.model: torch.nn.Module | None = None
        self.flat: FlatParams | None = None
        self.optimizer: DPAdamW | None = None
        self.dp_group: dist.ProcessGroup | None = None
        self.tp_group: dist.ProcessGroup | None = None
        self.specs: list[ParamSpec] = []
        self.stay_warm = stay_warm
        self._parking = HostParking(f"rank {self.me} on {socket.gethostname()} (actor)")
        self._active = self.me in self.ranks
        if self._active:
            self._join_groups(self.layout, "actor groups")
            self._build(initialize=True)
            self.optimizer = self._make_optimizer(zero_state=True)
        else:
            # Import megatron now so that joining the actor later costs a skeleton build, not
            # the first import of megatron-core (tens of seconds on a loaded node).
            preload_megatron(device)
            if stay_warm:
                self.warm()

    # ----------------------------------------------------------------- properties
    @property
    def active(self) -> bool:
        """Whether this rank currently holds the actor (a warm skeleton does not count)."""
        return self._active

    @property
    def parked(self) -> bool:
        """Whether this rank's actor state is parked in host memory (see :meth:`park`)."""
        return self._parking.parked

    @property
    def warm_ready(self) -> bool:
        """Whether an inactive rank holds a warm skeleton (joining skips the build)."""
        return not self._active and self.model is not None

    @property
    def sharded_master(self) -> bool:
        """Whether each DP rank keeps only its ZeRO-1 slice of the fp32 master (bf16 + ZeRO-1)."""
        return self.precision == "bf16" and self.optim_cfg.zero1

    @property
    def layout(self) -> Layout:
        """The actor's current layout (TP x DP over its ranks)."""
        return Layout(tuple(self.ranks), self.tp)

    @property
    def dp_size(self) -> int:
        """Current DP size of the actor."""
        return len(self.ranks) // self.tp

    @property
    def dp_rank(self) -> int:
        """This rank's DP rank (the index of its TP group)."""
        return self.layout.dp_rank(self.me)

    @property
    def tp_rank(self) -> int:
        """This rank's TP rank."""
        return self.layout.tp_rank(self.me)

    @property
    def consumed_samples(self) -> int:
        """Samples consumed by optimizer steps so far (drives the LR schedule)."""
        return self.scheduler.consumed_samples

    @property
    def step(self) -> int:
        """Optimizer steps done."""
        return self.optimizer.step_count if self._active and self.optimizer else self._step

    _step = 0

    def _require_active(self, what: str) -> None:
        if not self.active:
            raise InactiveActorError(f"rank {self.me} on {socket.gethostname()}: {what} "
                                     f"called but this rank is not an actor rank {self.ranks}")

    def _require_live(self, what: str) -> None:
        """Active and not parked: ``InactiveActorError`` or ``ParkedError`` naming ``what``."""
        self._require_active(what)
        self._parking.check_live(what)

    def _join_groups(self, layout: Layout, what: str) -> None:
        """Create (in one order on every rank) and adopt this rank's TP and DP groups of ``layout``."""
        sets = [*(layout.tp_groups() if layout.tp > 1 else []), *layout.dp_groups()]
        self.group_cache.ensure(sets, what)
        self.tp_group = (self.group_cache.get(layout.tp_group(self.me), "actor TP group")
                         if layout.tp > 1 else None)
        self.dp_group = self.group_cache.get(layout.dp_group(self.me), "actor DP group")

    def _new_model(self, tp: int, initialize: bool, tp_group: dist.ProcessGroup | None = None
                   ) -> tuple[torch.nn.Module, FlatParams]:
        """This rank's model at TP ``tp`` over ``tp_group`` (default: its TP group) and its flat
        buffers."""
        load = initialize and self.checkpoint is not None
        tp_group = tp_group if tp_group is not None else self.tp_group
        model = self._build_model(tp_group if tp > 1 else None, initialize, load)
        if load:
            from slurm_rl.engines.hf_checkpoint import load_into_megatron

            tp_rank = self.tp_rank
            specs = {s.name: s for s in self._specs_of(model, tp)}
            self.load_figures = load_into_megatron(
                model, self.checkpoint, self.model_cfg,
                shard=lambda name, full: specs[name].shard(full, tp, tp_rank), skip=self.not_in_checkpoint)
        # Without ZeRO-1 the Adam moments live in slots 1-2 next to the parameters, so a
        # reshard broadcasts parameters and optimizer state as one buffer.
        flat = FlatParams(model, slots=1 if self.optim_cfg.zero1 else 3, copy_values=initialize,
                          full_master=not self.sharded_master)
        return model, flat

    not_in_checkpoint: tuple[str, ...] = ()
    """Parameters the initial HF checkpoint does not hold (kept from their seeded init)."""

    def _build_model(self, tp_group: dist.ProcessGroup | None, initialize: bool, load: bool) -> torch.nn.Module:
        """The megatron-core model of this rank (a checkpoint is about to be loaded into it: ``load``)."""
        return build_gpt_model(self.model_cfg, self.seed, self.device, tp_group=tp_group,
                               initialize=initialize and not load, precision=self.precision,
                               recompute=self.recompute, attention=self.attention)

    def _forward(self, batch: Mapping[str, torch.Tensor], entropy: bool
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the loss reads per next-token position of a micro-batch: the log-probs of the tokens
        (and the policy's entropy, when asked)."""
        return batch_logprobs(self.model, batch, self.device, entropy)

    @staticmethod
    def _specs_of(model: torch.nn.Module, tp: int) -> list[ParamSpec]:
        return param_specs(((n, p.shape) for n, p in model.named_parameters() if p.requires_grad), tp)

    def _build(self, initialize: bool) -> None:
        self.model, self.flat = self._new_model(self.tp, initialize)
        self.specs = self._specs_of(self.model, self.tp)

    def _make_optimizer(self, zero_state: bool) -> DPAdamW:
        """AdamW over this rank's flat buffers, DP group and (under TP) TP group."""
        assert self.flat is not None
        offsets = local_offsets(self.specs, self.tp)
        split = [(o, o + s.local_numel(self.tp)) for s, o in zip(self.specs, offsets) if s.split(self.tp)]
        return DPAdamW(self.flat, self.optim_cfg, self.dp_group, self.dp_rank, self.dp_size,
                       zero_state=zero_state, tp_group=self.tp_group, split_segments=split)

    def _build_skeleton(self, dp_rank: int, dp_size: int) -> None:
        """Model skeleton, flat buffers and (uninitialised) optimizer of a joining rank."""
        self._build(initialize=False)
        assert self.flat is not None
        self.optimizer = DPAdamW(self.flat, self.optim_cfg, None, dp_rank, dp_size,
                                 zero_state=False)

    def warm(self, dp_size: int | None = None) -> float:
        """Prepare this non-member to join the actor: build the skeleton, flat buffers and
        optimizer buffers now and page them in, so a later :meth:`reshard` that adds this rank
        only receives state (``build_seconds`` ~0). Also makes :meth:`free` keep them when this
        rank leaves the actor again. ZeRO-1 moment shards are sized for ``dp_size`` (default:
        the current DP size + 1) and reused when the join gives this rank that size.

        The rank stays inactive: training and state calls raise ``InactiveActorError`` until a
        reshard adds it. Returns the seconds spent (0 when already warm or active).
        """
        self.stay_warm = True
        if self.model is not None or self.tp > 1 or self.sharded_master:  # joining builds: see _change_layout
            return 0.0
        t0 = time.perf_counter()
        self._build_skeleton(0, dp_size or self.dp_size + 1)
        assert self.flat is not None and self.optimizer is not None
        # FlatParams zero-fills a skeleton's storage (parameters and, without ZeRO-1, the Adam
        # moments); page in the gradients and ZeRO-1 moment shards too.
        self.flat.grad.zero_()
        if self.optim_cfg.zero1:
            self.optimizer.exp_avg.zero_()
            self.optimizer.exp_avg_sq.zero_()
        return time.perf_counter() - t0

    # ----------------------------------------------------------------- training
    def train_step(self, samples: Sequence[Mapping[str, Any]],
                   loss_fn: LossFn = nll_loss, aggregation: LossAggregation | None = None,
                   entropy: bool = False, schedule_samples: int | None = None) -> dict[str, float]:
        """One optimizer step on this DP rank's share of the mini-batch.

        ``samples`` is this rank's contiguous ``global_batch_size / dp`` share (see
        ``microbatch.shard_for_rank``). Collective over the DP group. ``aggregation``: how the
        per-token losses become the step's loss (default token mean), over the global mini-batch
        whatever its split into micro-batches and DP ranks. ``entropy``: each micro-batch's
        per-token entropy goes to ``loss_fn`` as ``batch["entropy"]`` (differentiable) and its
        token mean over the step is returned as ``entropy``. ``loss_fn`` may return ``(per-token loss,
        {name: per-token diagnostic})``: each diagnostic's token mean over the step is returned under its
        name (as ``entropy``'s). ``schedule_samples``: how far the step moves
        the LR schedule (default ``global_batch_size``; 0 for another pass over samples already counted,
        ``actor.ppo_epochs``: the schedule counts each sample once). Returns ``loss``, ``grad_norm``, ``lr``,
        ``consumed_samples``, ``step``, ``tokens`` and ``micro_batches`` (this rank's).
        """
        self._require_live("train_step")
        share = self.batch_cfg.global_batch_size // self.dp_size
        if len(samples) != share:
            raise ValueError(f"rank {self.me}: train_step got {len(samples)} samples, expected "
                             f"{share} (global_batch_size {self.batch_cfg.global_batch_size} / "
                             f"DP {self.dp_size})")
        assert self.model is not None and self.flat is not None and self.optimizer is not None
        agg = aggregation or LossAggregation()
        batches = [collate_for(self.batch_cfg, mb) for mb in split_microbatches(samples, self.batch_cfg)]
        counts = torch.tensor([sum(c) for c in zip(*map(token_and_sequence_counts, batches))],
                              dtype=torch.float64, device=self.device)
        if self.dp_size > 1:
            dist.all_reduce(counts, group=self.dp_group)
        global_tokens, global_sequences = float(counts[0].item()), float(counts[1].item())
        if global_tokens <= 0:
            raise ValueError(f"rank {self.me}: mini-batch at step {self.step + 1} has no "
                             "loss tokens")
        denominator = agg.denominator(global_tokens, global_sequences)
        self.model.train()
        self.flat.zero_grad()
        loss_sum = torch.zeros(2, dtype=torch.float64, device=self.device)  # loss, entropy (token sum)
        names: list[str] = []  # the loss's per-token diagnostics (token sums, in loss_sum[2:])
        for batch in batches:
            logprobs, ent = self._forward(batch, entropy)
            mask = batch["loss_mask"].to(logprobs.device)
            if ent is not None:
                batch = {**batch, "entropy": ent}
                loss_sum[1] += (ent.detach() * mask).sum()  # a device op: no host sync per micro-batch
            token_loss, diagnostics = _split(loss_fn(logprobs, batch))
            if diagnostics and not names:
                names = sorted(diagnostics)
                loss_sum = torch.cat([loss_sum, loss_sum.new_zeros(len(names))])
            for i, name in enumerate(names):
                loss_sum[2 + i] += (diagnostics[name].detach() * mask).sum()
            weights = agg.weights(batch["loss_mask"], batch.get("segment_ids")).to(token_loss.device)
            total = (token_loss * weights).sum()
            (total / denominator).backward()
            loss_sum[0] += total.detach()
        if self.dp_size > 1:
            dist.all_reduce(loss_sum, group=self.dp_group)
        step_samples = self.batch_cfg.global_batch_size if schedule_samples is None else schedule_samples
        lr = self.scheduler.lr_for_step(step_samples)
        grad_norm = self.optimizer.step(lr)
        if step_samples:  # a later pass over counted samples (actor.ppo_epochs) leaves the schedule where it is
            self.scheduler.advance(step_samples)
        stats = {"entropy": float(loss_sum[1].item()) / global_tokens} if entropy else {}
        stats.update({name: float(loss_sum[2 + i].item()) / global_tokens for i, name in enumerate(names)})
        return {**stats, "loss": float(loss_sum[0].item()) / denominator, "grad_norm": grad_norm,
                "lr": lr, "consumed_samples": float(self.consumed_samples),
                "step": float(self.step), "tokens": global_tokens,
                "micro_batches": float(len(batches))}

    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) parameters by megatron name, for actor -> rollout weight sync.

        While parked these are views of the host copies (CPU tensors, pinned on CUDA): the
        weights can be sent to rollout ranks while the actor is off the device.
        """
        yield from self.full_parameters() or ()

    def full_parameters(self) -> list[tuple[str, torch.Tensor]] | None:
        """Full (unsharded) parameters by megatron name in the compute dtype (bf16 under
        ``precision: bf16``): on TP rank 0, None on the other TP ranks. Collective over this rank's
        TP group (each tensor gathered from its shards); no communication at TP 1."""
        self._require_active("full_parameters")
        assert self.flat is not None
        flat = self.flat.compute
        if self._parking.parked:
            flat = self._parking.host_view(flat)
        parts = self._tp_gather([flat])
        if parts is None:
            return None
        return self._unshard(parts[0])

    def _tp_gather(self, arrays: Sequence[torch.Tensor]) -> list[list[torch.Tensor]] | None:
        """Each of ``arrays`` from every TP rank (``[array][tp_rank]``) on TP rank 0; None elsewhere."""
        if self.tp == 1:
            return [[a] for a in arrays]
        root = self.layout.tp_group(self.me)[0]
        out: list[list[torch.Tensor]] = []
        for a in arrays:
            a = a.to(self.device)
            parts = [torch.empty_like(a) for _ in range(self.tp)] if self.me == root else None
            dist.gather(a, parts, dst=root, group=self.tp_group)
            out.append(parts or [])
        return out if self.me == root else None

    def _unshard(self, parts: Sequence[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        """Full tensors by name from the flat arrays of every TP rank."""
        offsets = local_offsets(self.specs, self.tp)
        out = []
        for spec, off in zip(self.specs, offsets):
            n = spec.local_numel(self.tp)
            out.append((spec.name, spec.unshard([p[off:off + n] for p in parts])))
        return out

    # ----------------------------------------------------------------- warm switching
    def park(self) -> dict[str, float]:
        """Park this rank's actor state in host memory and free its device memory in place.

        Parameters (with the Adam moments that share their flat buffer) and the optimizer's
        moments are copied to host buffers (pinned on CUDA); then their storages, and that of the
        gradient buffer (rewritten by the next step, so not copied: it comes back zeroed), are
        shrunk to zero bytes. The tensor objects stay the same, so the model, the optimizer and
        the process groups are reused by :meth:`unpark` without any rebuild. Python-side state
        (step, consumed samples, LR schedule position, ``generator``, data state) is untouched;
        torch's global CPU RNG state (and the CUDA one on CUDA) is saved and restored by
        :meth:`unpark`. Local to this rank (no collective): every rank of the actor parks its own
        state. megatron-core's process-wide attention scratch buffer is dropped (not copied: it
        is re-created on the next forward); its size is returned as ``scratch_bytes``.

        While parked, :meth:`train_step`, :meth:`reshard`, :meth:`state_dict` and
        :meth:`load_state_dict` raise ``ParkedError``, a forward of the model raises too, and
        :meth:`named_parameters_for_sync` reads the host copies. Returns ``bytes`` (copied to
        host), ``device_bytes`` (freed: copied or dropped), ``scratch_bytes`` and ``seconds``;
        all zero on an inactive rank or when already parked.
        """
        if not self._active or self._parking.parked:
            return {"bytes": 0.0, "device_bytes": 0.0, "scratch_bytes": 0.0, "seconds": 0.0}
        assert self.model is not None and self.flat is not None and self.optimizer is not None
        t0 = time.perf_counter()
        scratch = drop_megatron_scratch()  # before the park, whose empty_cache returns it too
        opt = self.optimizer
        keep = [self.flat.storage, opt.exp_avg, opt.exp_avg_sq,
                *([opt.master_slice] if opt.master_slice is not None else []),
                *self.model.parameters(), *self.model.buffers()]
        drop = [self.flat.grad, *(p.grad for p in self.model.parameters() if p.grad is not None)]
        figures = self._parking.park(keep, drop, guard=[self.model], rng=True)
        return {**figures, "scratch_bytes": float(scratch), "seconds": time.perf_counter() - t0}

    def unpark(self) -> dict[str, float]:
        """Restore what :meth:`park` freed into the same tensors, and the RNG state.

        Returns ``bytes`` (copied back), ``device_bytes`` and ``seconds``; all zero when not
        parked (or on an inactive rank).
        """
        return self._parking.unpark()

    # ----------------------------------------------------------------- full state
    def _state_slices(self) -> list[torch.Tensor]:
        """This rank's fp32 master weights and Adam moments as the optimizer holds them: whole, or
        (ZeRO-1) its DP rank's slices; the master is whole unless it is sharded (bf16 + ZeRO-1)."""
        assert self.optimizer is not None and self.flat is not None
        opt = self.optimizer
        master = opt.master if opt.master_slice is not None else self.flat.data
        return [master, opt.exp_avg, opt.exp_avg_sq]

    def _full_arrays(self) -> list[torch.Tensor] | None:
        """Full local (this TP shard's) master weights and Adam moments on DP rank 0 (collective
        over the DP group under ZeRO-1); None on the other DP ranks."""
        assert self.flat is not None
        arrays = self._state_slices()
        if not self.optim_cfg.zero1 or self.dp_size == 1:
            return arrays
        dp_ranks = list(self.layout.dp_group(self.me))
        full = holding(dp_ranks, self.flat.numel, True)
        sharded = [a for a in arrays if a.numel() != self.flat.numel or self.optimizer.master_slice is a]
        if self.dp_rank != 0:
            for buf in sharded:
                if buf.numel():
                    dist.send(buf.contiguous(), dp_ranks[0], group=self.dp_group)
            return None
        out = []
        for buf in arrays:
            if not any(buf is x for x in sharded):
                out.append(buf)
                continue
            whole = torch.empty(self.flat.numel, dtype=torch.float32, device=buf.device)
            whole[:buf.numel()].copy_(buf)
            for src in dp_ranks[1:]:
                lo, hi = full[src]
                if hi > lo:
                    dist.recv(whole[lo:hi], src, group=self.dp_group)
            out.append(whole)
        return out

    def state_dict(self) -> dict[str, Any] | None:
        """Full state by parameter name: ``model``, ``optimizer`` (``exp_avg/<name>``,
        ``exp_avg_sq/<name>``) and JSON ``meta``; the master weights (fp32) under any precision,
        full tensors under any TP. Collective over the actor's ranks; returns the state on its first
        rank and None elsewhere."""
        self._require_live("state_dict")
        assert self.flat is not None
        arrays = self._full_arrays()
        if arrays is None or self.dp_rank != 0:  # DP rank 0's TP group holds a full replica
            return None
        parts = self._tp_gather(arrays)
        if parts is None:
            return None
        optim: dict[str, torch.Tensor] = {}
        for prefix, arrays in zip(("exp_avg", "exp_avg_sq"), parts[1:]):
            optim.update({f"{prefix}/{n}": t for n, t in self._unshard(arrays)})
        meta = {**self.meta(), "zero1": self.optim_cfg.zero1}
        return {"model": dict(self._unshard(parts[0])), "optimizer": optim, "meta": meta}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a full state (any TP and DP size, any ZeRO setting); each rank keeps its slice."""
        self._require_live("load_state_dict")
        assert self.flat is not None and self.optimizer is not None
        model, optim = state["model"], state["optimizer"]
        expected = set(self.flat.names)
        if set(model) != expected:
            raise ValueError(f"rank {self.me}: checkpoint parameters differ from the model: "
                             f"missing {sorted(expected - set(model))[:5]}, unexpected "
                             f"{sorted(set(model) - expected)[:5]}")
        self.load_meta(state["meta"])
        specs = {s.name: s for s in self.specs}
        tp, tp_rank = self.tp, self.tp_rank
        full = [self.flat.data if self.flat.full_master else torch.empty(self.flat.numel),
                torch.empty(self.flat.numel), torch.empty(self.flat.numel)]
        with torch.no_grad():
            for name, view in self.flat.named_views(full[0]):
                view.copy_(specs[name].shard(model[name], tp, tp_rank))
            for prefix, flat in zip(("exp_avg", "exp_avg_sq"), full[1:]):
                for name, view in self.flat.named_views(flat):
                    view.copy_(specs[name].shard(optim[f"{prefix}/{name}"], tp, tp_rank))
        self._adopt_full_arrays(full)

    def _adopt_full_arrays(self, full: Sequence[torch.Tensor]) -> None:
        """Take this rank's part of full local master weights and moments (its ZeRO-1 slices) and
        refresh the compute parameters."""
        assert self.flat is not None and self.optimizer is not None
        opt = self.optimizer
        lo, hi = opt.state_range
        with torch.no_grad():
            if opt.master_slice is not None:
                opt.master_slice = full[0][lo:hi].clone()
                self.flat.compute.copy_(full[0])
            if opt.exp_avg.data_ptr() != full[1].data_ptr():
                opt.exp_avg = full[1][lo:hi].clone() if self.optim_cfg.zero1 else opt.exp_avg.copy_(full[1])
                opt.exp_avg_sq = full[2][lo:hi].clone() if self.optim_cfg.zero1 else opt.exp_avg_sq.copy_(full[2])
        self.flat.sync_compute()

    # ----------------------------------------------------------------- metadata
    def meta(self) -> dict[str, Any]:
        """Small JSON state that travels with the weights: counters, RNG, data position."""
        return {"step": self.step, "scheduler": self.scheduler.state_dict(),
                "rng": encode_tensor(self.generator.get_state()),
                "data_state": self.data_state, "seed": self.seed,
                "numel": self.flat.numel if self.flat is not None else None,
                "full_numel": sum(s.numel for s in self.specs) if self.specs else None,
                "model": self.model_cfg.to_dict(), "dp_size": self.dp_size, "tp": self.tp,
                "precision": self.precision}

    def load_meta(self, meta: Mapping[str, Any]) -> None:
        """Apply :meth:`meta` output (step counter, LR schedule position, RNG, data state)."""
        theirs = meta.get("full_numel", meta.get("numel"))
        mine = sum(s.numel for s in self.specs) if self.specs else None
        if mine is not None and theirs not in (None, mine):
            raise ValueError(f"rank {self.me}: state has {theirs} parameters, this model "
                             f"{mine}; model configs differ")
        self.scheduler.load_state_dict(meta["scheduler"])
        self.generator.set_state(decode_tensor(meta["rng"]))
        self.data_state = dict(meta["data_state"])
        self._step = int(meta["step"])
        if self.optimizer is not None:
            self.optimizer.step_count = int(meta["step"])

    # ----------------------------------------------------------------- resharding
    def reshard(self, new_ranks: Sequence[int], epoch: int | None = None,
                old_ranks: Sequence[int] | None = None, new_tp: int | None = None,
                old_tp: int | None = None) -> dict[str, float]:
        """Move the actor from the current ranks to ``new_ranks`` in place.

        Collective over the union of old and new ranks: every one of them must call it with the
        same ``new_ranks``; the groups of ``transition_rank_sets(old, new)`` are created on first
        use by their members (or ahead of time with ``group_cache.ensure``). Holders send
        parameters and Adam state over torch.distributed (no disk); joining ranks build the model
        skeleton (unless warm, see :meth:`warm`) and receive state, step counter, LR schedule
        position, RNG and data state; leaving ranks free their memory (:meth:`free`: a warm
        rank keeps its buffers). Raises ``InvalidDPSizeError`` before any communication if the
        new DP size is invalid, and ``ReshardTimeoutError``/``GroupTimeoutError`` naming the
        missing ranks if not all ranks arrive within the group cache's timeout. Returns figures
        of this rank: ``build_seconds`` (joiner's skeleton), ``group_seconds`` (group creation),
        ``wait_seconds`` (arrival barrier), ``transfer_seconds``, ``seconds`` (all) and bytes.

        ``old_ranks`` is the caller's view of where the actor is: an inactive rank adopts it (moves
        it took no part in left its own view stale); an active rank must agree with it. ``new_tp``
        / ``old_tp`` (default: the TP in force) change the tensor-parallel size at the same time:
        see :meth:`_change_layout`.
        """
        self._parking.check_live(f"epoch {epoch} actor reshard {self.ranks}->"
                                 f"{sorted(set(new_ranks))}")
        new = sorted(set(new_ranks))
        if old_ranks is not None:
            if not self._active:
                self.ranks = sorted(set(old_ranks))
                self.tp = int(old_tp or self.tp)
            elif sorted(set(old_ranks)) != self.ranks or (old_tp or self.tp) != self.tp:
                raise ValueError(f"rank {self.me}: the actor is {self.layout.describe()}, epoch {epoch} "
                                 f"moves it from ranks {sorted(set(old_ranks))} at TP {old_tp or self.tp}")
        new_tp = int(new_tp or self.tp)
        if self.tp > 1 or new_tp > 1 or self.sharded_master:
            return self._change_layout(Layout(tuple(new), new_tp), epoch)
        old = list(self.ranks)
        check_dp_size(self.batch_cfg, len(new))
        union = sorted(set(old) | set(new))
        if self.me not in union:
            raise ValueError(f"rank {self.me} called reshard {old}->{new} it takes no part in")
        figures = {"bytes_moved": 0.0, "bytes_sent": 0.0, "bytes_received": 0.0,
                   "seconds": 0.0, "transfer_seconds": 0.0, "build_seconds": 0.0,
                   "group_seconds": 0.0, "wait_seconds": 0.0, "old_dp": float(len(old)),
                   "new_dp": float(len(new))}
        if new == old:
            return figures
        t0 = time.perf_counter()
        what = f"epoch {epoch} actor reshard {old}->{new}"
        joining = self.me in new and self.me not in old
        if joining and self.model is None:
            self._build_skeleton(new.index(self.me), len(new))
        t_built = time.perf_counter()
        union_group = self.group_cache.get(union, what)
        t_group = time.perf_counter()
        meta, t_arrived = self._arrive(union, union_group, old[0], what)
        if joining:
            self.load_meta(meta)
        t1 = time.perf_counter()
        sent, received, moved = self._move_state(old, new, union_group, meta, what)
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize()  # NCCL returns once queued: time the transfer itself
        figures["transfer_seconds"] = time.perf_counter() - t1
        self.ranks = new
        if self.me in new:
            self.dp_group = self.group_cache.get(new, "actor DP group")
            assert self.optimizer is not None
            self.optimizer.set_group(self.dp_group, self.dp_rank, self.dp_size)
            if joining:
                assert self.flat is not None
                self.flat.sync_compute()
            self._active = True
        else:
            self.free()
        figures.update(bytes_moved=float(moved), bytes_sent=float(sent),
                       bytes_received=float(received), build_seconds=t_built - t0,
                       group_seconds=t_group - t_built, wait_seconds=t_arrived - t_group,
                       seconds=time.perf_counter() - t0)
        return figures

    def _arrive(self, union: list[int], union_group: dist.ProcessGroup, source: int,
                what: str) -> tuple[dict[str, Any], float]:
        """Arrival barrier of a reshard's ranks, then ``source``'s :meth:`meta` to all of them;
        returns the meta and when every rank had arrived."""
        # How many reshards over this union this rank took part in, counted in the world's store
        # (the same on every member): it names this reshard's control keys.
        seq = c10d._get_default_store().add(f"slurm_rl/reshard-seq/{'_'.join(map(str, union))}/{self.me}", 1)
        via_store = (self.control_via_store if self.control_via_store is not None
                     else dist.get_backend(union_group) != dist.Backend.GLOO)
        prefix = f"slurm_rl/reshard/{'_'.join(map(str, union))}/{seq}"
        if via_store:
            self._store_barrier(prefix, union, what)
        else:
            self._monitored_barrier(union_group, union, what)
        arrived = time.perf_counter()
        mine = self.meta() if self.me == source else None
        if via_store:
            return self._store_json(f"{prefix}/meta", mine), arrived
        return broadcast_json(mine, source, union_group), arrived

    def _change_layout(self, new: Layout, epoch: int | None) -> dict[str, float]:
        """Move the actor to layout ``new`` -- TP and DP may both change -- with its optimizer state.

        Collective over the union of the old and new ranks. A rank whose TP group stays keeps its
        model and buffers (a source only); the others build a model skeleton at the new TP and
        receive their shards of the master weights and both Adam moments
        (:mod:`.layout_reshard`); the step, LR schedule position, RNG and data state travel as
        meta. Under ZeRO-1 the moments are first gathered over each old DP group and cut to the
        new DP ranges after. Leaving ranks free their state. Groups are made in one order by all.
        """
        old = self.layout
        check_dp_size(self.batch_cfg, new.dp)
        figures = {"bytes_moved": 0.0, "bytes_sent": 0.0, "bytes_received": 0.0,
                   "seconds": 0.0, "transfer_seconds": 0.0, "build_seconds": 0.0,
                   "group_seconds": 0.0, "wait_seconds": 0.0, "old_dp": float(old.dp),
                   "new_dp": float(new.dp), "old_tp": float(old.tp), "new_tp": float(new.tp)}
        if new == old:
            return figures
        union = sorted(set(old.ranks) | set(new.ranks))
        if self.me not in union:
            raise ValueError(f"rank {self.me} called a reshard {old.describe()} -> {new.describe()} "
                             "it takes no part in")
        what = f"epoch {epoch} actor reshard {old.describe()} -> {new.describe()}"
        t0 = time.perf_counter()
        self.group_cache.ensure([tuple(union), *(new.tp_groups() if new.tp > 1 else []),
                                 *new.dp_groups()], what)
        union_group = self.group_cache.get(union, what)
        t_group = time.perf_counter()
        meta, t_arrived = self._arrive(union, union_group, old.ranks[0], what)
        if self.me in new and self.me not in old:
            self.load_meta(meta)
        sources = self._local_arrays() if self.me in old else None
        keep = keeps_arrays(self.me, old, new)
        t_built = time.perf_counter()
        model = flat = targets = None
        if self.me in new and not keep:
            tp_group = self.group_cache.get(new.tp_group(self.me), what) if new.tp > 1 else None
            model, flat = self._new_model(new.tp, initialize=False, tp_group=tp_group)
            targets = ([flat.data, flat.slot(1), flat.slot(2)] if not self.optim_cfg.zero1 else
                       [flat.data if flat.full_master else torch.zeros_like(flat.grad),
                        *(torch.zeros_like(flat.grad) for _ in range(2))])
        t1 = time.perf_counter()
        specs = self.specs if self.specs and self.me in old else self._specs_of(model, new.tp)
        pieces = plan_layout_change(old, new, specs)
        sent, received = execute_layout_change(pieces, specs, self.me, old, new, union_group,
                                               sources, targets)
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize()  # NCCL returns once queued: time the transfer itself
        figures["transfer_seconds"] = time.perf_counter() - t1
        if self.me in new:
            if not keep:
                if self.flat is not None:
                    self.flat.release()
                self.model, self.flat, self.specs = model, flat, self._specs_of(model, new.tp)
            full = targets if targets is not None else sources
            assert full is not None
            self.ranks, self.tp = list(new.ranks), new.tp
            self._join_groups(new, what)
            self.optimizer = self._make_optimizer(zero_state=False)
            self.optimizer.step_count = int(meta["step"])
            self._adopt_full_arrays(full)
            self._active = True
        else:
            self.ranks, self.tp = list(new.ranks), new.tp
            self.free(keep_warm=self.stay_warm and old.tp == 1)  # a TP shard is no warm skeleton
        figures.update(bytes_moved=float(pieces_bytes(pieces, specs)), bytes_sent=float(sent),
                       bytes_received=float(received), build_seconds=t1 - t_built,
                       group_seconds=t_group - t0, wait_seconds=t_arrived - t_group,
                       seconds=time.perf_counter() - t0)
        return figures

    def _local_arrays(self) -> list[torch.Tensor]:
        """This rank's full local master weights and Adam moments (under ZeRO-1 gathered over its
        DP group: collective over it)."""
        assert self.flat is not None and self.optimizer is not None
        if not self.optim_cfg.zero1:
            self._replicated_buffer()
            return [self.flat.data, self.flat.slot(1), self.flat.slot(2)]
        n = self.flat.numel
        dp_ranks = list(self.layout.dp_group(self.me))
        out = []
        for i, part in enumerate(self._state_slices()):
            if i == 0 and self.flat.full_master:
                out.append(self.flat.data)
                continue
            whole = torch.zeros(n, dtype=torch.float32, device=self.flat.grad.device)
            for j, src in enumerate(dp_ranks):
                a, b = shard_range(n, len(dp_ranks), j)
                if src == self.me:
                    whole[a:b].copy_(part)
                if len(dp_ranks) > 1 and a < b:
                    dist.broadcast(whole[a:b], src=src, group=self.dp_group)
            out.append(whole)
        return out

    def _timeout_error(self, union: list[int], what: str, detail: str) -> ReshardTimeoutError:
        timeout = self.group_cache.timeout
        return ReshardTimeoutError(
            f"rank {self.me} on {socket.gethostname()}: {what}: not all ranks arrived within "
            f"{timeout.total_seconds():.0f}s (group ranks 0..{len(union) - 1} are global "
            f"ranks {union}): {detail}")

    def _monitored_barrier(self, group: dist.ProcessGroup, union: list[int], what: str) -> None:
        try:
            dist.monitored_barrier(group, timeout=self.group_cache.timeout, wait_all_ranks=True)
        except RuntimeError as exc:
            raise self._timeout_error(union, what, str(exc)) from exc

    def _store_barrier(self, prefix: str, union: list[int], what: str) -> None:
        """Arrival barrier through the world's store (any backend); names missing ranks."""

        store = c10d._get_default_store()
        store.set(f"{prefix}/arrived/{self.me}", socket.gethostname())
        keys = [f"{prefix}/arrived/{r}" for r in union]
        try:
            store.wait(keys, self.group_cache.timeout)
        except Exception as exc:  # the store raises a generic error on timeout
            missing = [r for r, k in zip(union, keys) if not store.check([k])]
            raise self._timeout_error(union, what, f"ranks {missing} missing") from exc

    @staticmethod
    def _store_json(key: str, obj: Any) -> Any:
        """Publish ``obj`` under ``key`` in the world's store (when given) and read it back."""

        store = c10d._get_default_store()
        if obj is not None:
            store.set(key, json.dumps(obj))
        return json.loads(store.get(key).decode())

    def _replicated_buffer(self) -> torch.Tensor:
        """Parameters (+ Adam moments without ZeRO-1) as one contiguous tensor."""
        assert self.flat is not None and self.optimizer is not None
        flat, opt = self.flat, self.optimizer
        if self.optim_cfg.zero1:
            return flat.data
        if flat.slots < 3:
            raise ReshardError(f"rank {self.me}: parameters were built without room for the "
                              "Adam moments (FlatParams slots < 3)")
        for index, buf in ((1, opt.exp_avg), (2, opt.exp_avg_sq)):
            if buf.data_ptr() != flat.slot(index).data_ptr():
                flat.slot(index).copy_(buf)
        opt.exp_avg, opt.exp_avg_sq = flat.slot(1), flat.slot(2)
        return flat.storage

    def _move_state(self, old: list[int], new: list[int], group: dist.ProcessGroup,
                    meta: Mapping[str, Any], what: str) -> tuple[int, int, int]:
        """Send/receive this rank's part of the state; ``(sent, received, moved)`` bytes."""
        numel = int(meta["numel"])
        zero1 = self.optim_cfg.zero1
        sent = received = moved = 0
        bcast = broadcast_ranks(old, new)
        if bcast:  # replicated state: one broadcast from one holder to all joiners
            src = broadcast_source(old, new)
            nbytes = numel * (1 if zero1 else 3) * 4
            moved += (len(bcast) - 1) * nbytes
            if self.me in bcast:
                buf = self._replicated_buffer()
                if buf.numel() * buf.element_size() != nbytes:
                    raise ReshardError(f"rank {self.me}: {what}: replicated state has "
                                      f"{buf.numel()} elements, the source has {nbytes // 4}")
                dist.broadcast(buf, src=src,
                               group=self.group_cache.get(bcast, f"{what} broadcast"))
                if self.me == src:
                    sent += (len(bcast) - 1) * nbytes
                else:
                    received += nbytes
        if not zero1:
            return sent, received, moved
        # ZeRO-1 moments: from old shard owners to new shard owners, one message per pair.
        arrays = {"exp_avg": (numel, True), "exp_avg_sq": (numel, True)}
        plan = plan_reshard(old, new, arrays)
        sources: dict[str, tuple[torch.Tensor, int]] = {}
        targets: dict[str, tuple[torch.Tensor, int]] = {}
        if self.me in old:
            assert self.optimizer is not None
            lo = self.optimizer.state_range[0]
            sources = {"exp_avg": (self.optimizer.exp_avg, lo),
                       "exp_avg_sq": (self.optimizer.exp_avg_sq, lo)}
        if self.me in new:
            assert self.flat is not None
            lo, hi = holding(new, numel, True)[self.me]
            for name in arrays:
                warm = getattr(self.optimizer, name) if self.optimizer is not None else None
                if self.me not in old and warm is not None and warm.numel() == hi - lo:
                    buf = warm  # a warm joiner's paged-in shard: the plan overwrites all of it
                else:
                    buf = torch.zeros(hi - lo, dtype=torch.float32,
                                      device=self.flat.data.device)
                copy_local(self.me, old, new, numel, True,
                           sources[name][0] if name in sources else None, buf)
                targets[name] = (buf, lo)
        s, r = execute_plan(plan, self.me, group, sources, targets)
        if self.me in new:
            assert self.optimizer is not None
            self.optimizer.exp_avg = targets["exp_avg"][0]
            self.optimizer.exp_avg_sq = targets["exp_avg_sq"][0]
        return sent + s, received + r, moved + plan_bytes(plan)

    def free(self, keep_warm: bool | None = None) -> None:
        """This rank stops holding the actor: drop the model and optimizer state.

        ``keep_warm`` (default: ``stay_warm``, set by :meth:`warm`) keeps the model skeleton
        and its (now stale) buffers allocated instead, so that joining again at the next growth
        costs the transfer only; ``free(keep_warm=False)`` releases everything.
        """
        if self._active and self.optimizer is not None:
            self._step = self.optimizer.step_count
        self._active = False
        self.dp_group = self.tp_group = None
        keep = self.stay_warm if keep_warm is None else keep_warm
        if self._parking.parked and keep:
            self._parking.unpark()  # a warm skeleton is resident
        elif self._parking.parked:
            self._parking.discard()  # the buffers are dropped: nothing to restore
        if keep:
            return
        if self.flat is not None:
            self.flat.release()  # frees the buffers now, without a (slow) gc.collect()
        self.model = self.flat = self.optimizer = None
