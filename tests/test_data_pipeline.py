"""Emulated end-to-end flow prompts -> rollout -> inference -> actor over real files (threads)."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa

from slurm_rl.data import (
    INFERENCE,
    PROMPTS,
    ROLLOUTS,
    StageReader,
    StageWriter,
    iter_dp_share,
    read_dp_share,
)
from slurm_rl.data.actor_batch import make_actor_batch
from slurm_rl.data.emulated import make_fake_inference, make_fake_prompts, make_fake_rollouts

IT, GROUP, N_PROMPTS = 5, 4, 24
TIMEOUT = 30.0


def test_pipeline_streams_and_accounts_every_sample(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    received_by_inference: list[float] = []
    inference_started = threading.Event()

    def guarded(fn, *args) -> None:  # noqa: ANN001
        try:
            fn(*args)
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    def data_loader() -> None:  # rank 0
        prompts = make_fake_prompts(IT, N_PROMPTS, (16, 256), seed=0)
        with StageWriter(tmp_path, IT, "prompts", 0, PROMPTS) as w:
            for i in range(0, N_PROMPTS, 6):
                w.write(prompts.slice(i, 6))

    def rollout(rank: int, dp_rank: int) -> None:  # ranks 1, 2
        reader = StageReader(tmp_path, IT, "prompts", [0], 0.005, TIMEOUT, schema=PROMPTS)
        with StageWriter(tmp_path, IT, "rollouts", rank, ROLLOUTS) as w:
            for share in iter_dp_share(reader, dp_rank, 2):
                if share.num_rows:
                    w.write(make_fake_rollouts(share, GROUP, (8, 512), seed=rank, rollout_rank=rank))
                    # rank 1 holds back its remaining shards until inference consumed one
                    if rank == 1 and not inference_started.wait(TIMEOUT):
                        raise TimeoutError(f"rollout rank {rank}: inference consumed nothing in {TIMEOUT}s")

    def inference(rank: int) -> None:  # rank 3
        reader = StageReader(tmp_path, IT, "rollouts", [1, 2], 0.005, TIMEOUT, schema=ROLLOUTS)
        with StageWriter(tmp_path, IT, "inference", rank, INFERENCE) as w:
            for shard in reader.iter_entries():
                received_by_inference.append(shard.received_at)
                inference_started.set()
                w.write(make_fake_inference(shard.table, inference_rank=rank))

    threads = [threading.Thread(target=guarded, args=a) for a in
               [(inference, 3), (rollout, 1, 0), (rollout, 2, 1), (data_loader,)]]
    for t in threads:
        t.start()
    # Actor: 2 DP ranks, whole GRPO groups per rank.
    shares = [
        read_dp_share(tmp_path, IT, "inference", [3], r, 2, poll_interval_s=0.005, timeout_s=TIMEOUT, group_column="group_id")
        for r in range(2)
    ]
    for t in threads:
        t.join(TIMEOUT)
    assert not errors, errors
    batches = [make_actor_batch(s) for s in shares]
    ids = [i for b in batches for i in b.column("sample_id").to_pylist()]
    assert sorted(ids) == [IT * 10**9 + i for i in range(N_PROMPTS * GROUP)]
    for b in batches:  # GRPO advantages are centred within each (complete) group
        t = pa.TableGroupBy(b, "group_id").aggregate([("advantage", "sum"), ("advantage", "count")])
        assert all(abs(x) < 1e-4 for x in t.column("advantage_sum").to_pylist())
        assert set(t.column("advantage_count").to_pylist()) == {GROUP}
    rollout_written = [
        s.info.created_at for s in StageReader(tmp_path, IT, "rollouts", [1, 2], timeout_s=5).iter_entries()
    ]
    assert min(received_by_inference) < max(rollout_written)  # inference overlapped with rollout
