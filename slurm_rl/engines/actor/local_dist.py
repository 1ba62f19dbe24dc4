"""Run a function on N local processes joined in a gloo world (tests and benchmarks).

The processes are forked from a ``multiprocessing`` fork server that imported torch and the actor's
engine once (:data:`PRELOAD`): a spawned interpreter would import them again for every rank
(~4 s of CPU each). Each process initialises torch.distributed with a ``file://`` rendezvous, runs
``fn(rank, world_size, *args)`` and sends back its result (``torch.save`` bytes, loaded with ``weights_only=True``: tensors,
numbers, strings, lists and dicts) or the
formatted traceback of its error.
"""

from __future__ import annotations

import datetime
import io
import os
import queue
import tempfile
import traceback
from typing import Any, Callable, Sequence

import torch.multiprocessing as mp

from slurm_rl.errors import EngineError, WaitTimeout


PRELOAD = ["torch", "torch.distributed", "slurm_rl.engines.actor.trainer", "slurm_rl.engines.actor.checkpoint",
           "slurm_rl.engines.actor.cpu_preload"]
"""Imported once by the fork server the ranks are forked from (a module that fails to import is
skipped there and imported by the rank that needs it)."""


class LocalRankError(EngineError, RuntimeError):
    """A local rank raised; the message carries its traceback."""


class LocalRanksTimeout(EngineError, WaitTimeout):
    """Local ranks did not finish within the timeout (names them)."""


def _child(rank: int, world_size: int, init_file: str, timeout_s: float,
           fn: Callable[..., Any], args: Sequence[Any], results: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        out = fn(rank, world_size, *args)
        buf = io.BytesIO()
        torch.save(out, buf)  # tensors by value: the process may exit before they are read
        results.put((rank, "ok", buf.getvalue()))
    except BaseException:  # report everything, including timeouts, to the parent
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def run_local(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (),
              timeout_s: float = 120.0, collective_timeout_s: float = 60.0,
              daemon: bool = True) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; results by rank.

    ``daemon=False`` lets ``fn`` start processes of its own (megatron-core
    ``dist_checkpointing`` saves through a ``multiprocessing`` manager, which a daemonic
    process may not start); the ranks are still terminated on return or timeout.

    Raises ``LocalRankError`` with every failing rank's traceback, or ``LocalRanksTimeout`` naming
    the ranks that did not finish within ``timeout_s`` (those processes are terminated).
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # read when this process first starts its fork server
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="slurm_rl_dist_") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_child, args=(r, world_size, init_file, collective_timeout_s,
                                                  fn, tuple(args), results), daemon=daemon)
                 for r in range(world_size)]
        for p in procs:
            p.start()
        outcome: dict[int, tuple[str, Any]] = {}
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout_s)
        try:
            while len(outcome) < world_size:
                left = (deadline - datetime.datetime.now()).total_seconds()
                if left <= 0:
                    missing = sorted(set(range(world_size)) - set(outcome))
                    raise LocalRanksTimeout(f"local ranks {missing} did not finish within "
                                            f"{timeout_s:.0f}s")
                try:
                    rank, status, value = results.get(timeout=min(left, 1.0))
                except queue.Empty:
                    dead = [r for r, p in enumerate(procs)
                            if r not in outcome and p.exitcode not in (None, 0)]
                    if dead:
                        raise LocalRankError(f"local ranks {dead} died with exit codes "
                                             f"{[procs[r].exitcode for r in dead]}")
                    continue
                outcome[rank] = (status, value)
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
    errors = {r: v for r, (s, v) in outcome.items() if s == "error"}
    if errors:
        text = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items()))
        raise LocalRankError(f"ranks {sorted(errors)} failed:\n{text}")
    import torch

    return [torch.load(io.BytesIO(outcome[r][1]), weights_only=True) for r in range(world_size)]
