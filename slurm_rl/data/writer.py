"""StageWriter: one producer rank publishing shards of one stage of one iteration."""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.compute as pc

from slurm_rl.fsio import FileSystem, atomic_write_json, makedirs_private, remove_stale_temp_files
from slurm_rl.data.errors import DataPlaneError
from slurm_rl.data.layout import expected_path, manifest_path, shard_name, stage_dir, validate_stage
from slurm_rl.data.manifest import ProducerManifest, ShardInfo
from slurm_rl.data.schemas import SCHEMA_VERSION, check_schema, conform
from slurm_rl.data.shardio import count_tokens, write_shard


class StageWriter:
    """Publishes shards of ``stage`` for ``producer_rank``: one shard per :meth:`write` call.

    Each shard is written under a temp name, fsynced and renamed; only then is the producer's
    manifest rewritten (atomically) to list it. :meth:`close` marks the producer complete.

    A writer started for a rank that already has an incomplete manifest (e.g. the previous
    process was killed) resumes: it keeps the published shards, removes that rank's leftover
    temp files and continues the numbering, so consumers see an append-only list.
    """

    def __init__(
        self,
        run_dir: str | Path,
        iteration: int,
        stage: str,
        producer_rank: int,
        schema: pa.Schema,
        *,
        fsync: bool = True,
        fs: FileSystem | None = None,
    ) -> None:
        check_schema(schema, None, f"schema for stage {stage!r}")
        self.fs = fs
        self.run_dir = Path(run_dir)
        self.iteration = iteration
        self.stage = validate_stage(stage)
        self.producer_rank = producer_rank
        self.schema = schema
        self.fsync = fsync
        self.dir = stage_dir(run_dir, iteration, stage)
        self.manifest_path = manifest_path(run_dir, iteration, stage, producer_rank)
        makedirs_private(self.dir, fs=fs)
        self._closed = False
        if self.manifest_path.exists():
            m = ProducerManifest.load(self.manifest_path, iteration=iteration, stage=stage, producer_rank=producer_rank,
                                      fs=fs)
            if m.complete:
                raise DataPlaneError(
                    f"{self.manifest_path}: producer rank {producer_rank} already completed stage {stage!r} "
                    f"of iteration {iteration}; refusing to write more"
                )
            self._manifest = m
            self.resumed = True
        else:
            self._manifest = ProducerManifest(iteration, stage, producer_rank, SCHEMA_VERSION)
            self.resumed = False
        self._remove_stale_temp_files()
        self._publish()

    def _remove_stale_temp_files(self) -> None:
        # Leftovers of a killed process of this rank (never listed, so never read); done once at start.
        for prefix in (f"shard-{self.producer_rank:04d}-", f"manifest-{self.producer_rank:04d}.json"):
            remove_stale_temp_files(self.dir, older_than_s=-1.0, prefix=prefix, fs=self.fs)

    def _publish(self) -> None:
        self._manifest.updated_at = time.time()
        atomic_write_json(self.manifest_path, self._manifest.to_json(), durable=self.fsync, fs=self.fs)

    @property
    def shards(self) -> list[ShardInfo]:
        """Shards published so far (including those of a resumed predecessor)."""
        return list(self._manifest.shards)

    def write(self, data: pa.Table | pa.RecordBatch | dict) -> ShardInfo:
        """Publish ``data`` as one new shard and list it in the manifest; returns its entry."""
        if self._closed:
            raise DataPlaneError(f"{self.manifest_path}: writer already closed")
        table = conform(data, self.schema)
        seq = len(self._manifest.shards)
        name = shard_name(self.producer_rank, seq)
        nbytes, digest = write_shard(self.dir / name, table, fsync=self.fsync, fs=self.fs)
        lo = hi = None
        if "sample_id" in table.column_names and table.num_rows:
            mm = pc.min_max(table.column("sample_id"))
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
        info = ShardInfo(
            name=name,
            rows=table.num_rows,
            bytes=nbytes,
            tokens=count_tokens(table),
            xxh3_64=digest,
            sample_id_min=lo,
            sample_id_max=hi,
            sample_count=table.num_rows if "sample_id" in table.column_names else 0,
            created_at=time.time(),
        )
        self._manifest.shards.append(info)
        self._publish()
        return info

    def close(self, complete: bool = True) -> None:
        """Finish; with ``complete=True`` mark this producer done (consumers stop waiting for it)."""
        if self._closed:
            return
        self._closed = True
        if complete:
            self._manifest.complete = True
            self._publish()

    def __enter__(self) -> "StageWriter":
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(complete=exc_type is None)


def write_expected(
    run_dir: str | Path, iteration: int, stage: str, producer_ranks: list[int], *, final: bool = True,
    fs: FileSystem | None = None,
) -> Path:
    """Publish the producer ranks a consumer of ``stage`` must wait for (atomic replace).

    May be rewritten to add ranks (never to remove them); readers following it stop only once
    it is written with ``final=True`` and every listed producer is complete.
    """
    ranks = sorted({int(r) for r in producer_ranks})
    path = expected_path(run_dir, iteration, stage)
    makedirs_private(path.parent, fs=fs)
    atomic_write_json(
        path,
        {"iteration": iteration, "stage": stage, "producer_ranks": ranks, "final": final, "written_at": time.time()},
        fs=fs,
    )
    return path
