"""Batch configuration, valid DP sizes, micro-batch packing and collation.

A *mini-batch* is the set of samples of one optimizer step (``global_batch_size``); it never
changes with placement. Each DP rank takes a contiguous ``global_batch_size / dp`` share and
splits it into micro-batches, either of ``micro_batch_size`` samples or, with
``max_tokens_per_microbatch``, packed so that ``rows * longest_row <= max_tokens``.
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


def shard_for_rank(samples: Sequence[Any], dp_rank: int, dp_size: int) -> list[Any]:
    """The contiguous share of one mini-batch that DP rank ``dp_rank`` trains on."""
    if len(samples) % dp_size:
        raise InvalidDPSizeError(
            f"{len(samples)} samples do not divide over DP size {dp_size}")
    share = len(samples) // dp_size
    return list(samples[dp_rank * share:(dp_rank + 1) * share])


def sample_length(sample: Mapping[str, Any]) -> int:
    """Token count of one sample (length of its ``input_ids``)."""
    return len(sample["input_ids"])


def split_microbatches(samples: Sequence[Mapping[str, Any]],
                       cfg: BatchConfig) -> list[list[Mapping[str, Any]]]:
    """Split one rank's samples into micro-batches, keeping their order.

    Token packing: rows are added while ``rows * longest_row`` (the padded size) stays within
    ``max_tokens_per_microbatch``; a sample longer than the bound forms a micro-batch alone.
    """
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
