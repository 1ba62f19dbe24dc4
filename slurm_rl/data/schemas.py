"""Versioned Arrow schemas of every stage.

Identifiers (unique across a run, int64):

* ``group_id  = iteration * ID_STRIDE + prompt_index`` — one per prompt of an iteration;
* ``sample_id = iteration * ID_STRIDE + prompt_index * group_size + k`` — one per sampled
  response ``k`` in ``[0, group_size)`` of that prompt.

``ID_STRIDE = 10**9`` leaves room for 1e9 samples per iteration and 9e9 iterations.
Token columns are ``list<int32>`` (int32 offsets: up to 2**31 tokens per record batch).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from slurm_rl.data.errors import DataPlaneError

SCHEMA_VERSION = 3
ID_STRIDE = 10**9

META_NAME = b"slurm_rl.schema"
META_VERSION = b"slurm_rl.schema_version"
META_TOKEN_COLUMNS = b"slurm_rl.token_columns"

TOKENS = pa.list_(pa.int32())
LOGPROBS = pa.list_(pa.float32())


def make_group_id(iteration: int, prompt_index: int) -> int:
    """Run-unique id of prompt ``prompt_index`` of ``iteration``."""
    return iteration * ID_STRIDE + prompt_index


def make_sample_id(iteration: int, prompt_index: int, k: int, group_size: int) -> int:
    """Run-unique id of response ``k`` of prompt ``prompt_index`` of ``iteration``."""
    if not 0 <= k < group_size:
        raise ValueError(f"k={k} outside [0, group_size={group_size})")
    return iteration * ID_STRIDE + prompt_index * group_size + k


def count_tokens(table: pa.Table, column: str = "response_ids") -> int:
    """Tokens in a list column of ``table`` (0 for an empty table)."""
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return 0
    return int(pc.sum(pc.list_value_length(table.column(column))).as_py() or 0)


def inference_table(rollouts: pa.Table, ref_logprobs: pa.Array | list, inference_rank: int,
                    values: pa.Array | None = None, old_logprobs: list | None = None) -> pa.Table:
    """ROLLOUTS rows plus their reference logprobs, the actor's log-probs of the sampled tokens
    (``algorithm.old_logprobs: actor``; else nulls) and values (else nulls): INFERENCE schema."""
    cols = {name: rollouts.column(name) for name in ROLLOUTS.names}
    nulls = pa.nulls(rollouts.num_rows, pa.list_(pa.float32()))
    cols.update(ref_logprobs=pa.array(ref_logprobs, pa.list_(pa.float32())) if isinstance(ref_logprobs, list) else ref_logprobs,
                old_logprobs=pa.array(old_logprobs, pa.list_(pa.float32())) if old_logprobs is not None else nulls,
                values=values if values is not None else nulls,
                inference_rank=pa.array([inference_rank] * rollouts.num_rows, pa.int32()))
    return pa.table(cols, schema=INFERENCE)


def split_sample_id(sample_id: int) -> tuple[int, int]:
    """``(iteration, index within the iteration)`` of a sample id."""
    return divmod(sample_id, ID_STRIDE)


def _schema(name: str, fields: list[pa.Field], token_columns: list[str]) -> pa.Schema:
    return pa.schema(
        fields,
        metadata={
            META_NAME: name.encode(),
            META_VERSION: str(SCHEMA_VERSION).encode(),
            META_TOKEN_COLUMNS: ",".join(token_columns).encode(),
        },
    )


_PROMPT_FIELDS = [
    pa.field("group_id", pa.int64(), nullable=False),
    pa.field("prompt_index", pa.int32(), nullable=False),
    pa.field("prompt_ids", TOKENS, nullable=False),
    pa.field("prompt_text", pa.string()),
    pa.field("task", pa.string()),
    pa.field("answer", pa.string()),
    pa.field("metadata_json", pa.string()),
]

PROMPTS = _schema("prompts", _PROMPT_FIELDS, ["prompt_ids"])

_ROLLOUT_FIELDS = [
    pa.field("sample_id", pa.int64(), nullable=False),
    pa.field("group_id", pa.int64(), nullable=False),
    pa.field("sample_index", pa.int32(), nullable=False),
    pa.field("prompt_ids", TOKENS, nullable=False),
    pa.field("prompt_text", pa.string()),
    pa.field("response_ids", TOKENS, nullable=False),
    pa.field("sampled_logprobs", LOGPROBS, nullable=False),
    pa.field("reward", pa.float32(), nullable=False),
    pa.field("finish_reason", pa.string(), nullable=False),
    pa.field("weight_version", pa.int64(), nullable=False),  # the policy version the sample's generation started on
    pa.field("weight_version_last", pa.int64(), nullable=False),  # ... and the one that drew its last token
    pa.field("rollout_rank", pa.int32(), nullable=False),
    pa.field("t_start", pa.float64()),
    pa.field("t_end", pa.float64()),
]

ROLLOUTS = _schema("rollouts", _ROLLOUT_FIELDS, ["prompt_ids", "response_ids"])

INFERENCE = _schema(
    "inference",
    _ROLLOUT_FIELDS
    + [
        pa.field("ref_logprobs", LOGPROBS, nullable=False),
        pa.field("old_logprobs", LOGPROBS, nullable=True),  # null: the rollout's sampled_logprobs
        pa.field("values", LOGPROBS, nullable=True),
        pa.field("inference_rank", pa.int32(), nullable=False),
    ],
    ["prompt_ids", "response_ids"],
)

ACTOR_BATCH = _schema(
    "actor_batch",
    [
        pa.field("sample_id", pa.int64(), nullable=False),
        pa.field("group_id", pa.int64(), nullable=False),
        pa.field("prompt_ids", TOKENS, nullable=False),
        pa.field("response_ids", TOKENS, nullable=False),
        pa.field("old_logprobs", LOGPROBS, nullable=False),
        pa.field("ref_logprobs", LOGPROBS, nullable=False),
        pa.field("values", LOGPROBS, nullable=True),
        pa.field("rollout_is_weights", LOGPROBS, nullable=True),  # per token; null: algorithm.rollout_is none
        pa.field("advantage", pa.float32(), nullable=False),  # per sample (the mean of token_advantages where set)
        pa.field("token_advantages", LOGPROBS, nullable=True),  # per response token; null: one per sample
        pa.field("returns", LOGPROBS, nullable=True),  # per response token, the critic's targets; null: no critic
        pa.field("reward", pa.float32(), nullable=False),
        pa.field("weight_version", pa.int64(), nullable=False),
        pa.field("weight_version_last", pa.int64(), nullable=False),
    ],
    ["prompt_ids", "response_ids"],
)

PENDING = _schema(
    "pending",
    [
        pa.field("sample_id", pa.int64(), nullable=False),
        pa.field("group_id", pa.int64(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("prompt_ids", TOKENS, nullable=False),
        pa.field("prompt_text", pa.string()),
        pa.field("partial_response_ids", TOKENS, nullable=False),
        pa.field("partial_logprobs", LOGPROBS, nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("weight_version", pa.int64(), nullable=False),
        pa.field("metadata_json", pa.string()),
    ],
    ["prompt_ids", "partial_response_ids"],
)

SCHEMAS: dict[str, pa.Schema] = {
    "prompts": PROMPTS,
    "rollouts": ROLLOUTS,
    "inference": INFERENCE,
    "actor_batch": ACTOR_BATCH,
    "pending": PENDING,
}


def token_columns(schema: pa.Schema) -> list[str]:
    """Columns counted as tokens (from schema metadata; else every ``list<int32>`` column)."""
    meta = schema.metadata or {}
    if META_TOKEN_COLUMNS in meta:
        cols = [c for c in meta[META_TOKEN_COLUMNS].decode().split(",") if c]
        return [c for c in cols if c in schema.names]
    return [f.name for f in schema if pa.types.is_list(f.type) and pa.types.is_int32(f.type.value_type)]


def check_schema(actual: pa.Schema, expected: pa.Schema | None, where: str | Path) -> None:
    """Raise DataPlaneError unless ``actual`` carries SCHEMA_VERSION (and equals ``expected``)."""
    meta = actual.metadata or {}
    version = meta.get(META_VERSION)
    if version != str(SCHEMA_VERSION).encode():
        raise DataPlaneError(
            f"{where}: schema version {version.decode() if version else None!r}, this code reads {SCHEMA_VERSION}"
        )
    if expected is not None and not actual.remove_metadata().equals(expected.remove_metadata()):
        raise DataPlaneError(f"{where}: schema mismatch\n got: {actual}\n expected: {expected}")


def conform(data: pa.Table | pa.RecordBatch | dict, schema: pa.Schema) -> pa.Table:
    """Build/cast ``data`` into a table with exactly ``schema`` (including its metadata)."""
    if isinstance(data, dict):
        _check_names(list(data), schema)
        try:
            table = pa.Table.from_pydict(data, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
            raise DataPlaneError(f"cannot build a {schema_name(schema)!r} table from the given columns: {e}") from e
    elif isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    elif isinstance(data, pa.Table):
        table = data
    else:
        raise DataPlaneError(f"expected pa.Table, pa.RecordBatch or dict of columns, got {type(data).__name__}")
    if table.schema.names != schema.names:
        _check_names(table.schema.names, schema)
        table = table.select(schema.names)
    if not table.schema.remove_metadata().equals(schema.remove_metadata()):
        try:
            table = table.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise DataPlaneError(f"cannot cast data to schema {schema_name(schema)!r}: {e}") from e
    return table.replace_schema_metadata(schema.metadata)


def _check_names(names: list[str], schema: pa.Schema) -> None:
    missing = [n for n in schema.names if n not in names]
    extra = [n for n in names if n not in schema.names]
    if missing or extra:
        raise DataPlaneError(f"columns do not match schema {schema_name(schema)!r}: missing {missing}, unexpected {extra}")


def schema_name(schema: pa.Schema) -> str:
    """The name stored in the schema metadata ("" if none)."""
    return (schema.metadata or {}).get(META_NAME, b"").decode()
