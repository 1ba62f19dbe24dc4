"""The actor's batch of a mini-batch (every device): advantages from the scored rollouts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slurm_rl.data.schemas import ACTOR_BATCH
from slurm_rl.rl.advantages import compute_advantages


def make_actor_batch(inference: pa.Table, algorithm: Any = None) -> pa.Table:
    """ACTOR_BATCH of one cut mini-batch (whole groups): ``advantage`` by ``algorithm.adv_estimator``
    (:mod:`slurm_rl.rl.advantages`; GRPO with verl's defaults when ``algorithm`` is None)."""
    name = getattr(algorithm, "adv_estimator", "grpo")
    lengths = pc.list_value_length(inference.column("response_ids")).to_numpy(zero_copy_only=False)
    adv = compute_advantages(name, inference.column("reward").to_numpy(), inference.column("group_id").to_numpy(),
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
