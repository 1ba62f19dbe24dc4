"""Writer/reader round trips, zero-copy reads, corruption, manifest validation (single process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from slurm_rl.data import (
    ACTOR_BATCH,
    INFERENCE,
    PROMPTS,
    ROLLOUTS,
    SCHEMA_VERSION,
    CorruptShardError,
    DataPlaneError,
    InvalidManifestError,
    ManifestTimeout,
    StageReader,
    StageWriter,
    make_sample_id,
    write_expected,
)
from slurm_rl.data.actor_batch import make_actor_batch
from slurm_rl.data.emulated import make_fake_inference, make_fake_prompts, make_fake_rollouts
from slurm_rl.data.layout import manifest_path, stage_dir
from slurm_rl.data.schemas import META_VERSION, split_sample_id


def _rollouts(iteration: int = 1, n_prompts: int = 8, group: int = 4) -> pa.Table:
    prompts = make_fake_prompts(iteration, n_prompts, (16, 64), seed=0)
    return make_fake_rollouts(prompts, group, (8, 256), seed=1)


def _write(run_dir: Path, table: pa.Table, rank: int = 0, parts: int = 3, stage: str = "rollouts") -> None:
    with StageWriter(run_dir, 1, stage, rank, table.schema) as w:
        step = -(-table.num_rows // parts)
        for i in range(0, table.num_rows, step):
            w.write(table.slice(i, step))


def test_schemas_are_versioned_and_typed() -> None:
    for s in (PROMPTS, ROLLOUTS, INFERENCE, ACTOR_BATCH):
        assert s.metadata[META_VERSION] == str(SCHEMA_VERSION).encode()
    assert ROLLOUTS.field("response_ids").type == pa.list_(pa.int32())
    assert ROLLOUTS.field("sampled_logprobs").type == pa.list_(pa.float32())
    assert INFERENCE.field("values").nullable
    sid = make_sample_id(12, 5, 3, 8)
    assert sid == 12 * 10**9 + 43 and split_sample_id(sid) == (12, 43)
    with pytest.raises(ValueError):
        make_sample_id(1, 0, 8, 8)


def test_emulated_pipeline_shapes() -> None:
    r = _rollouts(iteration=3, n_prompts=5, group=4)
    ids = r.column("sample_id").to_pylist()
    assert ids == [3 * 10**9 + i for i in range(20)]
    a = make_actor_batch(make_fake_inference(r))
    assert a.schema.equals(ACTOR_BATCH) and a.num_rows == 20
    lengths = [len(x) for x in r.column("response_ids").to_pylist()]
    assert lengths == [len(x) for x in r.column("sampled_logprobs").to_pylist()]


def test_roundtrip_zero_copy_and_manifest(tmp_path: Path) -> None:
    table = _rollouts()
    _write(tmp_path, table, rank=2)
    before = pa.total_allocated_bytes()
    reader = StageReader(tmp_path, 1, "rollouts", [2], timeout_s=5, schema=ROLLOUTS)
    entries = list(reader.iter_entries())
    assert pa.total_allocated_bytes() == before  # buffers point into the memory maps
    assert [e.seq for e in entries] == [0, 1, 2]
    assert pa.concat_tables([e.table for e in entries]).equals(table)
    m = json.loads(manifest_path(tmp_path, 1, "rollouts", 2).read_bytes())
    assert m["complete"] is True and m["rows"] == table.num_rows
    assert sum(s["tokens"] for s in m["shards"]) == m["tokens"] > 0
    assert m["shards"][0]["sample_id_min"] == table.column("sample_id")[0].as_py()
    assert oct(stage_dir(tmp_path, 1, "rollouts").stat().st_mode & 0o777) == "0o700"


def test_dict_input_and_schema_enforced(tmp_path: Path) -> None:
    prompts = make_fake_prompts(1, 3, 4, seed=0)
    with StageWriter(tmp_path, 1, "prompts", 0, PROMPTS) as w:
        w.write(prompts.to_pydict())
        with pytest.raises(DataPlaneError, match="missing"):
            w.write({"group_id": [1]})
    out = StageReader(tmp_path, 1, "prompts", [0], timeout_s=5, schema=PROMPTS).read_all()
    assert out.equals(prompts)
    with pytest.raises(DataPlaneError, match="schema mismatch"):
        StageReader(tmp_path, 1, "prompts", [0], timeout_s=5, schema=ROLLOUTS).read_all()


def test_schema_version_checked_on_read(tmp_path: Path) -> None:
    old = ROLLOUTS.with_metadata({**ROLLOUTS.metadata, META_VERSION: b"0"})
    with pytest.raises(DataPlaneError, match="schema version"):
        StageWriter(tmp_path, 1, "rollouts", 0, old)


def _corrupt_setup(tmp_path: Path) -> tuple[pa.Table, Path]:
    table = _rollouts()
    _write(tmp_path, table, parts=2)
    return table, stage_dir(tmp_path, 1, "rollouts") / "shard-0000-000001.arrow"


def test_flipped_byte_raises_corrupt_shard_naming_path(tmp_path: Path) -> None:
    table, victim = _corrupt_setup(tmp_path)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    got = []
    with pytest.raises(CorruptShardError) as ei:
        for t in StageReader(tmp_path, 1, "rollouts", [0], timeout_s=5).iter_shards():
            got.append(t)
    assert str(victim) in str(ei.value) and "xxh3_64" in str(ei.value)
    assert len(got) == 1  # the intact first shard only; the bad one never reached the caller


def test_truncated_and_missing_shard(tmp_path: Path) -> None:
    _, victim = _corrupt_setup(tmp_path)
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(CorruptShardError, match="truncated") as ei:
        StageReader(tmp_path, 1, "rollouts", [0], timeout_s=5).read_all()
    assert ei.value.path == str(victim)
    victim.unlink()
    with pytest.raises(CorruptShardError, match="missing"):
        StageReader(tmp_path, 1, "rollouts", [0], timeout_s=5).read_all()


def test_unlisted_shard_is_never_read(tmp_path: Path) -> None:
    table = _rollouts()
    _write(tmp_path, table, parts=2)
    d = stage_dir(tmp_path, 1, "rollouts")
    (d / "shard-0000-000002.arrow").write_bytes((d / "shard-0000-000000.arrow").read_bytes())
    assert StageReader(tmp_path, 1, "rollouts", [0], timeout_s=5).read_all().num_rows == table.num_rows


@pytest.mark.parametrize(
    "bad", ["../shard-0000-000000.arrow", "/etc/passwd", "sub/shard-0000-000000.arrow", "shard-0001-000000.arrow", "x.arrow", 7]
)
def test_manifest_shard_names_are_validated(tmp_path: Path, bad: object) -> None:
    _write(tmp_path, _rollouts(), parts=1)
    mp = manifest_path(tmp_path, 1, "rollouts", 0)
    m = json.loads(mp.read_bytes())
    m["shards"][0]["name"] = bad
    mp.write_text(json.dumps(m))
    with pytest.raises(InvalidManifestError) as ei:
        StageReader(tmp_path, 1, "rollouts", [0], timeout_s=5).read_all()
    assert str(mp) in str(ei.value)


def test_bad_stage_names_rejected(tmp_path: Path) -> None:
    for stage in ("../x", "a/b", "", "Rollouts"):
        with pytest.raises(DataPlaneError, match="invalid stage"):
            StageWriter(tmp_path, 1, stage, 0, ROLLOUTS)


def test_timeout_names_stage_iteration_and_missing_ranks(tmp_path: Path) -> None:
    table = _rollouts()
    _write(tmp_path, table, rank=0, parts=1)
    w = StageWriter(tmp_path, 1, "rollouts", 3, ROLLOUTS)
    w.write(table.slice(0, 2))  # rank 3 never completes; rank 5 never starts
    reader = StageReader(
        tmp_path, 1, "rollouts", [0, 3, 5], poll_interval_s=0.01, timeout_s=0.3, who="rank 9 on n01, epoch 4"
    )
    seen = []
    with pytest.raises(ManifestTimeout) as ei:
        for t in reader.iter_shards():
            seen.append(t.num_rows)
    msg = str(ei.value)
    assert msg.startswith("rank 9 on n01, epoch 4: iteration 1") and "'rollouts'" in msg and "[3, 5]" in msg and "no manifest" in msg
    assert ei.value.missing_ranks == [3, 5]
    assert sorted(seen) == sorted([table.num_rows, 2])


def test_expected_file_drives_reader(tmp_path: Path) -> None:
    table = _rollouts()
    _write(tmp_path, table, rank=1, parts=2)
    _write(tmp_path, table, rank=4, parts=1)
    write_expected(tmp_path, 1, "rollouts", [4, 1])
    out = StageReader(tmp_path, 1, "rollouts", None, timeout_s=5).read_all()
    assert out.num_rows == 2 * table.num_rows


def test_writer_resumes_incomplete_and_refuses_complete(tmp_path: Path) -> None:
    table = _rollouts()
    w = StageWriter(tmp_path, 1, "rollouts", 0, ROLLOUTS)
    w.write(table.slice(0, 10))
    d = stage_dir(tmp_path, 1, "rollouts")
    (d / ".shard-0000-000001.arrow.123.abcd.tmp").write_bytes(b"partial")  # as left by a killed process
    del w
    w2 = StageWriter(tmp_path, 1, "rollouts", 0, ROLLOUTS)
    assert w2.resumed and len(w2.shards) == 1
    assert not list(d.glob(".*.tmp"))
    assert w2.write(table.slice(10)).name == "shard-0000-000001.arrow"
    w2.close()
    assert StageReader(tmp_path, 1, "rollouts", [0], timeout_s=5).read_all().equals(table)
    with pytest.raises(DataPlaneError, match="already completed"):
        StageWriter(tmp_path, 1, "rollouts", 0, ROLLOUTS)


def test_exception_in_context_does_not_mark_complete(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with StageWriter(tmp_path, 1, "rollouts", 0, ROLLOUTS) as w:
            w.write(_rollouts().slice(0, 3))
            raise RuntimeError("boom")
    m = json.loads(manifest_path(tmp_path, 1, "rollouts", 0).read_bytes())
    assert m["complete"] is False and len(m["shards"]) == 1


def test_manifest_must_stay_append_only(tmp_path: Path) -> None:
    table = _rollouts()
    w = StageWriter(tmp_path, 1, "rollouts", 0, ROLLOUTS)
    w.write(table.slice(0, 5))
    reader = StageReader(tmp_path, 1, "rollouts", [0], poll_interval_s=0.01, timeout_s=5).iter_shards()
    assert next(reader).num_rows == 5
    mp = manifest_path(tmp_path, 1, "rollouts", 0)
    m = json.loads(mp.read_bytes())
    m["shards"][0]["rows"] = 4
    tmp = mp.with_name("x.json")
    tmp.write_text(json.dumps(m))
    os.replace(tmp, mp)
    with pytest.raises(InvalidManifestError, match="append-only"):
        next(reader)


def test_expected_file_can_grow_until_final(tmp_path: Path) -> None:
    table = _rollouts()
    write_expected(tmp_path, 1, "rollouts", [0], final=False)
    _write(tmp_path, table, rank=0, parts=1)
    # Not final yet: a reader must keep waiting even though every listed producer is complete.
    early = StageReader(tmp_path, 1, "rollouts", None, poll_interval_s=0.01, timeout_s=0.3)
    with pytest.raises(ManifestTimeout, match="not final"):
        list(early.iter_shards())
    it = StageReader(tmp_path, 1, "rollouts", None, poll_interval_s=0.01, timeout_s=5).iter_entries()
    assert next(it).producer_rank == 0
    write_expected(tmp_path, 1, "rollouts", [0, 2], final=True)  # rollout grew in a new epoch
    _write(tmp_path, table, rank=2, parts=1)
    assert next(it).producer_rank == 2
    assert list(it) == []
    write_expected(tmp_path, 1, "rollouts", [2], final=True)
    with pytest.raises(InvalidManifestError, match=r"removed"):
        reader = StageReader(tmp_path, 1, "rollouts", None, timeout_s=5)
        reader.add_producers([0])
        list(reader.iter_shards())


def test_missing_expected_file_times_out_clearly(tmp_path: Path) -> None:
    with pytest.raises(ManifestTimeout, match="expected.json"):
        list(StageReader(tmp_path, 1, "rollouts", None, poll_interval_s=0.01, timeout_s=0.2).iter_shards())


def test_on_poll_hook_can_abort_a_wait(tmp_path: Path) -> None:
    class DeadPeer(RuntimeError):
        pass

    def check() -> None:
        raise DeadPeer("rank 3 heartbeat stale")

    with pytest.raises(DeadPeer):
        list(StageReader(tmp_path, 1, "rollouts", [3], poll_interval_s=0.01, timeout_s=5, on_poll=check).iter_shards())


def test_data_plane_stays_light() -> None:
    """Emulated ranks import the data plane without torch, engines, config or control."""
    import subprocess
    import sys

    code = (
        "import sys, slurm_rl.data, slurm_rl.data.emulated\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'slurm_rl.config', "
        "'slurm_rl.control', 'slurm_rl.engines', 'megatron', 'vllm'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
