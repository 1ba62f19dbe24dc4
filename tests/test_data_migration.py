"""Pending-request migration: exclusive claims across processes, exact sample accounting.

This file doubles as the child-process entry point: ``python test_data_migration.py claimer ...``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from slurm_rl.data import (
    PENDING,
    ROLLOUTS,
    CorruptShardError,
    DataPlaneError,
    InvalidManifestError,
    StageReader,
    StageWriter,
    claim_pending,
    list_pending,
    load_claimed,
    write_pending,
)
from slurm_rl.data.emulated import advance_requests, finish_requests, make_fake_prompts, make_fake_requests
from slurm_rl.data.migration import pending_dir

ITER = 4
GROUP = 4
CHILD_TIMEOUT_S = 60.0


def _requests(n_prompts: int = 50) -> pa.Table:
    return make_fake_requests(make_fake_prompts(ITER, n_prompts, (8, 32), seed=3), GROUP, seed=5)


def claimer(run_dir: str, rank: int, own_start: int, own_stop: int, start_flag: str, log: str) -> None:
    """A remaining rollout rank: finish its own requests, then claim pending ones until none are left."""
    own = _requests().slice(own_start, own_stop - own_start)
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while not Path(start_flag).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"claimer rank {rank}: no start flag {start_flag} after {CHILD_TIMEOUT_S}s")
        time.sleep(0.002)
    claimed_ids: list[int] = []
    with StageWriter(run_dir, ITER, "rollouts", rank, ROLLOUTS) as w:
        if own.num_rows:
            w.write(finish_requests(own, (40, 60), rollout_rank=rank))
        while True:
            got = claim_pending(run_dir, ITER, rank, max_rows=1)
            if got.num_rows == 0:
                break
            claimed_ids.extend(got.column("sample_id").to_pylist())
            w.write(finish_requests(got, (40, 60), rollout_rank=rank))
    Path(log).write_text(json.dumps({"claimed": claimed_ids}))


def _spawn(*args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *map(str, args)], stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_concurrent_claims_every_sample_exactly_once(tmp_path: Path) -> None:
    reqs = _requests()  # 200 samples; ranks 0..3 own 50 each
    total = reqs.num_rows
    # Ranks 2 and 3 are released by an epoch: each finished 10 requests, the rest are partial.
    partial: dict[int, list[int]] = {}
    for rank in (2, 3):
        mine = reqs.slice(rank * 50, 50)
        with StageWriter(tmp_path, ITER, "rollouts", rank, ROLLOUTS) as w:
            w.write(finish_requests(mine.slice(0, 10), 50, rollout_rank=rank))
        rest = advance_requests(mine.slice(10), (1, 20), seed=rank)
        for sid, ids in zip(rest.column("sample_id").to_pylist(), rest.column("partial_response_ids").to_pylist()):
            partial[sid] = ids
        tickets = write_pending(tmp_path, ITER, rank, rest, tag=9, num_chunks=10)
        assert sum(t.rows for t in tickets) == 40
    assert len(list_pending(tmp_path, ITER)) == 20

    flag = tmp_path / "go"
    # Ranks 0 and 1 keep their own work; ranks 4 and 5 only take migrated work.
    procs = {
        r: _spawn("claimer", tmp_path, r, start, stop, flag, tmp_path / f"claim-{r}.json")
        for r, start, stop in ((0, 0, 50), (1, 50, 100), (4, 0, 0), (5, 0, 0))
    }
    time.sleep(0.2)
    flag.write_text("go")  # all claimers race for the same tickets
    for r, p in procs.items():
        _, err = p.communicate(timeout=CHILD_TIMEOUT_S * 2)
        assert p.returncode == 0, f"claimer {r} failed:\n{err}"

    claimed = {r: json.loads((tmp_path / f"claim-{r}.json").read_text())["claimed"] for r in procs}
    flat = [i for ids in claimed.values() for i in ids]
    assert len(flat) == len(set(flat)) == 80 and set(flat) == set(partial)
    assert list_pending(tmp_path, ITER) == []

    out = StageReader(tmp_path, ITER, "rollouts", [0, 1, 2, 3, 4, 5], 0.01, 30.0, schema=ROLLOUTS).read_all()
    ids = out.column("sample_id").to_pylist()
    assert len(ids) == total and set(ids) == set(reqs.column("sample_id").to_pylist())
    # Migrated samples continue from their partial response.
    for sid, resp in zip(ids, out.column("response_ids").to_pylist()):
        if sid in partial:
            assert resp[: len(partial[sid])] == partial[sid]
    for r in procs:
        assert sorted(load_claimed(tmp_path, ITER, r).column("sample_id").to_pylist()) == sorted(claimed[r])


def test_claim_limits_sources_and_exclusivity(tmp_path: Path) -> None:
    reqs = _requests(10)
    write_pending(tmp_path, ITER, 1, reqs.slice(0, 20), num_chunks=4)
    write_pending(tmp_path, ITER, 2, reqs.slice(20, 20), num_chunks=2)
    with pytest.raises(DataPlaneError, match="already exists"):
        write_pending(tmp_path, ITER, 1, reqs.slice(0, 20), num_chunks=4)
    a = claim_pending(tmp_path, ITER, 5, max_rows=6, from_ranks=[1])
    assert a.num_rows == 10 and set(a.column("sample_id").to_pylist()) < set(reqs.column("sample_id").to_pylist()[:20])
    b = claim_pending(tmp_path, ITER, 6, from_ranks=[2])
    assert b.num_rows == 20
    c = claim_pending(tmp_path, ITER, 7)
    d = claim_pending(tmp_path, ITER, 8)
    assert c.num_rows == 10 and d.num_rows == 0 and d.schema.equals(PENDING)
    all_ids = a.column("sample_id").to_pylist() + b.column("sample_id").to_pylist() + c.column("sample_id").to_pylist()
    assert sorted(all_ids) == sorted(reqs.column("sample_id").to_pylist())


def test_pending_from_dicts_and_corruption(tmp_path: Path) -> None:
    rows = _requests(2).to_pylist()
    write_pending(tmp_path, ITER, 3, rows)
    d = pending_dir(tmp_path, ITER)
    arrow = d / "pending-0003-000000-000.arrow"
    data = bytearray(arrow.read_bytes())
    data[-40] ^= 0xFF
    arrow.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError) as ei:
        claim_pending(tmp_path, ITER, 0)
    assert ei.value.path == str(arrow)


def test_ticket_names_are_validated(tmp_path: Path) -> None:
    write_pending(tmp_path, ITER, 3, _requests(1))
    ticket = pending_dir(tmp_path, ITER) / "pending-0003-000000-000.json"
    obj = json.loads(ticket.read_text())
    obj["arrow"] = "../../rollouts/shard-0000-000000.arrow"
    ticket.write_text(json.dumps(obj))
    with pytest.raises(InvalidManifestError, match="refusing"):
        claim_pending(tmp_path, ITER, 0)


def test_duplicate_sample_ids_refused(tmp_path: Path) -> None:
    reqs = _requests(1)
    with pytest.raises(DataPlaneError, match="duplicate"):
        write_pending(tmp_path, ITER, 0, pa.concat_tables([reqs, reqs]))


if __name__ == "__main__":
    if sys.argv[1] != "claimer":
        raise SystemExit(f"unknown role {sys.argv[1]!r}")
    a = sys.argv[2:]
    claimer(a[0], int(a[1]), int(a[2]), int(a[3]), a[4], a[5])
