#!/usr/bin/env python3
"""Benchmark of the Arrow data plane; prints one JSON document.

For each batch size and each directory (local disk and tmpfs):
  * write: ``StageWriter.write`` (IPC serialisation + xxh3_64 + fsync + rename + manifest);
  * read: ``StageReader.read_all`` (memory map + size/xxh3_64 verification + zero-copy open);
  * raw copy of the same bytes in memory, in the same run (into fresh and into reused buffers);
  * checksum cost alone (xxh3_64, xxh64, zlib.crc32 over the memory-mapped file);
  * zero-copy open (memory map + IPC footer + record batches, no checksum);
  * an unchecked floor: plain IPC write + mapped-in open, no checksum/fsync/manifest.

Usage: tools/bench_data_plane.py [--sizes-mb 64 256 1024] [--dirs /var/tmp /dev/shm] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import xxhash

from slurm_rl.data import ROLLOUTS, StageReader, StageWriter
from slurm_rl.data.layout import stage_dir
from slurm_rl.data.shardio import map_file

RESPONSE_LEN = 2048
PROMPT_LEN = 256


def make_table(nbytes: int, seed: int = 0) -> pa.Table:
    """A ROLLOUTS table of about ``nbytes`` (prompt 256 + response 2048 tokens per row)."""
    per_row = (PROMPT_LEN + 2 * RESPONSE_LEN) * 4 + 64
    n = max(1, nbytes // per_row)
    rng = np.random.default_rng(seed)

    def lists(width: int, values: np.ndarray) -> pa.ListArray:
        return pa.ListArray.from_arrays(pa.array(np.arange(0, (n + 1) * width, width, dtype=np.int32)), pa.array(values))

    ids = np.arange(n, dtype=np.int64)
    return pa.table(
        {
            "sample_id": ids,
            "group_id": ids // 8,
            "sample_index": (ids % 8).astype(np.int32),
            "prompt_ids": lists(PROMPT_LEN, rng.integers(0, 32000, n * PROMPT_LEN, dtype=np.int32)),
            "prompt_text": pa.nulls(n, pa.string()),
            "response_ids": lists(RESPONSE_LEN, rng.integers(0, 32000, n * RESPONSE_LEN, dtype=np.int32)),
            "sampled_logprobs": lists(RESPONSE_LEN, -rng.random(n * RESPONSE_LEN, dtype=np.float32)),
            "reward": np.zeros(n, np.float32),
            "finish_reason": pa.array(["stop"] * n),
            "weight_version": np.zeros(n, np.int64),
            "weight_version_last": np.zeros(n, np.int64),
            "rollout_rank": np.zeros(n, np.int32),
            "t_start": np.zeros(n),
            "t_end": np.zeros(n),
        },
        schema=ROLLOUTS,
    )


def buffers(table: pa.Table) -> list[np.ndarray]:
    """Byte views of every buffer of the table (the bytes that the shard carries)."""
    out = []
    for col in table.columns:
        for chunk in col.chunks:
            for b in chunk.buffers():
                if b is not None and b.size:
                    out.append(np.frombuffer(b, dtype=np.uint8))
    return out


def raw_copy(table: pa.Table, repeat: int) -> dict[str, float]:
    """Seconds to copy all buffers into fresh arrays, and into reused arrays (memcpy only)."""
    bufs = buffers(table)
    fresh = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        copies = [b.copy() for b in bufs]
        fresh.append(time.perf_counter() - t0)
        del copies
    dst = [np.empty_like(b) for b in bufs]
    reused = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for d, b in zip(dst, bufs):
            np.copyto(d, b)
        reused.append(time.perf_counter() - t0)
    return {"fresh_s": min(fresh), "reused_s": min(reused), "bytes": int(sum(b.size for b in bufs))}


def checksums(path: Path) -> dict[str, float]:
    """GB/s of each checksum over the (warm) memory-mapped file."""
    with pa.memory_map(str(path)) as mm:
        buf = mm.read_buffer()
        size = buf.size
        out = {}
        for name, fn in (("xxh3_64", xxhash.xxh3_64_hexdigest), ("xxh64", xxhash.xxh64_hexdigest), ("crc32", zlib.crc32)):
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                fn(buf)
                times.append(time.perf_counter() - t0)
            out[f"{name}_gbps"] = round(size / min(times) / 1e9, 2)
        return out


def zero_copy_open(path: Path, repeat: int) -> dict[str, float]:
    """Milliseconds to memory-map and open a shard without checksum, and with it."""
    plain, verified = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        with pa.memory_map(str(path)) as mm:
            t = pa.ipc.open_file(mm).read_all()
            plain.append(time.perf_counter() - t0)
            del t
        t0 = time.perf_counter()
        with pa.memory_map(str(path)) as mm:
            xxhash.xxh3_64_hexdigest(mm.read_buffer())
            mm.seek(0)
            t = pa.ipc.open_file(mm).read_all()
            verified.append(time.perf_counter() - t0)
            del t
    return {"open_ms": round(min(plain) * 1e3, 3), "open_verified_ms": round(min(verified) * 1e3, 2)}


def unchecked_floor(base: Path, table: pa.Table, repeat: int) -> dict[str, float]:
    """Seconds of the same hand-off without checksums, fsync or manifest: plain IPC write, then a
    zero-copy open whose pages are mapped in (what a consumer pays to touch the data once)."""
    writes, reads = [], []
    for _ in range(repeat):
        path = Path(tempfile.mkdtemp(prefix="bench-floor-", dir=base)) / "shard.arrow"
        try:
            t0 = time.perf_counter()
            with pa.OSFile(str(path), "wb") as sink:
                with pa.ipc.new_file(sink, table.schema) as w:
                    w.write_table(table)
            writes.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = pa.ipc.open_file(pa.BufferReader(map_file(path, populate=True))).read_all()
            reads.append(time.perf_counter() - t0)
            del got
        finally:
            shutil.rmtree(path.parent, ignore_errors=True)
    return {"floor_write_s": statistics.median(writes), "floor_read_s": statistics.median(reads)}


def bench_one(base: Path, table: pa.Table, repeat: int, fsync: bool) -> dict[str, float]:
    """Median write and verified-read seconds of ``table`` as one shard under ``base``."""
    writes, reads = [], []
    for i in range(repeat):
        run_dir = Path(tempfile.mkdtemp(prefix="bench-", dir=base))
        try:
            t0 = time.perf_counter()
            with StageWriter(run_dir, i, "rollouts", 0, ROLLOUTS, fsync=fsync) as w:
                w.write(table)
            writes.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = StageReader(run_dir, i, "rollouts", [0], 0.001, 60.0, schema=ROLLOUTS).read_all()
            reads.append(time.perf_counter() - t0)
            assert got.num_rows == table.num_rows
            del got
            if i == repeat - 1:
                shard = stage_dir(run_dir, i, "rollouts") / "shard-0000-000000.arrow"
                extra = {"file_bytes": shard.stat().st_size, **checksums(shard), **zero_copy_open(shard, 5)}
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
    return {"write_s": statistics.median(writes), "read_s": statistics.median(reads), **extra}


def mem_available() -> int:
    """MemAvailable in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--dirs", nargs="+", default=["/var/tmp", "/dev/shm"])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    result: dict = {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "pyarrow": pa.__version__,
        "xxhash": xxhash.VERSION,
        "loadavg": os.getloadavg(),
        "runs": [],
        "skipped": [],
    }
    for size_mb in args.sizes_mb:  # sequential: one batch in memory at a time
        nbytes = size_mb * 2**20
        if mem_available() < 4 * nbytes:
            result["skipped"].append({"size_mb": size_mb, "why": f"MemAvailable {mem_available() >> 20} MiB < 4x batch"})
            continue
        table = make_table(nbytes)
        raw = raw_copy(table, args.repeat)
        for d in args.dirs:
            base = Path(d)
            free = shutil.disk_usage(base).free
            if free < 3 * nbytes:
                result["skipped"].append({"size_mb": size_mb, "dir": d, "why": f"free {free >> 20} MiB < 3x batch"})
                continue
            fs = "tmpfs" if d.startswith("/dev/shm") else "disk"
            for fsync in ([True, False] if fs == "disk" else [True]):
                reps = args.repeat if size_mb < 1024 else 2
                r = bench_one(base, table, reps, fsync)
                if fsync:
                    r.update(unchecked_floor(base, table, reps))
                total = r["write_s"] + r["read_s"]
                if "floor_write_s" in r:
                    floor = r["floor_write_s"] + r["floor_read_s"]
                    r["floor_write_read_gbps"] = round(raw["bytes"] / floor / 1e9, 2)
                    r["data_plane_vs_floor"] = round(floor / total, 3)
                result["runs"].append(
                    {
                        "size_mb": size_mb,
                        "dir": d,
                        "fs": fs,
                        "fsync": fsync,
                        "rows": table.num_rows,
                        "payload_bytes": raw["bytes"],
                        "write_gbps": round(raw["bytes"] / r["write_s"] / 1e9, 2),
                        "read_verified_gbps": round(raw["bytes"] / r["read_s"] / 1e9, 2),
                        "write_read_gbps": round(raw["bytes"] / total / 1e9, 2),
                        "raw_copy_fresh_gbps": round(raw["bytes"] / raw["fresh_s"] / 1e9, 2),
                        "raw_copy_reused_gbps": round(raw["bytes"] / raw["reused_s"] / 1e9, 2),
                        "ratio_vs_fresh_copy": round(raw["fresh_s"] / total, 3),
                        "ratio_vs_reused_copy": round(raw["reused_s"] / total, 3),
                        **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k not in ("write_s", "read_s")},
                        "write_s": round(r["write_s"], 4),
                        "read_s": round(r["read_s"], 4),
                    }
                )
                print(json.dumps(result["runs"][-1]), file=sys.stderr, flush=True)
        del table
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
