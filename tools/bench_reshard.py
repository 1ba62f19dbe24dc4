"""Benchmark in-place actor resharding and the mid-iteration switch; prints one JSON document.

Sections (``--sections``; local processes joined in a gloo world, sub-groups on gloo, or NCCL
with ``--device cuda``, one GPU per rank):

``transitions``: ``ActorTrainer.reshard`` per model size and DP transition, timed ``--reps``
    times (the reverse transition restores the start, untimed); joiners are warm
    (``ActorTrainer.warm``) unless ``--cold``. Next to it the bandwidth bound: a broadcast of
    the same bytes, from the same source, over the same ranks, into the same buffers.
``switch``: the whole mid-iteration switch as the actor sees it, on 2 ranks: the actor trains on
    ``[0]`` while rank 1 (warmed beforehand) waits; a coordinator thread publishes an epoch that
    moves the actor to ``[0, 1]`` (``EpochStore``; the repetitions spread the publish time
    evenly over the poll period), both ranks see it by polling
    (``EpochWatcher``, every ``--poll-s`` as the worker runtime does), reshard, and train the
    next mini-batch on ``[0, 1]``. ``switch_s`` = publish -> reshard done on all ranks (ready to
    train), ``switch_to_first_step_s`` = publish -> first mini-batch done on all ranks,
    ``step_s`` = one more mini-batch on the same ranks (compute, not switch overhead),
    ``transfer_s`` = the reshard's transfer alone, ``switch_vs_transfer`` = switch / transfer,
    ``broadcast_s`` = a plain broadcast of the same bytes over the same ranks after the steps.
    The first repetition also creates the process groups (``group_s``); later ones reuse them,
    as the iterations of a run do.
``ckpt``: the disk route: save + load of the same state (parameters + both Adam moments, fp32)
    through megatron-core ``dist_checkpointing`` (``torch_dist``) on local disk in a one-rank
    world, a lower bound of what a joiner would wait for through a checkpoint;
    ``speedup_vs_dist_ckpt`` = save+load / whole reshard.
``step``: DP-1 training steps on ``--device`` (a one-GPU check of megatron-core on CUDA).
``sync``: actor -> rollout weight sync (``megatron_to_hf`` + ``broadcast_weights``), rank 0 to
    rank 1, over NCCL with ``--device cuda``.
``park``: warm switching on one rank: ``ActorTrainer.park``/``unpark`` (parameters + Adam
    moments to host memory and back in place, after one training step) and
    ``HFRolloutEngine.release``/``resume`` of the same model size, ``--reps`` round trips each
    (the first also allocates the host buffers: ``first_park_s``; on CUDA they are pinned and
    kept for the next park). ``GBps`` = bytes copied / best seconds; ``equal``: the parameters
    after the round trips are bitwise those before.

Per timed figure: best (``_min``) and median (``_median``) over repetitions, maximum over ranks.

    .venv/bin/python tools/bench_reshard.py --sizes 10M 50M
    .venv/bin/python tools/bench_reshard.py --sizes 200M --reps 2 --transitions 1-2 2-4 4-2
    .venv/bin/python tools/bench_reshard.py --device cuda --sections step sync switch
    .venv/bin/python tools/bench_reshard.py --sections park --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from slurm_rl.control.epochs import Epoch, EpochStore, EpochWatcher
from slurm_rl.control.paths import RunPaths
from slurm_rl.engines.actor.groups import GroupCache, transition_rank_sets
from slurm_rl.engines.actor.local_dist import run_local
from slurm_rl.engines.actor.microbatch import BatchConfig, shard_for_rank
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
SECTIONS = ("transitions", "switch", "ckpt", "step", "sync", "park")
TIMED = ("reshard_s", "transfer_s", "build_s", "wait_s", "broadcast_s")
SWITCH = ("see_s", "switch_s", "switch_to_first_step_s", "first_step_s", "step_s",
          "broadcast_s", "reshard_s", "transfer_s", "build_s", "group_s", "wait_s")


def _setup(rank: int, device: str) -> GroupCache:
    """Pin this rank's GPU (cuda) and return a group cache on NCCL (cuda) or the world's gloo."""
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        return GroupCache(timeout=900.0, backend="nccl")
    return GroupCache(timeout=900.0)


def _sync(device: str) -> None:
    """Wait for queued GPU work (NCCL and kernels return once queued) before reading a clock."""
    if device == "cuda":
        torch.cuda.synchronize()


def _summary(samples: list[dict[str, float]], keys: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for key in keys:
        values = [s[key] for s in samples]
        out[f"{key}_min"], out[f"{key}_median"] = min(values), statistics.median(values)
    return out


def _samples(step: int, count: int, seq: int, vocab: int) -> list[dict[str, torch.Tensor]]:
    """``count`` deterministic training samples of ``seq`` tokens (loss on every target)."""
    gen = torch.Generator().manual_seed(step)
    return [{"input_ids": torch.randint(0, vocab, (seq,), generator=gen),
             "loss_mask": torch.ones(seq - 1)} for _ in range(count)]


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
        buf = torch.zeros(received // 4, device=trainer.device)
    dist.barrier(group=group)
    _sync(trainer.device)
    t0 = time.perf_counter()
    dist.broadcast(buf, src=src, group=group)
    dist.barrier(group=group)
    _sync(trainer.device)
    return time.perf_counter() - t0


def bench_worker(rank: int, world: int, size: str, transitions: list[list[list[int]]],
                 zero1: bool, reps: int, warm: bool, device: str) -> list[dict[str, Any]]:
    """Time each transition ``reps`` times on this rank; every rank returns the same rows."""
    cfg = SIZES[size]
    optim = OptimConfig(zero1=zero1)
    batch = BatchConfig(global_batch_size=8)
    cache = _setup(rank, device)
    out = []
    for old, new in transitions:
        cache.ensure([old, *transition_rank_sets(old, new), *transition_rank_sets(new, old)])
        trainer = ActorTrainer(cfg, optim, batch, old, cache, seed=0, device=device,
                               stay_warm=warm)
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
        out.append({"size": size, "params": cfg.num_parameters(),
                    "transition": f"{len(old)}->{len(new)}", "zero1": zero1,
                    "warm_joiners": warm, "bytes_moved": moved, "reps": reps,
                    **_summary(samples, TIMED)})
        trainer.free(keep_warm=False)
        del trainer
    return out


def switch_worker(rank: int, world: int, size: str, run_dir: str, zero1: bool, reps: int,
                  poll_s: float, batch: int, seq: int, device: str) -> dict[str, Any]:
    """The actor on [0] switches to [0, 1] on a published epoch, ``reps`` times (see module
    doc); every rank returns the same figures."""
    cfg = SIZES[size]
    cache = _setup(rank, device)
    trainer = ActorTrainer(cfg, OptimConfig(zero1=zero1),
                           BatchConfig(global_batch_size=batch, micro_batch_size=1), [0], cache,
                           seed=0, device=device)
    warm_s = torch.tensor([0.0 if trainer.active else trainer.warm()], dtype=torch.float64)
    dist.all_reduce(warm_s, op=dist.ReduceOp.MAX)
    paths = RunPaths(run_dir)
    paths.epochs_dir.mkdir(parents=True, exist_ok=True)
    store = EpochStore(paths)
    watcher = EpochWatcher(paths, poll_interval_s=poll_s, idle_poll_interval_s=poll_s, rank=rank)

    def publish(n: int, actor: list[int]) -> float:
        """The coordinator's side: publish epoch ``n`` placing the actor on ``actor``."""
        now = time.time()
        store.publish(Epoch(epoch=n, generation=0, created_at=now, reason="bench switch",
                            iteration=0, boundary="minibatch", previous=n - 1 if n else None,
                            placement={"actor": {"ranks": actor, "dp": len(actor), "tp": 1,
                                                 "pp": 1}}), generation=0)
        return now

    def next_epoch() -> Epoch:
        """Poll as the worker runtime does: one lookup per interval."""
        while (epoch := watcher.poll()) is None:
            time.sleep(watcher.interval)
        return epoch

    if rank == 0:
        publish(0, [0])
    next_epoch()
    if trainer.active:  # the holder has been training: its step path is warm
        trainer.train_step(_samples(0, batch, seq, cfg.vocab_size))
    rows: list[dict[str, float]] = []
    n = 1
    for rep in range(reps):
        published: list[float] = []
        dist.barrier()
        if rank == 0:  # publish at phases spread evenly over the ranks' poll period
            timer = threading.Timer(0.2 + poll_s * (rep + 0.5) / reps,
                                    lambda: published.append(publish(n, [0, 1])))
            timer.start()
        epoch = next_epoch()
        t_seen = time.time()
        fig = trainer.reshard(epoch.ranks_of("actor"), epoch=epoch.epoch)
        t_ready = time.time()
        samples = _samples(rep + 1, batch, seq, cfg.vocab_size)
        t0 = time.perf_counter()
        trainer.train_step(shard_for_rank(samples, trainer.dp_rank, trainer.dp_size))
        _sync(device)
        t_first, first_s = time.time(), time.perf_counter() - t0
        t0 = time.perf_counter()
        trainer.train_step(shard_for_rank(samples, trainer.dp_rank, trainer.dp_size))
        _sync(device)
        step_s = time.perf_counter() - t0
        bound = _bound(trainer, [0], [0, 1], 0, cache)  # same bytes, same ranks, right now
        if rank == 0:
            timer.join()
        times = torch.tensor([published[0] if published else 0.0, t_seen, t_ready, t_first,
                              first_s, step_s, bound, fig["seconds"], fig["transfer_seconds"],
                              fig["build_seconds"], fig["group_seconds"], fig["wait_seconds"]],
                             dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        t_pub, *rest = times.tolist()
        seen, ready, first, *figs = rest
        rows.append(dict(zip(SWITCH, [seen - t_pub, ready - t_pub, first - t_pub, *figs])))
        if rank == 0:  # back to [0] for the next repetition (untimed)
            publish(n + 1, [0])
        trainer.reshard(next_epoch().ranks_of("actor"), epoch=n + 1)
        n += 2
    summary = _summary(rows, SWITCH)
    ratio = [r["switch_s"] / r["transfer_s"] for r in rows if r["transfer_s"] > 0]
    return {"size": size, "params": cfg.num_parameters(), "transition": "1->2", "zero1": zero1,
            "reps": reps, "poll_s": poll_s, "batch": batch, "seq": seq,
            "warm_s": float(warm_s), **summary,
            "switch_vs_transfer_median": statistics.median(ratio) if ratio else None,
            "first_rep": rows[0], "per_rep_switch_s": [r["switch_s"] for r in rows]}


def step_worker(rank: int, world: int, size: str, batch: int, seq: int, steps: int,
                device: str) -> dict[str, Any]:
    """``steps`` DP-1 training steps on ``device``: losses and step times."""
    cfg = SIZES[size]
    trainer = ActorTrainer(cfg, OptimConfig(), BatchConfig(global_batch_size=batch,
                                                           micro_batch_size=1),
                           [0], _setup(rank, device), seed=0, device=device)
    losses, times = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        losses.append(trainer.train_step(_samples(step, batch, seq, cfg.vocab_size))["loss"])
        _sync(device)
        times.append(time.perf_counter() - t0)
    ok = all(torch.isfinite(torch.tensor(losses)).tolist())
    return {"size": size, "device": device, "batch": batch, "seq": seq, "losses": losses,
            "step_s": times, "finite": ok}


def sync_worker(rank: int, world: int, size: str, rounds: int, device: str) -> dict[str, Any]:
    """Actor rank 0 -> rollout rank 1: HF-named weights, bucketed broadcast, shapes checked."""
    from slurm_rl.engines.actor.model import build_gpt_model
    from slurm_rl.engines.convert import megatron_to_hf
    from slurm_rl.engines.weight_sync import broadcast_weights

    cfg = SIZES[size]
    cache = _setup(rank, device)
    model = build_gpt_model(cfg, seed=0, device=device)
    expected = {n: tuple(t.shape) for n, t in megatron_to_hf(model.named_parameters(), cfg)}
    group = cache.get([0, 1], "weight sync")
    seconds, nbytes, equal = [], 0, True
    for r in range(rounds):
        named = megatron_to_hf(model.named_parameters(), cfg) if rank == 0 else None
        got, stats = broadcast_weights(named, 0, group, expected=expected, device=device,
                                       barrier_group=dist.group.WORLD, what=f"weight sync v{r}")
        seconds.append(stats.seconds)
        nbytes = stats.bytes
        if rank == 1:  # both ranks built the same init from the seed
            mine = dict(megatron_to_hf(model.named_parameters(), cfg))
            equal = equal and all(torch.equal(t, mine[n]) for n, t in got)
    flag = torch.tensor([int(equal)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return {"size": size, "device": device, "backend": cache.backend or dist.get_backend(),
            "bytes": nbytes, "seconds": seconds, "equal": bool(flag.item())}


def _round_trips(park: Any, unpark: Any, reps: int, device: str) -> dict[str, Any]:
    """Time ``reps`` park/unpark round trips; figures of the copies and the freed memory."""
    parks, unparks, freed = [], [], None
    nbytes = device_bytes = 0.0
    for _ in range(reps):
        before = torch.cuda.memory_allocated() if device == "cuda" else None
        fig = park()
        if before is not None:
            freed = before - torch.cuda.memory_allocated()
        back = unpark()
        parks.append(fig["seconds"])
        unparks.append(back["seconds"])
        nbytes, device_bytes = fig["bytes"], fig["device_bytes"]
    out = {"bytes": int(nbytes), "device_bytes": int(device_bytes), "first_park_s": parks[0],
           **_summary([{"park_s": p, "unpark_s": u} for p, u in zip(parks, unparks)],
                      ("park_s", "unpark_s"))}
    out["park_GBps"] = nbytes / out["park_s_min"] / 1e9
    out["unpark_GBps"] = nbytes / out["unpark_s_min"] / 1e9
    if freed is not None:
        out["cuda_allocated_freed_bytes"] = int(freed)
    return out


def park_worker(rank: int, world: int, size: str, zero1: bool, reps: int, batch: int, seq: int,
                device: str) -> dict[str, Any]:
    """Park/unpark round trips of the actor (after one step) and of the hf rollout engine."""
    from slurm_rl.engines.rollout.hf import HFRolloutEngine

    cfg = SIZES[size]
    trainer = ActorTrainer(cfg, OptimConfig(zero1=zero1),
                           BatchConfig(global_batch_size=batch, micro_batch_size=1), [0],
                           _setup(rank, device), seed=0, device=device)
    trainer.train_step(_samples(0, batch, seq, cfg.vocab_size))
    assert trainer.flat is not None
    before = trainer.flat.data.clone()
    actor = _round_trips(trainer.park, trainer.unpark, reps, device)
    actor["equal"] = bool(torch.equal(trainer.flat.data, before))
    trainer.train_step(_samples(1, batch, seq, cfg.vocab_size))  # trains on after the trips
    del before
    trainer.free(keep_warm=False)
    engine = HFRolloutEngine(cfg, device=device, seed=0)
    weights = [p.detach().clone() for p in engine.model.parameters()]
    rollout = _round_trips(engine.release, engine.resume, reps, device)
    rollout["equal"] = all(torch.equal(a, b) for a, b in zip(weights, engine.model.parameters()))
    return {"size": size, "params": cfg.num_parameters(), "device": device, "zero1": zero1,
            "reps": reps, "actor": actor, "hf_rollout": rollout}


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
    parser.add_argument("--sections", nargs="+", default=["transitions", "switch", "ckpt"],
                        choices=SECTIONS)
    parser.add_argument("--transitions", nargs="+", default=["1-2"], choices=TRANSITIONS,
                        help="DP transitions of the transitions section (2-4, 4-2: 4 ranks)")
    parser.add_argument("--zero1", action="store_true", help="shard Adam state (ZeRO-1)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per transition/switch")
    parser.add_argument("--cold", action="store_true",
                        help="transitions: joiners build their model at join time (not warm)")
    parser.add_argument("--poll-s", type=float, default=0.05, help="switch: epoch poll interval")
    parser.add_argument("--batch", type=int, default=4, help="switch/step: samples per step")
    parser.add_argument("--seq", type=int, default=64, help="switch/step: tokens per sample")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: one GPU per rank, sub-groups on NCCL")
    parser.add_argument("--no-dist-ckpt", action="store_true", help="same as leaving out ckpt")
    args = parser.parse_args()
    sections = [s for s in args.sections if not (s == "ckpt" and args.no_dist_ckpt)]
    gpus = torch.cuda.device_count() if args.device == "cuda" else None
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False")

    def fits(ranks: int) -> bool:
        return gpus is None or ranks <= gpus

    results: dict[str, Any] = {s: [] for s in sections}
    skipped: list[str] = []
    for size in args.sizes:
        ckpt: dict[str, Any] | None = None
        if "ckpt" in sections:
            with tempfile.TemporaryDirectory(prefix="bench_reshard_") as workdir:
                ckpt = run_local(ckpt_worker, 1, (SIZES[size].num_parameters(), workdir,
                                                  min(args.reps, 2)),
                                 timeout_s=1800, collective_timeout_s=900, daemon=False)[0]
            results["ckpt"].append({"size": size, **ckpt})
        if "transitions" in sections:
            chosen = [TRANSITIONS[t] for t in args.transitions]
            world = 1 + max(r for old, new in chosen for r in old + new)
            if fits(world):
                rows = run_local(bench_worker, world, (size, chosen, args.zero1, args.reps,
                                                       not args.cold, args.device),
                                 timeout_s=3000, collective_timeout_s=900)[0]
                for row in rows:
                    moving = row["bytes_moved"] > 0 and row["broadcast_s_min"] > 0
                    row["vs_broadcast"] = (row["transfer_s_min"] / row["broadcast_s_min"]
                                           if moving else None)
                    row["speedup_vs_dist_ckpt"] = (ckpt["save_load_s"] / row["reshard_s_min"]
                                                   if ckpt and moving else None)
                results["transitions"].extend(rows)
            else:
                skipped.append(f"transitions {size}: needs {world} GPUs, have {gpus}")
        if "switch" in sections:
            if fits(2):
                with tempfile.TemporaryDirectory(prefix="bench_switch_") as run_dir:
                    row = run_local(switch_worker, 2, (size, run_dir, args.zero1, args.reps,
                                                       args.poll_s, args.batch, args.seq,
                                                       args.device),
                                    timeout_s=3000, collective_timeout_s=900)[0]
                row["speedup_vs_dist_ckpt"] = (ckpt["save_load_s"] / row["reshard_s_min"]
                                               if ckpt else None)
                results["switch"].append(row)
            else:
                skipped.append(f"switch {size}: needs 2 GPUs, have {gpus}")
        if "step" in sections:
            results["step"].append(run_local(step_worker, 1, (size, args.batch, args.seq, 3,
                                                              args.device),
                                             timeout_s=1800, collective_timeout_s=900)[0])
        if "park" in sections:
            results["park"].append(run_local(park_worker, 1, (size, args.zero1, args.reps,
                                                              args.batch, args.seq, args.device),
                                             timeout_s=1800, collective_timeout_s=900)[0])
        if "sync" in sections:
            if fits(2):
                results["sync"].append(run_local(sync_worker, 2, (size, 3, args.device),
                                                 timeout_s=1800, collective_timeout_s=900)[0])
            else:
                skipped.append(f"sync {size}: needs 2 GPUs, have {gpus}")
    print(json.dumps({"device": args.device, "gpus": gpus,
                      "backend": "nccl" if args.device == "cuda" else "gloo",
                      "threads_per_rank": 1, "cpus": os.cpu_count(), "skipped": skipped,
                      **results}, indent=1))


if __name__ == "__main__":
    main()
