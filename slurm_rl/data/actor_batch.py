"""The actor's batch of a mini-batch (every device): GRPO advantages from the scored rollouts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from slurm_rl.data.schemas import ACTOR_BATCH
from slurm_rl.rl.formulas import group_advantages


def make_actor_batch(inference: pa.Table, *, eps: float = 1e-6) -> pa.Table:
    """GRPO-style batch: advantage = (reward - group mean) / (group std + eps): ACTOR_BATCH."""
    adv = group_advantages(inference.column("reward").to_numpy(), inference.column("group_id").to_numpy(),
                           eps=eps).astype(np.float32)
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
