"""Benchmark in-place actor resharding on CPU/gloo; prints one JSON document.

For each model size and DP transition (4 local processes, gloo), ``ActorTrainer.reshard`` is
timed ``--reps`` times (the reverse transition restores the start between repetitions, untimed),
next to:

(a) the bandwidth bound: a gloo broadcast of the same bytes, from the same source, over the
    same ranks, into the same buffers, right after each reshard in the same run;
(b) the disk route: save + load of the same state (parameters + both Adam moments, fp32)
    through megatron-core ``dist_checkpointing`` (``torch_dist`` format) on local disk, in a
    one-rank world — one writer and one reader without contention, so a lower bound of what a
    joining rank would wait for if the state went through a checkpoint.

Per row: ``transfer_s`` (moving the tensors), ``reshard_s`` (the whole call, as the slowest rank
saw it), its parts ``build_s`` (joiner's model skeleton) and ``wait_s`` (waiting at the
arrival barrier), the best (min) and median over repetitions, ``vs_broadcast`` =
transfer / bound and ``speedup_vs_dist_ckpt`` = save+load / whole reshard.

    .venv/bin/python tools/bench_reshard.py --sizes 10M 50M --transitions 1-2 2-4 4-2
    .venv/bin/python tools/bench_reshard.py --sizes 200M --reps 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist

from slurm_rl.engines.actor.groups import GroupCache, transition_rank_sets
from slurm_rl.engines.actor.local_dist import run_local
from slurm_rl.engines.actor.microbatch import BatchConfig
from slurm_rl.engines.actor.optimizer import OptimConfig
from slurm_rl.engines.actor.reshard import broadcast_ranks, broadcast_source
from slurm_rl.engines.actor.trainer import ActorTrainer
from slurm_rl.engines.model_config import ModelConfig

SIZES = {  # about 10M, 50M and 200M parameters
    "10M": ModelConfig(vocab_size=8192, hidden_size=256, num_layers=10, num_attention_heads=4),
    "50M": ModelConfig(vocab_size=16384, hidden_size=512, num_layers=12, num_attention_heads=8),
    "200M": ModelConfig(vocab_size=32000, hidden_size=1024, num_layers=12,
                        num_attention_heads=16),
}
TRANSITIONS = {"1-2": [[0], [0, 1]], "2-4": [[0, 1], [0, 1, 2, 3]], "4-2": [[0, 1, 2, 3], [0, 1]]}
TIMED = ("reshard_s", "transfer_s", "build_s", "wait_s", "broadcast_s")


def _bound(trainer: ActorTrainer, old: list[int], new: list[int], received: int,
           cache: GroupCache) -> float:
    """Seconds of a broadcast of the bytes a joiner received, from the reshard's source."""
    rank = dist.get_rank()
    bcast = broadcast_ranks(old, new)
    if not trainer.optim_cfg.zero1 and bcast:
        # Same bytes, same source, same group, same (already identical) buffers.
        group = cache.get(bcast) if rank in bcast else None
        if group is None:
            return 0.0
        buf = trainer._replicated_buffer()
        src = broadcast_source(old, new)
    else:  # ZeRO-1: the most-loaded receiver's bytes, over the union, into a scratch buffer
        union = sorted(set(old) | set(new))
        if rank not in union or received == 0:
            return 0.0
        group, src = cache.get(union), broadcast_source(old, new)
        buf = torch.zeros(received // 4)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    dist.broadcast(buf, src=src, group=group)
    dist.barrier(group=group)
    return time.perf_counter() - t0


def bench_worker(rank: int, world: int, size: str, transitions: list[list[list[int]]],
                 zero1: bool, reps: int) -> list[dict[str, Any]]:
    """Time each transition ``reps`` times on this rank; every rank returns the same rows."""
    cfg = SIZES[size]
    optim = OptimConfig(zero1=zero1)
    batch = BatchConfig(global_batch_size=8)
    cache = GroupCache(timeout=900.0)
    out = []
    for old, new in transitions:
        cache.ensure([old, *transition_rank_sets(old, new), *transition_rank_sets(new, old)])
        trainer = ActorTrainer(cfg, optim, batch, old, cache, seed=0)
        union = set(old) | set(new)
        samples: list[dict[str, float]] = []
        moved = 0
        for rep in range(reps):
            dist.barrier()
            fig = trainer.reshard(new, epoch=2 * rep) if rank in union else {}
            dist.barrier()
            received = torch.tensor([int(fig.get("bytes_received", 0))])
            dist.all_reduce(received, op=dist.ReduceOp.MAX)
            bound = _bound(trainer, old, new, int(received), cache)
            row = torch.tensor([fig.get("seconds", 0.0), fig.get("transfer_seconds", 0.0),
                                fig.get("build_seconds", 0.0), fig.get("wait_seconds", 0.0),
                                bound], dtype=torch.float64)
            dist.all_reduce(row, op=dist.ReduceOp.MAX)
            samples.append(dict(zip(TIMED, row.tolist())))
            moved_t = torch.tensor([int(fig.get("bytes_moved", 0))])
            dist.all_reduce(moved_t, op=dist.ReduceOp.MAX)
            moved = int(moved_t)
            dist.barrier()
            if rank in union:  # restore the start (untimed)
                trainer.reshard(old, epoch=2 * rep + 1)
        entry: dict[str, Any] = {"size": size, "params": cfg.num_parameters(),
                                 "transition": f"{len(old)}->{len(new)}", "zero1": zero1,
                                 "bytes_moved": moved, "reps": reps}
        for key in TIMED:
            values = [s[key] for s in samples]
            entry[f"{key}_min"] = min(values)
            entry[f"{key}_median"] = statistics.median(values)
        out.append(entry)
        trainer.free()
        del trainer
    return out


def ckpt_worker(rank: int, world: int, numel: int, workdir: str, reps: int) -> dict[str, Any]:
    """Save + load ``3 * numel`` fp32 values through dist_checkpointing in a one-rank world."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor

    from slurm_rl.engines.actor.cpu_shim import apply_cpu_shim

    apply_cpu_shim()  # dist_checkpointing calls torch.cuda.synchronize/current_device
    state = {k: torch.randn(numel) for k in ("params", "exp_avg", "exp_avg_sq")}
    saves, loads = [], []
    for rep in range(reps):
        path = os.path.join(workdir, f"ckpt-{rep}")
        os.makedirs(path)
        sharded = {k: ShardedTensor.from_rank_offsets(k, t, replica_id=0)
                   for k, t in state.items()}
        t0 = time.perf_counter()
        dist_checkpointing.save(sharded, path)
        t1 = time.perf_counter()
        target = {k: ShardedTensor.from_rank_offsets(k, torch.empty(numel), replica_id=0)
                  for k in state}
        loaded = dist_checkpointing.load(target, path)
        t2 = time.perf_counter()
        if not all(torch.equal(loaded[k], state[k]) for k in state):
            raise RuntimeError(f"dist_checkpointing round trip of {path} changed the values")
        saves.append(t1 - t0)
        loads.append(t2 - t1)
        del loaded, target
    best = min(range(reps), key=lambda i: saves[i] + loads[i])
    return {"save_s": saves[best], "load_s": loads[best], "save_load_s": saves[best] + loads[best],
            "bytes": 12 * numel, "format": "torch_dist", "world": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["10M", "50M", "200M"], choices=SIZES)
    parser.add_argument("--transitions", nargs="+", default=list(TRANSITIONS),
                        choices=TRANSITIONS)
    parser.add_argument("--zero1", action="store_true", help="shard Adam state (ZeRO-1)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per transition")
    parser.add_argument("--no-dist-ckpt", action="store_true",
                        help="skip the dist_checkpointing save+load comparison")
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        res = run_local(bench_worker, 4,
                        (size, [TRANSITIONS[t] for t in args.transitions], args.zero1,
                         args.reps), timeout_s=3000, collective_timeout_s=900)
        ckpt: dict[str, Any] = {}
        if not args.no_dist_ckpt:
            with tempfile.TemporaryDirectory(prefix="bench_reshard_") as workdir:
                ckpt = run_local(ckpt_worker, 1, (SIZES[size].num_parameters(), workdir,
                                                  min(args.reps, 2)),
                                 timeout_s=1800, collective_timeout_s=900, daemon=False)[0]
        for row in res[0]:
            moving = row["bytes_moved"] > 0 and row["broadcast_s_min"] > 0
            row["vs_broadcast"] = (row["transfer_s_min"] / row["broadcast_s_min"]
                                   if moving else None)
            row["dist_ckpt"] = ckpt or None
            row["speedup_vs_dist_ckpt"] = (ckpt["save_load_s"] / row["reshard_s_min"]
                                           if ckpt and moving else None)
            rows.append(row)
    print(json.dumps({"device": "cpu", "backend": "gloo", "world": 4,
                      "threads_per_rank": 1, "cpus": os.cpu_count(), "results": rows},
                     indent=1))


if __name__ == "__main__":
    main()
