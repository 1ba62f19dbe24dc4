"""Actor -> rollout weight sync over a real gloo group of 3 processes."""

from __future__ import annotations

import datetime
import json
import os
import re
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from slurm_rl.engines.actor.local_dist import PRELOAD
from slurm_rl.engines.model_config import ModelConfig

CFG = ModelConfig(vocab_size=40, hidden_size=64, num_layers=2, num_attention_heads=2,
                  max_position_embeddings=64)
SEQS = [[1, 5, 6, 7, 8], [1, 9, 3]]


def _worker(rank: int, world: int, store_path: str, out_dir: str, absent: int) -> None:
    torch.set_num_threads(1)
    from slurm_rl.engines.convert import hf_param_shapes, hf_to_megatron, megatron_to_hf
    from slurm_rl.engines.rollout.hf import HFRolloutEngine, build_hf_model
    from slurm_rl.engines.weight_sync import WeightSyncError, broadcast_weights

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=30))
    result: dict = {"rank": rank}
    present = dist.new_group([r for r in range(world) if r != absent]) if absent >= 0 else None
    try:
        if rank == absent:  # alive but busy elsewhere: never joins the sync
            deadline = time.monotonic() + 60
            while not Path(out_dir, "rank0.json").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            return
        if rank == 0:  # the actor: megatron-named weights of a seed-7 model
            actor = build_hf_model(CFG, seed=7)
            meg = list(hf_to_megatron(actor.named_parameters(), CFG))
            if present is not None:
                dist.barrier(group=present)  # the present ranks start the sync together
            _, stats = broadcast_weights(megatron_to_hf(meg, CFG), 0, dist.group.WORLD,
                                         timeout=3.0 if absent >= 0 else 30.0,
                                         bucket_bytes=20_000, what="weight sync v1")
        else:  # a rollout rank
            engine = HFRolloutEngine(CFG, seed=0)
            if present is not None:
                dist.barrier(group=present)
            got, stats = broadcast_weights(None, 0, dist.group.WORLD,
                                           expected=dict(hf_param_shapes(CFG)),
                                           timeout=3.0 if absent >= 0 else 30.0,
                                           what="weight sync v1")
            engine.update_weights(got, version=1)
            result["scores"] = [s.tolist() for s in engine.score(SEQS)]
            result["version"] = engine.weight_version
        result.update(bytes=stats.bytes, buckets=stats.buckets, tensors=stats.tensors,
                      seconds=stats.seconds)
    except WeightSyncError as err:
        result["error"] = str(err)
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        if rank != absent:
            if "error" in result:
                time.sleep(3.0)  # let rank 0 time out on its own rather than see us leave
            os._exit(0)  # do not wait in destroy for the absent peer


def _run(tmp_path: Path, world: int, absent: int = -1) -> dict[int, dict]:
    # forked from the multiprocessing fork server that imported torch once (local_dist's: shared by
    # this process's runs), not spawned: a spawned rank imports torch and transformers again (~5 s of CPU)
    mp.get_context("forkserver").set_forkserver_preload(PRELOAD)
    mp.start_processes(_worker, args=(world, str(tmp_path / "store"), str(tmp_path), absent),
                       nprocs=world, start_method="forkserver", join=True)
    return {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)}


@pytest.mark.slow
def test_broadcast_reaches_all_rollout_ranks(tmp_path: Path) -> None:
    from slurm_rl.engines.rollout.hf import HFRolloutEngine

    out = _run(tmp_path, world=3)
    expected = [s.tolist() for s in HFRolloutEngine(CFG, seed=7).score(SEQS)]
    n_bytes = CFG.num_parameters() * 4
    for r in (1, 2):
        assert "error" not in out[r], out[r]
        assert out[r]["version"] == 1
        for got, want in zip(out[r]["scores"], expected):
            assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-6)
        assert out[r]["bytes"] == n_bytes and out[r]["buckets"] > 3
    assert out[0]["bytes"] == n_bytes and out[0]["tensors"] == out[1]["tensors"]


@pytest.mark.slow
def test_missing_rank_is_named(tmp_path: Path) -> None:
    out = _run(tmp_path, world=3, absent=2)
    assert "error" in out[0]
    err = out[0]["error"]
    assert "weight sync v1 on rank 0" in err and "group ranks [0, 1, 2]" in err
    assert re.search(r"Ranks? 2 failed", err)  # the monitored barrier names the absent rank
    assert "error" in out[1] and "rank 1" in out[1]["error"]
