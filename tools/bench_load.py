"""Loading a Hugging Face checkpoint: raw safetensors read vs the actor, the hf rollout engine and
one actor -> rollout weight sync; prints one JSON line per section.

The checkpoint has Qwen2.5-0.5B's shapes (``QWEN25_05B``: 494M parameters, tied embeddings, q/k/v
biases) with random bfloat16 weights, written once under ``--dir`` (reused when it is there) with a
small trained tokenizer (the figures are about weights). ``--scale small`` is a tiny model of the
same family (hidden 64, 2 layers, vocab 512) for the tests.

Sections (``--sections``), each timed ``--repeat`` times (``_min``, ``_median``, and ``_first``, the
first repetition), after an untimed read of every file so that the page cache holds the checkpoint
(``raw_cold`` is the exception). Between timed steps the process hands its freed heap back to the
OS (``malloc_trim``), so every step touches new memory as a fresh rank does (on a VM those page
faults cost about as much as the copies).

``raw``: every tensor read with ``safetensors`` alone (``safe_open(...).get_tensor``):
    ``mmap_s`` the views alone (the file is memory-mapped: no byte is read yet), ``bf16_s`` each
    copied into memory of its own as stored, ``fp32_s`` each converted to fp32 as the actor and the
    hf engine hold them (each dropped at once: the allocator reuses its memory), ``fp32_kept_s``
    the same, every tensor kept until the end as a loaded model keeps them (the floor of a load
    into fresh fp32 parameters: 4 bytes per parameter of new memory touched).
``raw_cold``: the bf16 read once after ``posix_fadvise(DONTNEED)`` asked the kernel to drop the
    files from the page cache (the disk's figure, not a shared file system's).
``actor``: ``build_gpt_model(cfg, 0, "cpu", initialize=False)`` (``build_s``, the megatron
    skeleton: its parameters are allocated, not yet touched) then ``load_into_megatron``
    (``load_s``); ``load_vs_raw_fp32_kept`` = load / raw fp32 read with every tensor kept (target:
    1.5 or less; ``load_vs_raw_bf16`` / ``_fp32`` against the other raw modes); ``reload_s``: a
    second load into the same model (its memory already touched).
``rollout``: ``HFRolloutEngine(cfg, checkpoint=DIR)`` construction (transformers
    ``from_pretrained`` in fp32).
``sync``: two processes in a gloo world on this machine: rank 0 (actor, loaded from the
    checkpoint) streams ``megatron_to_hf(model.named_parameters(), cfg)`` through
    ``broadcast_weights``, rank 1 (an hf rollout engine of the checkpoint) receives and calls
    ``update_weights``. ``broadcast_s`` (``broadcast_weights`` on the receiver, its barrier
    included), ``update_s``, ``sync_s`` = both; bytes are fp32 as sent. ``equal``: what arrived is
    bitwise the engine's own load of the same checkpoint.

``GBps`` = bytes / best seconds (bytes read from the checkpoint, bf16, except for ``sync``).
``maxrss_gb``: this process's peak resident memory so far (VmHWM, the file's mapped pages
included); for ``sync`` each rank's, and ``parent_now`` this process's while they run.
Threads: ``--threads`` torch threads in this process (default 1, as an actor rank runs);
the two sync ranks run one thread each.

    .venv/bin/python tools/bench_load.py                   # Qwen2.5-0.5B shapes, runs/bench_load
    .venv/bin/python tools/bench_load.py --repeat 5 --sections raw actor
    .venv/bin/python tools/bench_load.py --scale small --dir /tmp/bl --repeat 1
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

SECTIONS = ("raw", "raw_cold", "actor", "rollout", "sync")
SCALES = ("full", "small")


def _config_dict(scale: str) -> dict[str, Any]:
    from slurm_rl.toy.checkpoint import QWEN25_05B

    config = dict(QWEN25_05B)
    if scale == "small":
        config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, vocab_size=512,
                      max_window_layers=2, max_position_embeddings=256, bos_token_id=1,
                      eos_token_id=2)  # the ids of the trained tokenizer's <bos> / <eos>
    return config


def ensure_checkpoint(root: Path, scale: str) -> tuple[Path, bool, float]:
    """The checkpoint directory of ``scale`` under ``root`` (written when absent), whether it was
    written now, and the seconds that took."""
    import torch

    from slurm_rl.engines.hf_checkpoint import checkpoint_problems
    from slurm_rl.toy.checkpoint import write_checkpoint_of_shapes
    from slurm_rl.toy.tokenizer import train_tokenizer

    path = root / ("qwen2.5-0.5b" if scale == "full" else "small")
    if path.is_dir() and not checkpoint_problems(path):
        return path, False, 0.0
    t0 = time.perf_counter()
    tmp = root / (path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    train_tokenizer(tmp / "tokenizer")
    write_checkpoint_of_shapes(tmp / "model", _config_dict(scale), dtype=torch.bfloat16,
                               fill="random", tokenizer_dir=tmp / "tokenizer")
    shutil.rmtree(path, ignore_errors=True)
    (tmp / "model").rename(path)
    shutil.rmtree(tmp, ignore_errors=True)
    return path, True, time.perf_counter() - t0


def _files(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


def _summary(name: str, values: list[float]) -> dict[str, float]:
    return {f"{name}_min": min(values), f"{name}_median": statistics.median(values),
            f"{name}_first": values[0]}


def _gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def _release_memory() -> None:
    """Collect garbage and hand freed heap memory back to the OS (glibc), so that the next
    section (the sync's two processes) does not stack on what this process no longer uses."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rss_gb(field: str = "VmRSS") -> float:
    """``field`` of /proc/self/status in GB (0 where there is none)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return 0.0


def _maxrss_gb() -> float:
    """Peak resident memory of this process (VmHWM: per address space, so a spawned child's own
    figure, unlike ``ru_maxrss``, which survives exec)."""
    return _rss_gb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def read_all(path: Path, mode: str) -> int:
    """Read every tensor of ``path`` with safetensors alone; bytes stored. ``mode``: ``mmap``
    (``get_tensor`` only: a view of the memory-mapped file, no byte is read), ``bf16`` (copied
    into memory of its own, as stored), ``fp32`` (converted to fp32, as the engines hold it)."""
    import torch
    from safetensors import safe_open

    nbytes, kept = 0, []
    for file in _files(path):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                t = f.get_tensor(key)
                nbytes += t.numel() * t.element_size()
                if mode == "bf16":
                    t = t.clone()
                elif mode.startswith("fp32"):
                    t = t.to(torch.float32)
                if mode == "fp32_kept":
                    kept.append(t)
                del t
    return nbytes


def evict(path: Path) -> bool:
    """Ask the kernel to drop ``path``'s safetensors from the page cache; False if unsupported."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for file in _files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def bench_raw(path: Path, repeat: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"mmap": [], "bf16": [], "fp32": [], "fp32_kept": []}
    nbytes = 0
    for _ in range(repeat):
        for mode, seconds in times.items():
            t0 = time.perf_counter()
            nbytes = read_all(path, mode)
            seconds.append(time.perf_counter() - t0)
            _release_memory()
    out: dict[str, Any] = {"bytes": nbytes}
    for mode, seconds in times.items():
        out.update(_summary(f"{mode}_s", seconds))
    for mode, seconds in times.items():
        out[f"{mode}_GBps"] = _gbps(nbytes, min(seconds))
    return out


def bench_raw_cold(path: Path) -> dict[str, Any]:
    if not evict(path):
        return {"skipped": "no posix_fadvise on this platform"}
    t0 = time.perf_counter()
    nbytes = read_all(path, "bf16")
    sec = time.perf_counter() - t0
    return {"bytes": nbytes, "bf16_s": sec, "bf16_GBps": _gbps(nbytes, sec),
            "note": "after posix_fadvise(DONTNEED) of every file; local disk"}


def bench_actor(path: Path, cfg: Any, repeat: int) -> dict[str, Any]:
    import torch

    from slurm_rl.engines.actor.model import build_gpt_model, preload_megatron
    from slurm_rl.engines.hf_checkpoint import load_into_megatron

    preload_megatron("cpu")
    builds, loads, reloads, nbytes, params = [], [], [], 0.0, 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        model = build_gpt_model(cfg, 0, "cpu", initialize=False)
        builds.append(time.perf_counter() - t0)
        fig = load_into_megatron(model, path, cfg)
        loads.append(fig["seconds"])
        nbytes = fig["bytes"]
        reloads.append(load_into_megatron(model, path, cfg)["seconds"])
        params = sum(p.numel() for p in model.parameters())
        assert all(p.dtype == torch.float32 for p in model.parameters())
        del model
        _release_memory()
    return {"bytes": int(nbytes), "parameters": params, **_summary("build_s", builds),
            **_summary("load_s", loads), **_summary("reload_s", reloads),
            "GBps": _gbps(nbytes, min(loads))}


def bench_rollout(path: Path, cfg: Any, repeat: int) -> dict[str, Any]:
    import transformers  # noqa: F401  (the import is not the engine's load)

    from slurm_rl.engines.rollout.hf import HFRolloutEngine

    seconds, params = [], 0
    nbytes = sum(f.stat().st_size for f in _files(path))
    for _ in range(repeat):
        t0 = time.perf_counter()
        engine = HFRolloutEngine(cfg, device="cpu", checkpoint=path)
        seconds.append(time.perf_counter() - t0)
        params = sum(p.numel() for p in engine.model.parameters())
        del engine
        _release_memory()
    return {"bytes_files": nbytes, "parameters": params, **_summary("load_s", seconds),
            "GBps": _gbps(nbytes, min(seconds))}


def sync_worker(rank: int, world: int, path: str, repeat: int) -> dict[str, Any]:
    """Rank 0: actor loaded from ``path``; rank 1: hf rollout engine of ``path``; ``repeat``
    syncs 0 -> 1 (the receiver's figures are returned by both)."""
    import torch
    import torch.distributed as dist

    from slurm_rl.engines.convert import hf_param_shapes, megatron_to_hf
    from slurm_rl.engines.hf_checkpoint import model_config_from_dir
    from slurm_rl.engines.weight_sync import broadcast_weights

    cfg = model_config_from_dir(path)
    if rank == 0:
        from slurm_rl.engines.actor.model import build_gpt_model
        from slurm_rl.engines.hf_checkpoint import load_into_megatron

        model = build_gpt_model(cfg, 0, "cpu", initialize=False)
        load_into_megatron(model, path, cfg)
    else:
        from slurm_rl.engines.rollout.hf import HFRolloutEngine

        engine = HFRolloutEngine(cfg, device="cpu", checkpoint=path)
    expected = dict(hf_param_shapes(cfg))
    group = dist.group.WORLD
    rows, equal = [], True
    for r in range(repeat):
        dist.barrier()
        named = megatron_to_hf(model.named_parameters(), cfg) if rank == 0 else None
        got, stats = broadcast_weights(named, 0, group, expected=expected,
                                       what=f"weight sync v{r + 1}")
        t0 = time.perf_counter()
        if rank == 1:
            if r == 0:  # both loaded the same checkpoint: what arrives is what the engine holds
                params = dict(engine.model.named_parameters())
                equal = all(torch.equal(t, params[n]) for n, t in got)
            t0 = time.perf_counter()
            engine.update_weights(got, r + 1)
        update = time.perf_counter() - t0
        rows.append({"broadcast_s": stats.seconds, "barrier_s": stats.barrier_seconds,
                     "update_s": update, "sync_s": stats.seconds + update,
                     "bytes": stats.bytes, "tensors": stats.tensors, "buckets": stats.buckets})
        del got
        _release_memory()
    mine = {"rows": rows, "equal": equal, "maxrss_gb": _maxrss_gb()}
    both: list[Any] = [None, None]
    dist.all_gather_object(both, mine)
    return {"receiver": both[1], "sender_maxrss_gb": both[0]["maxrss_gb"]}


def bench_sync(path: Path, repeat: int) -> dict[str, Any]:
    from slurm_rl.engines.actor.local_dist import run_local

    res = run_local(sync_worker, 2, (str(path), repeat), timeout_s=3600,
                    collective_timeout_s=1800)[0]
    rows = res["receiver"]["rows"]
    nbytes = rows[-1]["bytes"]
    out: dict[str, Any] = {"bytes": nbytes, "tensors": rows[-1]["tensors"],
                           "buckets": rows[-1]["buckets"], "backend": "gloo", "ranks": 2}
    for key in ("sync_s", "broadcast_s", "update_s", "barrier_s"):
        out.update(_summary(key, [r[key] for r in rows]))
    out["GBps"] = _gbps(nbytes, out["sync_s_min"])
    out["broadcast_GBps"] = _gbps(nbytes, out["broadcast_s_min"])
    out["equal"] = res["receiver"]["equal"]
    out["maxrss_gb"] = {"sender": res["sender_maxrss_gb"], "receiver": res["receiver"]["maxrss_gb"]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=Path("runs/bench_load"),
                   help="where the checkpoint is written once (reused when present)")
    p.add_argument("--scale", choices=SCALES, default="full",
                   help="full: Qwen2.5-0.5B shapes; small: a tiny model of the same family")
    p.add_argument("--repeat", type=int, default=3, help="timed repetitions per section")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    args = p.parse_args()
    if args.repeat < 1:
        p.error("--repeat: at least 1")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from slurm_rl.engines.actor.model import init_local_process_group
    from slurm_rl.engines.hf_checkpoint import model_config_from_dir

    args.dir.mkdir(parents=True, exist_ok=True)
    path, written, write_s = ensure_checkpoint(args.dir, args.scale)
    cfg = model_config_from_dir(path)
    head = {"section": "checkpoint", "scale": args.scale, "path": str(path),
            "written_now": written, "write_s": write_s, "architecture": cfg.architecture,
            "parameters": cfg.num_parameters(),
            "bytes": sum(f.stat().st_size for f in _files(path)),
            "files": len(_files(path)), "threads": args.threads, "cpus": os.cpu_count(),
            "repeat": args.repeat, "torch": torch.__version__}
    print(json.dumps(head), flush=True)
    read_all(path, "bf16")  # the page cache holds the files from here on
    raw: dict[str, Any] | None = None
    for section in args.sections:
        if section == "raw":
            row = raw = bench_raw(path, args.repeat)
        elif section == "raw_cold":
            row = bench_raw_cold(path)
            read_all(path, "bf16")  # warm again for the next sections
        elif section == "actor":
            init_local_process_group()
            row = bench_actor(path, cfg, args.repeat)
            if raw is None:
                raw = bench_raw(path, args.repeat)
            for mode in ("bf16", "fp32", "fp32_kept"):
                row[f"raw_{mode}_s_min"] = raw[f"{mode}_s_min"]
                row[f"load_vs_raw_{mode}"] = row["load_s_min"] / raw[f"{mode}_s_min"]
        elif section == "rollout":
            row = bench_rollout(path, cfg, args.repeat)
        else:
            _release_memory()
            parent_rss = _rss_gb()
            row = bench_sync(path, args.repeat)
            row["maxrss_gb"]["parent_now"] = parent_rss
        _release_memory()
        print(json.dumps({"section": section, **row, "maxrss_gb": row.get("maxrss_gb",
                                                                           _maxrss_gb())}),
              flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
