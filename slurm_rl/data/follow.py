"""Non-blocking reader of one stage: each ``poll`` returns the verified shards published since the last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from slurm_rl.data.layout import expected_path, manifest_path, stage_dir
from slurm_rl.data.manifest import ProducerManifest
from slurm_rl.data.reader import read_expected
from slurm_rl.data.shardio import open_shard
from slurm_rl.fsio import FileSystem, stat_key


class StageFollower:
    """Shards of one stage as they appear, without blocking.

    Producers come from the stage's ``expected.json`` (re-read when it changes) unless given; one
    ``stat`` per unfinished producer per poll, no directory listing.
    """

    def __init__(self, run_dir: Path, iteration: int, stage: str, producers: list[int] | None = None,
                 fs: FileSystem | None = None) -> None:
        self.run_dir, self.iteration, self.stage, self.fs = run_dir, iteration, stage, fs
        self.dir = stage_dir(run_dir, iteration, stage)
        self._expected = expected_path(run_dir, iteration, stage)
        self._expected_key: tuple[int, int, int] | None = None
        self._final = producers is not None
        self._producers: dict[int, dict[str, Any]] = {}
        for r in producers or ():
            self._add(r)

    def _add(self, rank: int) -> None:
        if rank not in self._producers:  # its manifest's path built once: a poll stats it, often
            self._producers[rank] = {"key": None, "shards": [], "next": 0, "complete": False,
                                     "path": manifest_path(self.run_dir, self.iteration, self.stage, rank)}

    def poll(self) -> list[tuple[int, int, pa.Table]]:
        """Shards published since the last poll as (producer, seq, table)."""
        if self._expected_key is None or not self._final:
            key = stat_key(self._expected, self.fs)
            if key is not None and key != self._expected_key:
                doc = read_expected(self._expected, self.iteration, self.stage, fs=self.fs)
                for r in doc["producer_ranks"]:
                    self._add(r)
                self._final = doc["final"]
                self._expected_key = key
        out = []
        for rank, st in sorted(self._producers.items()):
            if st["complete"] and st["next"] >= len(st["shards"]):
                continue
            path = st["path"]
            key = stat_key(path, self.fs)
            if key is not None and key != st["key"]:
                m = ProducerManifest.load(path, iteration=self.iteration, stage=self.stage, producer_rank=rank,
                                          fs=self.fs, known=st["shards"])
                st["shards"], st["complete"], st["key"] = m.shards, m.complete, key
            while st["next"] < len(st["shards"]):
                info = st["shards"][st["next"]]
                table = open_shard(self.dir / info.name, nbytes=info.bytes, digest=info.xxh3_64, fs=self.fs)
                out.append((rank, st["next"], table))
                st["next"] += 1
        return out

    @property
    def complete(self) -> bool:
        """Every expected producer completed and every shard was returned."""
        return self._final and bool(self._producers) and all(
            st["complete"] and st["next"] >= len(st["shards"]) for st in self._producers.values()
        )
