"""Benchmark in-place actor resharding and the mid-iteration switch; prints one JSON document.

Sections (``--sections``; local processes joined in a gloo world, sub-groups on gloo, or NCCL
with ``--device cuda``, one GPU per rank):

``transitions``: ``ActorTrainer.reshard`` per model size and DP transition, timed ``--reps``
    times (the reverse transition restores the start, untimed); joiners are warm
    (``ActorTrainer.warm``) unless ``--cold``. Next to it the bandwidth bound: a broadcast of
    the same bytes, from the same source, over the same ranks, into the same buffers.
``layouts``: ``ActorTrainer.reshard`` changing tensor and data parallelism together
    (``--layouts``, ``tpAxB-tpCxD``: TP ``A`` x DP ``B`` on ranks ``0..A*B-1`` to TP ``C`` x DP
    ``D`` on ranks ``0..C*D-1``), per model size and ``--precision`` (fp32 | bf16: bf16 trains a
    bf16 copy, the reshard moves the same fp32 master weights + Adam moments, 12 bytes per
    parameter and TP shard), timed ``--reps`` times (the reverse restores the start, untimed).
    Joiners and ranks whose TP group changes build a model skeleton at the new TP first (there
    is no warm TP skeleton: a shard depends on its future TP group), counted in ``reshard_s``
    (``build_s``). Figures per row: ``bytes_moved``, ``received_per_rank`` / ``sent_per_rank``
    (bytes, by global rank), ``pairs`` (bytes per ``src->dst`` message of the plan);
    ``reshard_s`` (the whole call, max over ranks); ``transfer_s`` (the trainer's own transfer
    figure, max over ranks: on a rank that only sends it includes waiting for peers that are still
    building); ``ready_transfer_s`` = from the moment the last rank that sends or receives is
    ready to transfer (its call start + group + wait + build seconds, wall clock) to the moment the
    last one is done (+ its transfer seconds): local copies, packing, messages and unpacking, with
    every rank ready. The bound, ``bound_s``: the same messages -- the plan's byte count for every
    ``src -> dst`` pair, from ``plan_layout_change`` -- sent as one ``batch_isend_irecv`` over the
    same group, between preallocated, paged-in buffers (no packing, no unpacking, no local copies,
    no allocation), from a barrier to the last rank done. It is a true lower bound of the plan's
    transfer: the plan sends exactly these messages and does more work around them. (A broadcast
    of the largest per-rank amount from one holder to every receiver is no lower bound here:
    when the two TP ranks of a group each feed their own joiner, the plan sends from two
    holders at once where such a broadcast sends everything from one.)
    ``vs_bound`` = ``ready_transfer_s`` / ``bound_s`` (best of each), ``reshard_vs_bound`` =
    ``reshard_s`` / ``bound_s`` (None when nothing moves). ``bound_fresh_s`` (a diagnostic, not
    the bound): the same messages received into freshly allocated buffers whose pages are not
    resident yet, as the plan's packed receive buffers are (on CPU the page faults then land
    inside the receive). Targets: ``vs_bound`` <= 1.5 and ``speedup_vs_dist_ckpt`` >= 5 (see
    ``ckpt``; the state is the same at every TP and precision), judged on rows that move bytes
    (a change that moves nothing, such as ranks leaving, needs no checkpoint either).
    ``peak_rss_gib_per_rank``: each rank's peak RSS during the change, its repetitions and
    reverses and the bound (host memory; the peak is reset before each change where Linux allows).
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
    ``speedup_vs_dist_ckpt`` = save+load / whole reshard. Each repetition's checkpoint is
    deleted before the next one is written (disk space).
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
    .venv/bin/python tools/bench_reshard.py --sections layouts ckpt --sizes 50M \\
        --precision fp32 bf16
    .venv/bin/python tools/bench_reshard.py --sections layouts ckpt --sizes 200M --reps 2
    .venv/bin/python tools/bench_reshard.py --device cuda --sections layouts --layouts tp2x1-tp1x2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
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
from slurm_rl.engines.actor.layout import Layout
from slurm_rl.engines.actor.layout_reshard import pieces_bytes, plan_layout_change
from slurm_rl.engines.actor.local_dist import run_local
from slurm_rl.engines.actor.microbatch import BatchConfig, shard_for_rank
from slurm_rl.engines.actor.optimizer import OptimConfig
from slurm_rl.engines.actor.reshard import broadcast_ranks, broadcast_source
from slurm_rl.engines.actor.trainer import ActorTrainer
from slurm_rl.engines.model_config import ModelConfig

SIZES = {  # about 10M, 50M and 200M parameters; "tiny" (0.2M) checks the script itself
    "tiny": ModelConfig(vocab_size=512, hidden_size=128, num_layers=2, num_attention_heads=4),
    "10M": ModelConfig(vocab_size=8192, hidden_size=256, num_layers=10, num_attention_heads=4),
    "50M": ModelConfig(vocab_size=16384, hidden_size=512, num_layers=12, num_attention_heads=8),
    "200M": ModelConfig(vocab_size=32000, hidden_size=1024, num_layers=12,
                        num_attention_heads=16),
}
TRANSITIONS = {"1-2": [[0], [0, 1]], "2-4": [[0, 1], [0, 1, 2, 3]], "4-2": [[0, 1, 2, 3], [0, 1]]}
LAYOUT_CHANGES = ("tp2x1-tp2x2", "tp2x2-tp2x1", "tp2x1-tp1x2", "tp1x2-tp2x1", "tp1x1-tp2x2")
"""The default ``layouts`` set (4 ranks): grow DP under TP 2, shrink it, TP 2 -> 1 on the same
ranks, TP 1 -> 2 on the same ranks, one rank to TP 2 x DP 2."""
LAYOUT_RE = re.compile(r"tp(\d+)x(\d+)-tp(\d+)x(\d+)")
SECTIONS = ("transitions", "layouts", "switch", "ckpt", "step", "sync", "park")
TARGETS = {"vs_bound_max": 1.5, "speedup_vs_dist_ckpt_min": 5.0}
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


def parse_layout_change(text: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """``tpAxB-tpCxD`` -> ``((A, B), (C, D))`` (TP, DP of the old and the new layout)."""
    m = LAYOUT_RE.fullmatch(text)
    if not m or min(int(g) for g in m.groups()) < 1:
        raise ValueError(f"layout change {text!r}: expected tpAxB-tpCxD (TP x DP, "
                         "e.g. tp2x1-tp1x2)")
    a, b, c, d = (int(g) for g in m.groups())
    if a == c == 1:
        raise ValueError(f"layout change {text!r}: TP 1 on both sides is a DP change "
                         "(the transitions section)")
    return (a, b), (c, d)


def _layout(tp: int, dp: int) -> Layout:
    return Layout(tuple(range(tp * dp)), tp)


def peak_rss() -> float:
    """This process's peak resident set size in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux ``clear_refs`` 5, which
    ``ru_maxrss`` follows); False where that is not possible (the peak then spans the process)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _pair_bytes(trainer: ActorTrainer | None, old: Layout, new: Layout, world: int) -> torch.Tensor:
    """``[world, world]`` bytes the plan sends ``src -> dst`` (all arrays), the same on every rank:
    computed from the parameter specs on the new layout's first rank, broadcast over the world."""
    matrix = torch.zeros(world, world, dtype=torch.float64)
    if dist.get_rank() == new.ranks[0]:
        assert trainer is not None
        specs = trainer.specs
        for p in plan_layout_change(old, new, specs):
            matrix[p.src, p.dst] += pieces_bytes([p], specs)  # 3 fp32 arrays
    dist.broadcast(matrix, src=new.ranks[0])
    return matrix


def _p2p_bound(matrix: torch.Tensor, union: list[int], cache: GroupCache,
               device: str, fresh: bool = False) -> tuple[float, float]:
    """The lower bound of ``layouts`` (see the module doc): this rank's part of one
    ``batch_isend_irecv`` of the plan's per-pair byte counts over the union group, between
    preallocated buffers. ``fresh``: receive into ``torch.empty`` buffers whose pages are not
    resident yet (the page faults land in the receive; not the bound). Returns this rank's
    ``(start, end)`` wall clock ((0, 0) when it neither sends nor receives)."""
    rank = dist.get_rank()
    if rank not in union:
        return 0.0, 0.0
    group = cache.get(union)
    out = {dst: int(n) for dst, n in enumerate(matrix[rank].tolist()) if n and dst != rank}
    inc = {src: int(n) for src, n in enumerate(matrix[:, rank].tolist()) if n and src != rank}
    # One paged-in send buffer serves every peer (the content does not matter); one receive
    # buffer per peer, zero-filled so that its pages are resident (as a skeleton's are).
    send = (torch.ones(max(out.values()) // 4, device=device) if out else None)
    ops = [dist.P2POp(dist.isend, send[:n // 4], dst, group) for dst, n in out.items()]
    alloc = torch.empty if fresh else torch.zeros
    recv = {src: alloc(n // 4, device=device) for src, n in inc.items()}
    ops += [dist.P2POp(dist.irecv, buf, src, group) for src, buf in recv.items()]
    dist.barrier(group=group)
    _sync(device)
    start = time.time()
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    _sync(device)
    end = time.time()
    dist.barrier(group=group)
    del send, recv
    return (start, end) if ops else (0.0, 0.0)


LAYOUT_TIMED = ("reshard_s", "transfer_s", "ready_transfer_s", "build_s", "wait_s", "bound_s",
                "bound_fresh_s")


def _window(rows: torch.Tensor, start: int, end: int) -> float | None:
    """Last end - last start over the ranks whose ``start`` column is set (None if none is)."""
    active = rows[:, start] > 0
    if not bool(active.any()):
        return None
    return float(rows[active, end].max() - rows[active, start].max())


def layout_worker(rank: int, world: int, size: str, changes: list[str], precision: str,
                  reps: int, device: str) -> list[dict[str, Any]]:
    """Time each layout change ``reps`` times on this rank; every rank returns the same rows."""
    cfg = SIZES[size]
    cache = _setup(rank, device)
    out = []
    for text in changes:
        (a, b), (c, d) = parse_layout_change(text)
        old, new = _layout(a, b), _layout(c, d)
        union = sorted(set(old.ranks) | set(new.ranks))
        # Every group the change and its reverse use, made now (in one order on every rank) so
        # that no repetition times a group creation.
        sets = [tuple(union)]
        for lay in (old, new):
            sets += [*(lay.tp_groups() if lay.tp > 1 else []), *lay.dp_groups()]
        cache.ensure(sets, "bench layout groups")
        reset = reset_peak_rss()
        trainer = (ActorTrainer(cfg, OptimConfig(), BatchConfig(global_batch_size=8), old.ranks,
                                cache, seed=0, device=device, tp=old.tp, precision=precision)
                   if rank in union else None)
        samples: list[dict[str, float]] = []
        per_rank = torch.zeros(2, world, dtype=torch.float64)  # sent, received (last rep)
        matrix = None
        moved = 0.0
        for rep in range(reps):
            # per rank: call start, transfer start, transfer end, seconds, transfer, build, wait
            mine = torch.zeros(world, 7, dtype=torch.float64)
            dist.barrier()
            if trainer is not None:
                t0 = time.time()
                fig = trainer.reshard(new.ranks, epoch=2 * rep, new_tp=new.tp)
                ready = t0 + fig["group_seconds"] + fig["wait_seconds"] + fig["build_seconds"]
                moves = fig["bytes_sent"] + fig["bytes_received"] > 0
                mine[rank] = torch.tensor([
                    t0, ready if moves else 0.0, ready + fig["transfer_seconds"] if moves else 0.0,
                    fig["seconds"], fig["transfer_seconds"], fig["build_seconds"],
                    fig["wait_seconds"]], dtype=torch.float64)
                per_rank[:, rank] = torch.tensor([fig["bytes_sent"], fig["bytes_received"]],
                                                 dtype=torch.float64)
                moved = fig["bytes_moved"]
            dist.all_reduce(mine)
            if matrix is None:  # collective over the world; the new layout's ranks hold specs
                matrix = _pair_bytes(trainer, old, new, world)
            bound = torch.zeros(world, 4, dtype=torch.float64)
            bound[rank, :2] = torch.tensor(_p2p_bound(matrix, union, cache, device),
                                           dtype=torch.float64)
            bound[rank, 2:] = torch.tensor(_p2p_bound(matrix, union, cache, device, fresh=True),
                                           dtype=torch.float64)
            dist.all_reduce(bound)
            samples.append({"reshard_s": float(mine[:, 3].max()),
                            "transfer_s": float(mine[:, 4].max()),
                            "ready_transfer_s": _window(mine, 1, 2) or 0.0,
                            "build_s": float(mine[:, 5].max()), "wait_s": float(mine[:, 6].max()),
                            "bound_s": _window(bound, 0, 1) or 0.0,
                            "bound_fresh_s": _window(bound, 2, 3) or 0.0})
            dist.barrier()
            if trainer is not None:  # restore the start (untimed)
                trainer.reshard(old.ranks, epoch=2 * rep + 1, new_tp=old.tp)
        dist.all_reduce(per_rank)
        assert matrix is not None
        if abs(float(matrix.sum()) - moved) > 0.5 and rank == new.ranks[0]:
            raise RuntimeError(f"{text}: plan pairs sum to {float(matrix.sum())} bytes, the "
                               f"reshard reported {moved}")
        peak = torch.zeros(world, dtype=torch.float64)
        peak[rank] = peak_rss()
        dist.all_reduce(peak)
        summary = _summary(samples, LAYOUT_TIMED)
        moving = float(matrix.sum()) > 0 and summary["bound_s_min"] > 0
        out.append({
            "size": size, "params": cfg.num_parameters(), "precision": precision,
            "transition": text, "old": old.describe(), "new": new.describe(), "reps": reps,
            "bytes_moved": int(matrix.sum()),
            "sent_per_rank": [int(x) for x in per_rank[0].tolist()],
            "received_per_rank": [int(x) for x in per_rank[1].tolist()],
            "pairs": {f"{s}->{t}": int(matrix[s, t]) for s in range(world) for t in range(world)
                      if matrix[s, t] > 0},
            **summary,
            "vs_bound": (summary["ready_transfer_s_min"] / summary["bound_s_min"]
                         if moving else None),
            "vs_bound_median": (summary["ready_transfer_s_median"] / summary["bound_s_median"]
                                if moving else None),
            "reshard_vs_bound": (summary["reshard_s_min"] / summary["bound_s_min"]
                                 if moving else None),
            "peak_rss_gib_per_rank": [round(x / 2**30, 3) for x in peak.tolist()],
            "peak_rss_of": "this change" if reset else "the process so far",
        })
        if trainer is not None:
            trainer.free(keep_warm=False)
        del trainer
        dist.barrier()
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
        shutil.rmtree(path)  # one checkpoint on disk at a time
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
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUT_CHANGES),
                        metavar="tpAxB-tpCxD",
                        help="layout changes of the layouts section: TP A x DP B on ranks "
                             "0..A*B-1 -> TP C x DP D on ranks 0..C*D-1 (default: %(default)s)")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", "bf16"],
                        help="layouts: the actor's precision(s) (the moved state is fp32 in both)")
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
    try:
        changes = [(text, *parse_layout_change(text)) for text in args.layouts]
    except ValueError as err:
        parser.error(f"--layouts: {err}")
    for text, (a, b), (c, d) in (changes if "layouts" in args.sections else []):
        for tp in (a, c):
            for size in args.sizes:
                cfg = SIZES[size]
                if tp > 1 and any(x % tp for x in (cfg.num_attention_heads, cfg.kv_groups,
                                                   cfg.ffn_size, cfg.vocab_size)):
                    parser.error(f"--layouts {text}: size {size} does not split over TP {tp}")
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
        if "layouts" in sections:
            world = max(max(a * b, c * d) for _, (a, b), (c, d) in changes)
            if fits(world):
                for precision in args.precision:
                    rows = run_local(layout_worker, world, (size, args.layouts, precision,
                                                            args.reps, args.device),
                                     timeout_s=3000, collective_timeout_s=900)[0]
                    for row in rows:
                        row["speedup_vs_dist_ckpt"] = (ckpt["save_load_s"] / row["reshard_s_min"]
                                                       if ckpt and row["reshard_s_min"] > 0
                                                       else None)
                        moves = row["bytes_moved"] > 0
                        row["meets_targets"] = {
                            "vs_bound": (None if row["vs_bound"] is None
                                         else row["vs_bound"] <= TARGETS["vs_bound_max"]),
                            "speedup_vs_dist_ckpt": (
                                None if row["speedup_vs_dist_ckpt"] is None or not moves else
                                row["speedup_vs_dist_ckpt"] >= TARGETS["speedup_vs_dist_ckpt_min"])}
                    results["layouts"].extend(rows)
            else:
                skipped.append(f"layouts {size}: needs {world} GPUs, have {gpus}")
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
                      **({"targets": TARGETS} if "layouts" in sections else {}),
                      **results}, indent=1))


if __name__ == "__main__":
    main()
