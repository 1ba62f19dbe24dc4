"""Benchmark in-place actor resharding on CPU/gloo; prints one JSON document.

For each model size and DP transition: seconds and bytes of ``ActorTrainer.reshard``, next to
(a) a gloo broadcast of the same per-joiner bytes over the same ranks (bandwidth bound) and
(b) save + load of the same state (params + Adam moments) through megatron-core
``dist_checkpointing`` on local disk.

    .venv/bin/python tools/bench_reshard.py --sizes 10M 50M --transitions 1-2 2-4 4-2
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

from slurm_rl.engines.actor.groups import GroupCache, transition_rank_sets
from slurm_rl.engines.actor.local_dist import run_local
from slurm_rl.engines.actor.microbatch import BatchConfig
from slurm_rl.engines.actor.optimizer import OptimConfig
from slurm_rl.engines.actor.trainer import ActorTrainer
from slurm_rl.engines.model_config import ModelConfig

SIZES = {  # about 10M, 50M and 200M parameters
    "10M": ModelConfig(vocab_size=8192, hidden_size=256, num_layers=10, num_attention_heads=4),
    "50M": ModelConfig(vocab_size=16384, hidden_size=512, num_layers=12, num_attention_heads=8),
    "200M": ModelConfig(vocab_size=32000, hidden_size=1024, num_layers=12,
                        num_attention_heads=16),
}


def _timed(fn: Any, group: dist.ProcessGroup | None = None) -> float:
    dist.barrier(group=group)
    t0 = time.perf_counter()
    fn()
    dist.barrier(group=group)
    return time.perf_counter() - t0


def _dist_ckpt(trainer: ActorTrainer, old: list[int], numel: int, workdir: str) -> float:
    """Seconds for save (by the old ranks' replica 0) + load (by all) via dist_checkpointing."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor

    me = dist.get_rank()
    holder = me in old and trainer.flat is not None
    tensors = {}
    for key in ("params", "exp_avg", "exp_avg_sq"):
        if holder and key == "params":
            t = trainer.flat.data
        elif holder and not trainer.optim_cfg.zero1:
            t = getattr(trainer.optimizer, key)
        else:
            t = torch.zeros(numel)
        tensors[key] = t
    replica = 0 if me == old[0] else me + 1
    sharded = {k: ShardedTensor.from_rank_offsets(k, t, replica_id=replica)
               for k, t in tensors.items()}
    path = f"{workdir}/ckpt"

    def save() -> None:
        dist_checkpointing.save(sharded, path)

    def load() -> None:
        target = {k: ShardedTensor.from_rank_offsets(k, torch.empty(numel), replica_id=replica)
                  for k in tensors}
        dist_checkpointing.load(target, path)

    seconds = _timed(save) + _timed(load)
    dist.barrier()
    if me == 0:
        shutil.rmtree(path, ignore_errors=True)
    return seconds


def bench_worker(rank: int, world: int, size: str, transitions: list[list[list[int]]],
                 zero1: bool, workdir: str, with_ckpt: bool) -> list[dict[str, Any]]:
    cfg = SIZES[size]
    optim = OptimConfig(zero1=zero1)
    batch = BatchConfig(global_batch_size=8)
    out = []
    for old, new in transitions:
        cache = GroupCache(timeout=600.0)
        cache.ensure([old, *transition_rank_sets(old, new), list(range(world))])
        trainer = ActorTrainer(cfg, optim, batch, old, cache, seed=0)
        numel = cfg.num_parameters()
        union = sorted(set(old) | set(new))
        figures: dict[str, float] = {}
        dist.barrier()
        if rank in union:
            figures = trainer.reshard(new, epoch=0)
        dist.barrier()
        moved = int(figures.get("bytes_moved", 0))
        # (a) broadcast the bytes one joiner receives, from the first holder to the union.
        per_joiner = max(moved // max(1, len(set(new) - set(old))), 0)
        buf = torch.zeros(max(1, per_joiner // 4))
        group = cache.get(union) if rank in union else None
        bcast = 0.0
        if rank in union:
            bcast = _timed(lambda: dist.broadcast(buf, src=old[0], group=group), group)
        del buf
        ckpt, ckpt_error = float("nan"), "skipped (pass --dist-ckpt)"
        if with_ckpt:
            # A failure here is not caught: ranks would diverge in their collectives.
            ckpt, ckpt_error = _dist_ckpt(trainer, old, numel, workdir), None
        seconds = torch.tensor([figures.get("seconds", 0.0), figures.get("transfer_seconds", 0.0),
                                bcast, ckpt])
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        out.append({"size": size, "params": numel, "transition": f"{len(old)}->{len(new)}",
                    "zero1": zero1, "bytes_moved": moved, "reshard_s": float(seconds[0]),
                    "reshard_transfer_s": float(seconds[1]), "broadcast_s": float(seconds[2]),
                    "dist_ckpt_save_load_s": float(seconds[3]), "dist_ckpt_error": ckpt_error})
        trainer.free()
        del trainer
    return out


TRANSITIONS = {"1-2": [[0], [0, 1]], "2-4": [[0, 1], [0, 1, 2, 3]], "4-2": [[0, 1, 2, 3], [0, 1]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["10M", "50M", "200M"], choices=SIZES)
    parser.add_argument("--transitions", nargs="+", default=list(TRANSITIONS),
                        choices=TRANSITIONS)
    parser.add_argument("--zero1", action="store_true", help="shard Adam state (ZeRO-1)")
    parser.add_argument("--dist-ckpt", action="store_true",
                        help="also time save+load through megatron-core dist_checkpointing")
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="bench_reshard_") as workdir:
            res = run_local(bench_worker, 4,
                            (size, [TRANSITIONS[t] for t in args.transitions], args.zero1,
                             workdir, args.dist_ckpt), timeout_s=3000, collective_timeout_s=600)
        for row in res[0]:
            bound = row["broadcast_s"] or float("nan")
            row["vs_broadcast"] = row["reshard_transfer_s"] / bound if row["bytes_moved"] else None
            row["speedup_vs_dist_ckpt"] = (row["dist_ckpt_save_load_s"] / row["reshard_s"]
                                           if row["reshard_s"] else None)
            rows.append(row)
    print(json.dumps({"device": "cpu", "backend": "gloo", "world": 4, "results": rows},
                     indent=1))


if __name__ == "__main__":
    main()
