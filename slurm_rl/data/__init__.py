"""Arrow data plane: the only code that opens Arrow files under ``RUN_DIR/data``.

Stages hand batches to each other as Arrow IPC shards listed in per-producer JSON manifests;
consumers stream, verify (xxh3_64) and memory-map them. No torch, no config/control imports.
"""

from slurm_rl.data.errors import CorruptShardError, DataPlaneError, InvalidManifestError, ManifestTimeout
from slurm_rl.data.gc import collect_garbage, list_iterations
from slurm_rl.data.manifest import ProducerManifest, ShardInfo
from slurm_rl.data.migration import claim_pending, list_pending, load_claimed, write_pending
from slurm_rl.data.partition import (
    dp_share_indices,
    iter_dp_share,
    partition_by_tokens,
    read_dp_share,
    take_dp_share,
)
from slurm_rl.data.reader import Shard, StageReader
from slurm_rl.data.schemas import (
    ACTOR_BATCH,
    ID_STRIDE,
    INFERENCE,
    PENDING,
    PROMPTS,
    ROLLOUTS,
    SCHEMA_VERSION,
    make_group_id,
    make_sample_id,
)
from slurm_rl.data.writer import StageWriter, write_expected

__all__ = [
    "ACTOR_BATCH",
    "ID_STRIDE",
    "INFERENCE",
    "PENDING",
    "PROMPTS",
    "ROLLOUTS",
    "SCHEMA_VERSION",
    "CorruptShardError",
    "DataPlaneError",
    "InvalidManifestError",
    "ManifestTimeout",
    "ProducerManifest",
    "Shard",
    "ShardInfo",
    "StageReader",
    "StageWriter",
    "claim_pending",
    "collect_garbage",
    "dp_share_indices",
    "iter_dp_share",
    "list_iterations",
    "list_pending",
    "load_claimed",
    "make_group_id",
    "make_sample_id",
    "partition_by_tokens",
    "read_dp_share",
    "take_dp_share",
    "write_expected",
    "write_pending",
]
