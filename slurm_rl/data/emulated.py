"""Synthetic batches with realistic shapes for ``runtime.device: emulated`` (numpy only, no torch).

The flow mirrors the real one: prompts -> requests (one per sample of a group) -> rollouts
(finished requests) -> inference (reference logprobs) -> actor batch (GRPO advantages).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slurm_rl.data.schemas import ID_STRIDE, PENDING, PROMPTS, ROLLOUTS, inference_table

LengthSpec = int | tuple[int, int] | np.ndarray | Callable[[np.random.Generator, int], np.ndarray]


def _lengths(spec: LengthSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` lengths: a constant, uniform in ``[lo, hi]``, given per row, or drawn by ``spec(rng, n)``."""
    if isinstance(spec, np.ndarray):
        out = spec.astype(np.int64)
    elif callable(spec):
        out = np.asarray(spec(rng, n), dtype=np.int64)
    elif isinstance(spec, tuple):
        out = rng.integers(spec[0], spec[1] + 1, size=n, dtype=np.int64)
    else:
        out = np.full(n, int(spec), dtype=np.int64)
    if out.shape != (n,) or (out < 0).any():
        raise ValueError(f"length spec {spec!r} gave {out.shape} / negative lengths, need {n} non-negative")
    return out


def _ragged_ints(lengths: np.ndarray, rng: np.random.Generator, vocab_size: int) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.integers(0, vocab_size, size=int(offsets[-1]), dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _ragged_logprobs(lengths: np.ndarray, rng: np.random.Generator) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = -rng.exponential(1.0, size=int(offsets[-1])).astype(np.float32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _concat_lists(a: pa.ListArray, b: pa.ListArray) -> pa.ListArray:
    """Row-wise concatenation of two list arrays of equal length."""
    la = pc.list_value_length(a).to_numpy(zero_copy_only=False)
    lb = pc.list_value_length(b).to_numpy(zero_copy_only=False)
    va, vb = a.flatten().to_numpy(), b.flatten().to_numpy()
    offsets = np.zeros(len(la) + 1, dtype=np.int32)
    np.cumsum(la + lb, out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=va.dtype)
    # position of each of a's values in the output, then b's
    start_a = offsets[:-1]
    idx_a = np.repeat(start_a, la) + (np.arange(len(va)) - np.repeat(np.cumsum(la) - la, la))
    idx_b = np.repeat(start_a + la, lb) + (np.arange(len(vb)) - np.repeat(np.cumsum(lb) - lb, lb))
    values[idx_a] = va
    values[idx_b] = vb
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def make_fake_prompts(
    iteration: int, n_prompts: int, prompt_len: LengthSpec, seed: int, *, vocab_size: int = 32000,
    first_index: int = 0,
) -> pa.Table:
    """``n_prompts`` random prompts of ``iteration`` (PROMPTS schema), prompt indices from ``first_index``
    (a later generation batch of dynamic sampling: its own draws)."""
    rng = np.random.default_rng([seed, iteration] if first_index == 0 else [seed, iteration, first_index])
    lengths = _lengths(prompt_len, rng, n_prompts)
    idx = np.arange(first_index, first_index + n_prompts, dtype=np.int32)
    return pa.table(
        {
            "group_id": pa.array(iteration * ID_STRIDE + idx.astype(np.int64)),
            "prompt_index": pa.array(idx),
            "prompt_ids": _ragged_ints(lengths, rng, vocab_size),
            "prompt_text": pa.array([f"prompt {iteration}/{i}" for i in idx]),
            "task": pa.array(["synthetic"] * n_prompts),
            "answer": pa.nulls(n_prompts, pa.string()),
            "metadata_json": pa.nulls(n_prompts, pa.string()),
        },
        schema=PROMPTS,
    )


def make_fake_requests(prompts: pa.Table, group_size: int, *, seed: int = 0, weight_version: int = 0) -> pa.Table:
    """One not-yet-started request per sample (``group_size`` per prompt), PENDING schema.

    ``sample_id = iteration * ID_STRIDE + prompt_index * group_size + k``.
    """
    n = prompts.num_rows
    rep = np.repeat(np.arange(n), group_size)
    k = np.tile(np.arange(group_size, dtype=np.int32), n)
    group_ids = prompts.column("group_id").to_numpy()[rep]
    prompt_index = prompts.column("prompt_index").to_numpy().astype(np.int64)[rep]
    iteration = group_ids // ID_STRIDE
    sample_ids = iteration * ID_STRIDE + prompt_index * group_size + k
    empty_ids = pa.ListArray.from_arrays(pa.array(np.zeros(n * group_size + 1, np.int32)), pa.array([], pa.int32()))
    empty_lp = pa.ListArray.from_arrays(pa.array(np.zeros(n * group_size + 1, np.int32)), pa.array([], pa.float32()))
    take = pa.array(rep, type=pa.int64())
    return pa.table(
        {
            "sample_id": pa.array(sample_ids, pa.int64()),
            "group_id": pa.array(group_ids, pa.int64()),
            "sample_index": pa.array(k),
            "prompt_ids": prompts.column("prompt_ids").take(take).combine_chunks(),
            "prompt_text": prompts.column("prompt_text").take(take).combine_chunks(),
            "partial_response_ids": empty_ids,
            "partial_logprobs": empty_lp,
            "seed": pa.array((seed * 1_000_003 + sample_ids) % (2**62), pa.int64()),
            "step": pa.array(np.zeros(n * group_size, np.int32)),
            "weight_version": pa.array(np.full(n * group_size, weight_version, np.int64)),
            "metadata_json": pa.nulls(n * group_size, pa.string()),
        },
        schema=PENDING,
    )


def advance_requests(
    requests: pa.Table, new_tokens: LengthSpec, *, seed: int = 0, vocab_size: int = 32000
) -> pa.Table:
    """Requests with ``new_tokens`` more generated tokens each (a partially generated state)."""
    rng = np.random.default_rng([seed, requests.num_rows])
    lengths = _lengths(new_tokens, rng, requests.num_rows)
    ids = _concat_lists(requests.column("partial_response_ids").combine_chunks(), _ragged_ints(lengths, rng, vocab_size))
    lps = _concat_lists(requests.column("partial_logprobs").combine_chunks(), _ragged_logprobs(lengths, rng))
    step = requests.column("step").to_numpy() + lengths.astype(np.int32)
    t = requests.set_column(requests.schema.get_field_index("partial_response_ids"), "partial_response_ids", ids)
    t = t.set_column(t.schema.get_field_index("partial_logprobs"), "partial_logprobs", lps)
    return t.set_column(t.schema.get_field_index("step"), "step", pa.array(step, pa.int32())).replace_schema_metadata(
        PENDING.metadata
    )


def unit_hash(ids: np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per id (splitmix64 of id and seed): deterministic, vectorised."""
    with np.errstate(over="ignore"):
        x = ids.astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) % 2**64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(2**53)


def sample_rewards(sample_ids: np.ndarray, seed: int) -> np.ndarray:
    """The emulated rewards (0 or 1): a function of the sample alone (not of which batch or rank finished or
    scored it), so an emulated run's rewards do not depend on timing or placement: a resumed or re-placed run,
    or one whose reward runs apart from the rollout, sees the same rewards."""
    return (unit_hash(np.asarray(sample_ids), seed) < 0.5).astype(np.float32)


def finish_requests(
    requests: pa.Table,
    response_len: LengthSpec,
    *,
    seed: int = 0,
    weight_version: int = 0,
    rollout_rank: int = 0,
    vocab_size: int = 32000,
) -> pa.Table:
    """Complete requests to ``response_len`` total tokens (at least what they already have): ROLLOUTS."""
    n = requests.num_rows
    rng = np.random.default_rng([seed, n, rollout_rank])
    target = _lengths(response_len, rng, n)
    have = requests.column("step").to_numpy().astype(np.int64)
    done = advance_requests(requests, np.maximum(target - have, 0), seed=seed + 1, vocab_size=vocab_size)
    now = time.time()
    reward = sample_rewards(done.column("sample_id").to_numpy(), seed)
    finish = np.where(target >= target.max(initial=0), "length", "stop")
    return pa.table(
        {
            "sample_id": done.column("sample_id"),
            "group_id": done.column("group_id"),
            "sample_index": done.column("sample_index"),
            "prompt_ids": done.column("prompt_ids"),
            "prompt_text": done.column("prompt_text"),
            "response_ids": done.column("partial_response_ids"),
            "sampled_logprobs": done.column("partial_logprobs"),
            "reward": pa.array(reward),
            "finish_reason": pa.array(finish.tolist(), pa.string()),
            "weight_version": pa.array(np.full(n, weight_version, np.int64)),
            "weight_version_last": pa.array(np.full(n, weight_version, np.int64)),
            "rollout_rank": pa.array(np.full(n, rollout_rank, np.int32)),
            "t_start": pa.array(np.full(n, now)),
            "t_end": pa.array(np.full(n, now)),
        },
        schema=ROLLOUTS,
    )


def make_fake_rollouts(
    prompts: pa.Table,
    group_size: int,
    response_len_sampler: LengthSpec,
    *,
    seed: int = 0,
    weight_version: int = 0,
    rollout_rank: int = 0,
    vocab_size: int = 32000,
) -> pa.Table:
    """``group_size`` finished responses per prompt (ROLLOUTS schema)."""
    reqs = make_fake_requests(prompts, group_size, seed=seed, weight_version=weight_version)
    return finish_requests(
        reqs, response_len_sampler, seed=seed, weight_version=weight_version, rollout_rank=rollout_rank,
        vocab_size=vocab_size,
    )


def make_fake_inference(rollouts: pa.Table, *, seed: int = 0, inference_rank: int = 0, with_values: bool = False) -> pa.Table:
    """Rollouts plus reference logprobs (and values if asked): INFERENCE schema."""
    rng = np.random.default_rng([seed, rollouts.num_rows, inference_rank])
    lengths = pc.list_value_length(rollouts.column("response_ids")).to_numpy(zero_copy_only=False).astype(np.int64)
    ref = _ragged_logprobs(lengths, rng)
    values = _ragged_logprobs(lengths, rng) if with_values else None
    return inference_table(rollouts, ref, inference_rank, values)
