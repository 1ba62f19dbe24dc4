"""The actor's batch of a mini-batch (every device): advantages from the scored rollouts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slurm_rl.data.schemas import ACTOR_BATCH
from slurm_rl.rl.advantages import compute_advantages
from slurm_rl.rl.formulas import kl_estimate


def kl_in_reward(old_logprobs: list[list[float]], ref_logprobs: list[list[float]], kind: str) -> np.ndarray:
    """Per sample, the sum over its response of the ``kind`` KL estimate between the rollout's
    log-probs and the reference's (verl's ``apply_kl_penalty`` before it scales by the coefficient)."""
    out = np.zeros(len(old_logprobs))
    for i, (old, ref) in enumerate(zip(old_logprobs, ref_logprobs)):
        if old and ref:
            out[i] = float(np.sum(kl_estimate(np.asarray(old, np.float64), np.asarray(ref, np.float64), kind)))
    return out


def scores(inference: pa.Table, algorithm: Any = None) -> np.ndarray:
    """What the estimator sees per sample: the reward, less ``kl_ctrl.kl_coef`` times the response's KL
    to the reference under ``algorithm.use_kl_in_reward``."""
    reward = inference.column("reward").to_numpy().astype(np.float64)
    if not getattr(algorithm, "use_kl_in_reward", False):
        return reward
    kl = kl_in_reward(inference.column("sampled_logprobs").to_pylist(), inference.column("ref_logprobs").to_pylist(),
                      algorithm.kl_penalty)
    return reward - float(algorithm.kl_ctrl.kl_coef) * kl


def make_actor_batch(inference: pa.Table, algorithm: Any = None) -> pa.Table:
    """ACTOR_BATCH of one cut mini-batch (whole groups): ``advantage`` by ``algorithm.adv_estimator``
    (:mod:`slurm_rl.rl.advantages`; GRPO with verl's defaults when ``algorithm`` is None) from
    :func:`scores`; the ``reward`` column keeps the reward itself."""
    name = getattr(algorithm, "adv_estimator", "grpo")
    lengths = pc.list_value_length(inference.column("response_ids")).to_numpy(zero_copy_only=False)
    adv = compute_advantages(name, scores(inference, algorithm), inference.column("group_id").to_numpy(),
                             lengths, algorithm).astype(np.float32)
    return pa.table(
        {
            "sample_id": inference.column("sample_id"),
            "group_id": inference.column("group_id"),
            "prompt_ids": inference.column("prompt_ids"),
            "response_ids": inference.column("response_ids"),
            "old_logprobs": inference.column("sampled_logprobs"),
            "ref_logprobs": inference.column("ref_logprobs"),
            "values": inference.column("values"),
            "advantage": pa.array(adv),
            "reward": inference.column("reward"),
            "weight_version": inference.column("weight_version"),
        },
        schema=ACTOR_BATCH,
    )
