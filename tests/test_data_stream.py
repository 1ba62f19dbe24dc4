"""Producer and consumer as separate OS processes over real files: streaming, SIGKILL, resume.

This file doubles as the child-process entry point: ``python test_data_stream.py ROLE ARGS...``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from slurm_rl.data import ROLLOUTS, CorruptShardError, ManifestTimeout, StageReader, StageWriter
from slurm_rl.data.emulated import make_fake_prompts, make_fake_rollouts
from slurm_rl.data.layout import manifest_path, stage_dir

ITER = 7
STAGE = "rollouts"
CHILD_TIMEOUT_S = 60.0


def _shard_table(rank: int, seq: int, rows: int, response_len: int | tuple[int, int]) -> pa.Table:
    """Deterministic shard ``seq`` of producer ``rank``: sample ids are unique per (rank, seq, row)."""
    prompts = make_fake_prompts(ITER, rows, 32, seed=rank * 1000 + seq)
    t = make_fake_rollouts(prompts, 1, response_len, seed=seq, rollout_rank=rank)
    ids = pa.array(ITER * 10**9 + rank * 10**6 + seq * rows + np.arange(rows), pa.int64())
    return t.set_column(0, "sample_id", ids).replace_schema_metadata(ROLLOUTS.metadata)


def _wait_for(path: Path, what: str) -> None:
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"pid {os.getpid()}: timed out after {CHILD_TIMEOUT_S}s waiting for {what} ({path})")
        time.sleep(0.005)


# -- child roles ------------------------------------------------------------------------------
def producer(run_dir: str, rank: int, n_shards: int, rows: int, handshake: str, log: str) -> None:
    """Write ``n_shards`` shards; after the first, wait until the consumer acknowledges it."""
    written = []
    with StageWriter(run_dir, ITER, STAGE, rank, ROLLOUTS) as w:
        for seq in range(len(w.shards), n_shards):
            w.write(_shard_table(rank, seq, rows, (16, 128)))
            written.append(time.time())
            if seq == 0 and handshake != "-":
                _wait_for(Path(handshake), "the consumer's ack of shard 0")
    Path(log).write_text(json.dumps({"written_at": written}))


def consumer(run_dir: str, ranks: str, ack: str, log: str) -> None:
    """Stream the stage; write the ack file right after the first shard arrives."""
    reader = StageReader(run_dir, ITER, STAGE, [int(r) for r in ranks.split(",")], 0.005, CHILD_TIMEOUT_S, schema=ROLLOUTS)
    received, ids = [], []
    for shard in reader.iter_entries():
        received.append([shard.producer_rank, shard.seq, shard.received_at, shard.info.created_at])
        ids.extend(shard.table.column("sample_id").to_pylist())
        if ack != "-" and not Path(ack).exists():
            Path(ack).write_text("ok")
    Path(log).write_text(json.dumps({"received": received, "ids": ids}))


def endless_producer(run_dir: str, rank: int, rows: int, resp_len: int, n_shards: int) -> None:
    """Write big shards (until ``n_shards``, or forever when resumed with a huge count)."""
    w = StageWriter(run_dir, ITER, STAGE, rank, ROLLOUTS)
    for seq in range(len(w.shards), n_shards):
        w.write(_shard_table(rank, seq, rows, resp_len))
    w.close()


def _spawn(*args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *map(str, args)], stderr=subprocess.PIPE, text=True)


def _join(p: subprocess.Popen, what: str) -> None:
    try:
        _, err = p.communicate(timeout=CHILD_TIMEOUT_S * 2)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError(f"{what} (pid {p.pid}) did not finish") from None
    assert p.returncode == 0, f"{what} failed (rc {p.returncode}):\n{err}"


# -- tests ------------------------------------------------------------------------------------
def test_consumer_streams_before_producer_finishes(tmp_path: Path) -> None:
    ack, plog, clog = tmp_path / "ack", tmp_path / "producer.json", tmp_path / "consumer.json"
    c = _spawn("consumer", tmp_path, "0", ack, clog)  # consumer starts first: nothing exists yet
    p = _spawn("producer", tmp_path, 0, 6, 50, ack, plog)
    _join(p, "producer")
    _join(c, "consumer")
    prod, cons = json.loads(plog.read_text()), json.loads(clog.read_text())
    assert [r[1] for r in cons["received"]] == list(range(6))
    # The first shard reached the consumer before the producer wrote its last one (the producer
    # even blocks on the consumer's ack, so a consumer that waited for completion would deadlock).
    assert cons["received"][0][2] < prod["written_at"][-1]
    assert cons["received"][0][2] < prod["written_at"][1]
    assert len(cons["ids"]) == len(set(cons["ids"])) == 6 * 50


@pytest.mark.slow
def test_many_producers_one_stage_concurrently(tmp_path: Path) -> None:
    clog = tmp_path / "consumer.json"
    c = _spawn("consumer", tmp_path, "0,1,2", "-", clog)
    ps = [_spawn("producer", tmp_path, r, 4, 30, "-", tmp_path / f"p{r}.json") for r in range(3)]
    for r, p in enumerate(ps):
        _join(p, f"producer {r}")
    _join(c, "consumer")
    cons = json.loads(clog.read_text())
    expected = {ITER * 10**9 + r * 10**6 + i for r in range(3) for i in range(4 * 30)}
    assert len(cons["ids"]) == len(expected) and set(cons["ids"]) == expected
    for r in range(3):  # per producer, shards arrive in order
        assert [x[1] for x in cons["received"] if x[0] == r] == list(range(4))


def _freeze_mid_write(p: subprocess.Popen, d: Path, rank: int) -> list[Path]:
    """SIGSTOP the producer while it has a shard temp file open (after >= 1 published shard)."""
    mp = manifest_path(d.parents[1].parent, ITER, STAGE, rank)
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while time.monotonic() < deadline:
        assert p.poll() is None, "producer exited before it could be killed"
        listed = json.loads(mp.read_bytes())["shards"] if mp.exists() else []
        if listed and list(d.glob(f".shard-{rank:04d}-*.tmp")):
            os.kill(p.pid, signal.SIGSTOP)
            tmp = list(d.glob(f".shard-{rank:04d}-*.tmp"))
            if tmp:
                return tmp
            os.kill(p.pid, signal.SIGCONT)  # it renamed just before it stopped; try the next shard
        time.sleep(0.001)
    raise AssertionError(f"never saw producer rank {rank} mid-write in {d}")


@pytest.mark.slow
def test_sigkill_mid_write_then_resume(tmp_path: Path) -> None:
    rows, resp_len, total = 1000, 2000, 5  # ~8 MB shards
    d = stage_dir(tmp_path, ITER, STAGE)
    p = _spawn("endless", tmp_path, 0, rows, resp_len, 10**6)
    tmp_files = _freeze_mid_write(p, d, 0)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=CHILD_TIMEOUT_S)
    assert all(t.exists() for t in tmp_files)  # killed with a partial shard on disk
    listed = len(json.loads(manifest_path(tmp_path, ITER, STAGE, 0).read_bytes())["shards"])
    assert 1 <= listed < total

    got = []
    with pytest.raises(ManifestTimeout) as ei:
        for t in StageReader(tmp_path, ITER, STAGE, [0], 0.01, 1.0, schema=ROLLOUTS).iter_shards():
            got.append(t)
    assert ei.value.missing_ranks == [0] and f"rank 0: {listed} shards, incomplete" in str(ei.value)
    assert len(got) == listed  # exactly the published shards, all verified; the partial one never

    r = _spawn("endless", tmp_path, 0, rows, resp_len, total)  # a new process resumes rank 0
    _join(r, "resumed producer")
    assert not list(d.glob(".*.tmp"))
    table = StageReader(tmp_path, ITER, STAGE, [0], 0.01, 10.0, schema=ROLLOUTS).read_all()
    ids = table.column("sample_id").to_pylist()
    assert sorted(ids) == [ITER * 10**9 + i for i in range(total * rows)]


def test_reader_rejects_shard_corrupted_while_streaming(tmp_path: Path) -> None:
    w = StageWriter(tmp_path, ITER, STAGE, 0, ROLLOUTS)
    w.write(_shard_table(0, 0, 20, 8))
    it = StageReader(tmp_path, ITER, STAGE, [0], 0.005, 5.0).iter_shards()
    assert next(it).num_rows == 20
    info = w.write(_shard_table(0, 1, 20, 8))
    path = stage_dir(tmp_path, ITER, STAGE) / info.name
    with open(path, "r+b") as f:
        f.seek(info.bytes // 3)
        b = f.read(1)
        f.seek(info.bytes // 3)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(CorruptShardError) as ei:
        next(it)
    assert ei.value.path == str(path)


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "producer":
        producer(args[0], int(args[1]), int(args[2]), int(args[3]), args[4], args[5])
    elif role == "consumer":
        consumer(args[0], args[1], args[2], args[3])
    elif role == "endless":
        endless_producer(args[0], int(args[1]), int(args[2]), int(args[3]), int(args[4]))
    else:
        raise SystemExit(f"unknown role {role!r}")


def test_a_reparsed_manifest_takes_known_entries_and_validates_changed_ones(tmp_path: Path) -> None:
    """A follower re-reading an append-only manifest passes what it parsed before: equal entries are
    taken as they are, a changed or new entry is validated as any other."""
    from slurm_rl.data import InvalidManifestError
    from slurm_rl.data.manifest import ProducerManifest, ShardInfo

    def entry(seq: int, rows: int = 2) -> ShardInfo:
        return ShardInfo(name=f"shard-0003-{seq:06d}.arrow", rows=rows, bytes=10, tokens=4, xxh3_64="0" * 16,
                         sample_id_min=seq, sample_id_max=seq + 1, sample_count=rows, created_at=1.0)

    def raw(shards: list[ShardInfo]) -> bytes:
        doc = ProducerManifest(5, "rollouts", 3, 1, shards=shards).to_json()
        return json.dumps(doc).encode()

    where = tmp_path / "manifest-0003.json"
    first = ProducerManifest.parse(raw([entry(0)]), where, iteration=5, stage="rollouts", producer_rank=3)
    assert first.shards == [entry(0)] and first.shards[0].to_json() == json.loads(raw([entry(0)]))["shards"][0]
    again = ProducerManifest.parse(raw([entry(0), entry(1)]), where, iteration=5, stage="rollouts",
                                   producer_rank=3, known=first.shards)
    assert again.shards[0] is first.shards[0] and again.shards[1] == entry(1)
    changed = ProducerManifest.parse(raw([entry(0, rows=3)]), where, iteration=5, stage="rollouts",
                                     producer_rank=3, known=first.shards)
    assert changed.shards == [entry(0, rows=3)]
    bad = json.loads(raw([entry(0)]))
    bad["shards"][0]["rows"] = -1
    with pytest.raises(InvalidManifestError, match=r"shards\[0\].rows"):
        ProducerManifest.parse(json.dumps(bad).encode(), where, iteration=5, stage="rollouts", producer_rank=3,
                               known=first.shards)
