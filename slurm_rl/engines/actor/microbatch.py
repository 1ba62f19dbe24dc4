"""Batch configuration, valid DP sizes, micro-batch packing and collation.

A *mini-batch* is the set of samples of one optimizer step (``global_batch_size``); it never
changes with placement. Each DP rank takes a ``global_batch_size / dp`` share (contiguous, or with
``balance_batch`` the share of a token-balanced partition) and splits it into micro-batches:

- padded (``remove_padding`` false): ``micro_batch_size`` samples, or with ``max_tokens_per_microbatch``
  consecutive samples while ``rows * longest_row <= max_tokens``; :func:`collate` right-pads them;
- packed (``remove_padding`` true): ``micro_batch_size`` samples, or with ``max_tokens_per_microbatch``
  bins of at most that many tokens filled first-fit-decreasing; :func:`collate_packed` concatenates a
  micro-batch into one row without padding (positions restart per sample, ``cu_seqlens`` marks the
  samples so that attention stays inside each).

How many micro-batches this makes never changes the loss: the trainer divides by the whole step's
token (or sequence) count and the LR schedule counts samples (invariant 5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from slurm_rl.errors import EngineError
from slurm_rl.scheduler.state import valid_dp_sizes as dp_sizes_rule


class InvalidDPSizeError(EngineError, ValueError):
    """A data-parallel size that does not divide the mini-batch evenly."""


@dataclass(frozen=True)
class BatchConfig:
    """Samples per optimizer step, fixed micro-batch size, optional token-bounded packing."""

    global_batch_size: int = 8
    micro_batch_size: int = 1
    max_tokens_per_microbatch: int | None = None
    remove_padding: bool = False
    balance_batch: bool = False

    def __post_init__(self) -> None:
        for name in ("global_batch_size", "micro_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"train.{name}: got {value!r}, expected a positive int")
        if self.max_tokens_per_microbatch is not None and self.max_tokens_per_microbatch <= 0:
            raise ValueError("train.max_tokens_per_microbatch: got "
                             f"{self.max_tokens_per_microbatch!r}, expected positive or null")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BatchConfig":
        """Build from a plain mapping."""
        return cls(**dict(data))


def valid_dp_sizes(cfg: BatchConfig, max_dp: int | None = None) -> list[int]:
    """DP sizes over which one mini-batch divides evenly (the rule of
    :func:`slurm_rl.scheduler.state.valid_dp_sizes`).

    With fixed micro-batches the per-rank share must also be a multiple of
    ``micro_batch_size``; with token packing only the sample split must be even
    (the rule with micro-batches of one sample).
    """
    limit = cfg.global_batch_size if max_dp is None else min(max_dp, cfg.global_batch_size)
    micro = cfg.micro_batch_size if cfg.max_tokens_per_microbatch is None else 1
    return dp_sizes_rule(cfg.global_batch_size, micro, limit)


def check_dp_size(cfg: BatchConfig, dp: int) -> None:
    """Raise InvalidDPSizeError naming the allowed sizes if ``dp`` is not valid."""
    allowed = valid_dp_sizes(cfg)
    if dp not in allowed:
        raise InvalidDPSizeError(
            f"actor DP size {dp} is invalid for global_batch_size={cfg.global_batch_size}, "
            f"micro_batch_size={cfg.micro_batch_size}, max_tokens_per_microbatch="
            f"{cfg.max_tokens_per_microbatch}; allowed DP sizes: {allowed}")


def grad_accumulation_steps(cfg: BatchConfig, dp: int) -> int:
    """Micro-batches per rank per step with fixed micro-batches: global / (micro x DP)."""
    check_dp_size(cfg, dp)
    return cfg.global_batch_size // (cfg.micro_batch_size * dp)


def shard_for_rank(samples: Sequence[Any], dp_rank: int, dp_size: int,
                   lengths: Sequence[int] | None = None, hidden_size: int = 4096) -> list[Any]:
    """The share of one mini-batch that DP rank ``dp_rank`` trains on: contiguous, or with the samples'
    token ``lengths`` given (``train.balance_batch``) the rank's part of :func:`balanced_partition`
    (every rank computes the same partition from the same lengths)."""
    if len(samples) % dp_size:
        raise InvalidDPSizeError(
            f"{len(samples)} samples do not divide over DP size {dp_size}")
    share = len(samples) // dp_size
    if lengths is None or dp_size == 1:
        return list(samples[dp_rank * share:(dp_rank + 1) * share])
    weights = [workload(n, hidden_size) for n in lengths]
    return [samples[i] for i in balanced_partition(weights, dp_size)[dp_rank]]


def workload(length: int, hidden_size: int = 4096) -> float:
    """The compute of one sample of ``length`` tokens, in token units: its linear layers cost in proportion
    to the length and its attention to the square (per layer about ``24 h L`` against ``4 L^2`` flops
    forward, so ``L + L^2 / (6 h)``), the weighting verl's and slime's balancers use."""
    return length + length * length / (6.0 * hidden_size)


def balanced_partition(weights: Sequence[float], parts: int) -> list[list[int]]:
    """Indices of ``weights`` in ``parts`` parts of equal count and near-equal weight sums.

    Greedy longest-processing-time with a capacity: the heaviest remaining item goes to the lightest
    part that still has room (each part holds ``len(weights) / parts`` items; ties go to the lower
    index, so every rank computes the same partition). Each part lists its indices in ascending order.
    """
    if len(weights) % parts:
        raise InvalidDPSizeError(f"{len(weights)} samples do not divide over {parts} parts")
    room = len(weights) // parts
    sums = [0.0] * parts
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(weights)), key=lambda j: (-weights[j], j)):
        part = min((p for p in range(parts) if len(out[p]) < room), key=lambda p: (sums[p], p))
        out[part].append(i)
        sums[part] += weights[i]
    return [sorted(p) for p in out]


def sample_length(sample: Mapping[str, Any]) -> int:
    """Token count of one sample (length of its ``input_ids``)."""
    return len(sample["input_ids"])


def split_microbatches(samples: Sequence[Mapping[str, Any]],
                       cfg: BatchConfig) -> list[list[Mapping[str, Any]]]:
    """Split one rank's samples into micro-batches.

    Fixed size: ``micro_batch_size`` samples each, in order. Token-bounded, padded: rows are added in
    order while ``rows * longest_row`` (the padded size) stays within ``max_tokens_per_microbatch``.
    Token-bounded, packed (``remove_padding``): :func:`first_fit_decreasing` bins of at most
    ``max_tokens_per_microbatch`` tokens. A sample longer than the bound forms a micro-batch alone.
    """
    if cfg.max_tokens_per_microbatch is not None and cfg.remove_padding:
        bins = first_fit_decreasing([sample_length(s) for s in samples], cfg.max_tokens_per_microbatch)
        return [[samples[i] for i in b] for b in bins]
    if cfg.max_tokens_per_microbatch is None:
        m = cfg.micro_batch_size
        return [list(samples[i:i + m]) for i in range(0, len(samples), m)]
    out: list[list[Mapping[str, Any]]] = []
    current: list[Mapping[str, Any]] = []
    longest = 0
    for sample in samples:
        length = sample_length(sample)
        new_longest = max(longest, length)
        if current and (len(current) + 1) * new_longest > cfg.max_tokens_per_microbatch:
            out.append(current)
            current, new_longest = [], length
        current.append(sample)
        longest = new_longest
    if current:
        out.append(current)
    return out


def first_fit_decreasing(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of ``lengths`` in bins whose sums stay within ``budget`` (an item over the budget gets a bin
    of its own): items by decreasing length (ties by index) each go to the first bin with room. Bins are
    in the order they were opened; each lists its indices in ascending order."""
    bins: list[list[int]] = []
    sums: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        for b, total in enumerate(sums):
            if total + lengths[i] <= budget:
                bins[b].append(i)
                sums[b] += lengths[i]
                break
        else:
            bins.append([i])
            sums.append(lengths[i])
    return [sorted(b) for b in bins]


def _as_tensor(value: Any, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(dtype)
    return torch.as_tensor(value, dtype=dtype)


def collate(samples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """Right-pad a micro-batch into tensors.

    Each sample has ``input_ids`` (``T`` ints) and optionally ``loss_mask`` (``T-1`` values
    for the next-token targets; default all ones) and further per-token fields of length
    ``T-1`` (e.g. ``advantages``, ``old_logprobs``) or per-sample scalars. Output: ``input_ids``
    and ``attention_mask`` ``[B, T]``, ``loss_mask`` and per-token fields ``[B, T-1]`` (padding
    is 0), scalars ``[B]``.
    """
    lengths = [sample_length(s) for s in samples]
    width = max(lengths)
    batch = len(samples)
    ids = torch.zeros(batch, width, dtype=torch.long)
    attn = torch.zeros(batch, width, dtype=torch.long)
    loss_mask = torch.zeros(batch, width - 1, dtype=torch.float32)
    out: dict[str, torch.Tensor] = {}
    for i, (sample, n) in enumerate(zip(samples, lengths)):
        ids[i, :n] = _as_tensor(sample["input_ids"], torch.long)
        attn[i, :n] = 1
        if "loss_mask" in sample:
            loss_mask[i, :n - 1] = _as_tensor(sample["loss_mask"], torch.float32)
        else:
            loss_mask[i, :n - 1] = 1.0
        for key, value in sample.items():
            if key in ("input_ids", "loss_mask"):
                continue
            tensor = _as_tensor(value, torch.float32)
            if tensor.dim() == 0:
                out.setdefault(key, torch.zeros(batch))[i] = tensor
            else:
                if tensor.shape[0] != n - 1:
                    raise ValueError(f"sample {i}: field {key!r} has length {tensor.shape[0]}, "
                                     f"expected {n - 1} (one per next-token target)")
                out.setdefault(key, torch.zeros(batch, width - 1))[i, :n - 1] = tensor
    out.update(input_ids=ids, attention_mask=attn, loss_mask=loss_mask)
    return out


def collate_packed(samples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """Concatenate a micro-batch into one row without padding.

    Output: ``input_ids`` and ``position_ids`` ``[1, N]`` (``N`` the samples' total tokens; positions
    restart at 0 for each sample), ``cu_seqlens`` ``[k + 1]`` int32 (sample ``s`` holds tokens
    ``cu_seqlens[s]:cu_seqlens[s + 1]``) and ``max_seqlen``; the per-token fields (``loss_mask`` and the
    others of :func:`collate`) in the next-token layout of the row, ``[1, N - 1]``: sample ``s``'s
    ``T_s - 1`` targets sit at columns ``cu_seqlens[s] .. cu_seqlens[s + 1] - 2`` and the column of its
    last token (which would predict the next sample's first) is 0; ``segment_ids`` ``[1, N - 1]`` (the
    sample of each column); per-sample scalars ``[k]``.
    """
    lengths = [sample_length(s) for s in samples]
    total = sum(lengths)
    ids = torch.empty(1, total, dtype=torch.long)
    pos = torch.empty(1, total, dtype=torch.long)
    loss_mask = torch.zeros(1, total - 1, dtype=torch.float32)
    segments = torch.zeros(1, total - 1, dtype=torch.long)
    cu = [0]
    out: dict[str, torch.Tensor] = {}
    for i, (sample, n) in enumerate(zip(samples, lengths)):
        a = cu[-1]
        ids[0, a:a + n] = _as_tensor(sample["input_ids"], torch.long)
        pos[0, a:a + n] = torch.arange(n)
        segments[0, a:min(a + n, total - 1)] = i  # its columns and the gap after them
        loss_mask[0, a:a + n - 1] = (_as_tensor(sample["loss_mask"], torch.float32) if "loss_mask" in sample
                                     else 1.0)
        for key, value in sample.items():
            if key in ("input_ids", "loss_mask"):
                continue
            tensor = _as_tensor(value, torch.float32)
            if tensor.dim() == 0:
                out.setdefault(key, torch.zeros(len(samples)))[i] = tensor
                continue
            if tensor.shape[0] != n - 1:
                raise ValueError(f"sample {i}: field {key!r} has length {tensor.shape[0]}, "
                                 f"expected {n - 1} (one per next-token target)")
            out.setdefault(key, torch.zeros(1, total - 1))[0, a:a + n - 1] = tensor
        cu.append(a + n)
    out.update(input_ids=ids, position_ids=pos, loss_mask=loss_mask, segment_ids=segments,
               cu_seqlens=torch.tensor(cu, dtype=torch.int32), max_seqlen=torch.tensor(max(lengths)))
    return out


def collate_for(cfg: BatchConfig, samples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """A micro-batch's tensors: :func:`collate_packed` with ``remove_padding``, else :func:`collate`."""
    return collate_packed(samples) if cfg.remove_padding else collate(samples)


def is_packed(batch: Mapping[str, Any]) -> bool:
    """Whether ``batch`` is a packed row (:func:`collate_packed`)."""
    return "cu_seqlens" in batch


def token_and_sequence_counts(batch: Mapping[str, torch.Tensor]) -> tuple[float, float]:
    """Loss tokens and sequences with at least one loss token in a micro-batch (padded or packed)."""
    mask = batch["loss_mask"]
    if is_packed(batch):
        per_sample = torch.zeros(len(batch["cu_seqlens"]) - 1).index_add_(0, batch["segment_ids"][0], mask[0])
    else:
        per_sample = mask.sum(-1)
    return float(mask.sum()), float((per_sample > 0).sum())


def computed_tokens(batch: Mapping[str, torch.Tensor]) -> int:
    """Token positions the model computes for a micro-batch (padding included)."""
    return int(batch["input_ids"].numel())
