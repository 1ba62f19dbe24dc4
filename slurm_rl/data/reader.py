"""StageReader: stream the shards of one stage as producers publish them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from slurm_rl.data.errors import DataPlaneError, InvalidManifestError, ManifestTimeout
from slurm_rl.data.layout import expected_path, manifest_path, stage_dir, validate_stage
from slurm_rl.data.manifest import ProducerManifest, ShardInfo
from slurm_rl.data.shardio import open_shard
from slurm_rl.fsio import FileSystem, read_bytes_once, stat_key


def read_expected(path: Path, iteration: int, stage: str, *, fs: FileSystem | None = None) -> dict:
    """Read and validate a stage's ``expected.json``; ``InvalidManifestError`` naming the file and field."""
    raw = read_bytes_once(path, fs=fs)
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidManifestError(f"{path}: not valid JSON ({len(raw)} bytes; truncated?): {e}") from None
    if not isinstance(obj, dict):
        raise InvalidManifestError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    for key, want in (("iteration", iteration), ("stage", stage)):
        if obj.get(key) != want:
            raise InvalidManifestError(f"{path}: field '{key}' is {obj.get(key)!r}, expected {want!r}")
    ranks = obj.get("producer_ranks")
    if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        raise InvalidManifestError(f"{path}: field 'producer_ranks' must be a list of non-negative ints, got {ranks!r}")
    if not isinstance(obj.get("final", True), bool):
        raise InvalidManifestError(f"{path}: field 'final' must be a bool, got {obj.get('final')!r}")
    return {"producer_ranks": ranks, "final": obj.get("final", True)}


@dataclass(frozen=True)
class Shard:
    """A verified shard handed to a consumer."""

    producer_rank: int
    seq: int
    info: ShardInfo
    path: Path
    table: pa.Table
    received_at: float


class _ProducerState:
    def __init__(self, rank: int, path: Path) -> None:
        self.rank = rank
        self.path = path
        self.stat_key: tuple[int, int, int] | None = None
        self.listed: list[ShardInfo] = []
        self.next_seq = 0
        self.complete = False


class StageReader:
    """Consumer of ``stage`` of ``iteration``, fed by ``producer_ranks``.

    Polls only known paths (one ``stat`` per unfinished producer per poll; no directory
    listing), yields every listed shard exactly once, in per-producer order, as soon as it is
    listed and verified, and stops once every producer's manifest says ``complete``.

    ``producer_ranks=None`` follows the stage's ``expected.json`` (see ``write_expected``): ranks
    may be added to it while the stage runs (e.g. rollout grows in a new epoch), and the reader
    stops only once it says ``final``. :meth:`add_producers` does the same for explicit lists.
    ``timeout_s`` bounds the time without progress (no new shard, no producer completing);
    exceeding it raises :class:`ManifestTimeout` naming the producers still missing.
    ``on_poll`` is called on every idle poll (e.g. to check heartbeats); it may raise.
    ``who`` (e.g. ``"rank 5 on n01, epoch 7"``) prefixes the timeout message.
    """

    def __init__(
        self,
        run_dir: str | Path,
        iteration: int,
        stage: str,
        producer_ranks: Sequence[int] | None,
        poll_interval_s: float = 0.05,
        timeout_s: float = 600.0,
        *,
        schema: pa.Schema | None = None,
        verify: bool = True,
        on_poll: Callable[[], None] | None = None,
        who: str | None = None,
        fs: FileSystem | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.fs = fs
        self.who = who
        self.iteration = iteration
        self.stage = validate_stage(stage)
        self.dir = stage_dir(run_dir, iteration, stage)
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self.schema = schema
        self.verify = verify
        self.on_poll = on_poll
        self._dynamic = producer_ranks is None
        self._expected_path = expected_path(run_dir, iteration, stage)
        self._expected_key: tuple[int, int, int] | None = None
        self._expected_final = not self._dynamic
        self._states: dict[int, _ProducerState] = {}
        self._started = False
        if producer_ranks is not None:
            self.add_producers(producer_ranks)

    def add_producers(self, ranks: Sequence[int]) -> None:
        """Also wait for (and read) these producer ranks; may be called while iterating."""
        for r in sorted({int(r) for r in ranks}):
            if r not in self._states:
                self._states[r] = _ProducerState(r, manifest_path(self.run_dir, self.iteration, self.stage, r))

    @property
    def producer_ranks(self) -> list[int]:
        """Producer ranks this reader waits for (so far)."""
        return sorted(self._states)

    # -- discovery -------------------------------------------------------------------------
    def _refresh_expected(self) -> bool:
        """Re-read expected.json if it changed; True if it added ranks or became final."""
        key = stat_key(self._expected_path, fs=self.fs)
        if key is None or key == self._expected_key:
            return False
        obj = read_expected(self._expected_path, self.iteration, self.stage, fs=self.fs)
        ranks = obj["producer_ranks"]
        dropped = sorted(set(self._states) - set(ranks))
        if dropped:
            raise InvalidManifestError(
                f"{self._expected_path}: producer ranks {dropped} were removed (ranks may only be added; "
                "a released producer closes its writer as complete instead)"
            )
        before = (len(self._states), self._expected_final)
        self.add_producers(ranks)
        self._expected_final = obj["final"]
        self._expected_key = key
        return (len(self._states), self._expected_final) != before

    def _refresh(self, st: _ProducerState) -> None:
        key = stat_key(st.path, fs=self.fs)
        if key is None or key == st.stat_key:
            return
        try:
            raw = read_bytes_once(st.path, fs=self.fs)
        except FileNotFoundError:
            return
        m = ProducerManifest.parse(raw, st.path, iteration=self.iteration, stage=self.stage, producer_rank=st.rank,
                                   known=st.listed)
        # Append-only: what we already saw must be a prefix of the new list.
        for old, new in zip(st.listed, m.shards):
            if old != new:
                raise InvalidManifestError(
                    f"{st.path}: shard {old.name} changed after it was published (manifest is append-only)"
                )
        if len(m.shards) < len(st.listed):
            raise InvalidManifestError(
                f"{st.path}: lists {len(m.shards)} shards, {len(st.listed)} were listed before (manifest is append-only)"
            )
        st.listed = m.shards
        st.complete = m.complete
        st.stat_key = key

    def _timeout(self) -> ManifestTimeout:
        states = [self._states[r] for r in sorted(self._states)]
        missing = [st.rank for st in states if not st.complete]
        parts = [
            f"rank {st.rank}: {'no manifest' if st.stat_key is None else f'{len(st.listed)} shards, incomplete'}"
            for st in states
            if not st.complete
        ]
        if self._dynamic and self._expected_key is None:
            parts = [f"no {self._expected_path} (nobody published the expected producer ranks)"]
        elif not self._expected_final:
            parts.append(f"{self._expected_path} not final")
        who = f"{self.who}: " if self.who else ""
        return ManifestTimeout(
            f"{who}iteration {self.iteration} stage {self.stage!r}: producers {missing} not complete after "
            f"{self.timeout_s:.1f}s without progress ({'; '.join(parts)}; dir {self.dir})",
            iteration=self.iteration,
            stage=self.stage,
            missing_ranks=missing,
        )

    # -- public ----------------------------------------------------------------------------
    def iter_entries(self) -> Iterator[Shard]:
        """Yield each verified shard (with its manifest entry) once, as it becomes available."""
        if self._started:
            raise DataPlaneError(f"{self.dir}: a StageReader can be iterated once")
        self._started = True
        last_progress = time.monotonic()
        while True:
            progressed = self._dynamic and self._refresh_expected()
            for st in [self._states[r] for r in sorted(self._states)]:
                if st.complete and st.next_seq >= len(st.listed):
                    continue
                was_complete = st.complete
                self._refresh(st)
                progressed |= st.complete and not was_complete
                while st.next_seq < len(st.listed):
                    info = st.listed[st.next_seq]
                    path = self.dir / info.name
                    table = open_shard(
                        path, nbytes=info.bytes, digest=info.xxh3_64 if self.verify else None, schema=self.schema,
                        fs=self.fs,
                    )
                    if table.num_rows != info.rows:
                        raise DataPlaneError(f"{path}: {table.num_rows} rows, manifest says {info.rows}")
                    st.next_seq += 1
                    progressed = True
                    yield Shard(st.rank, st.next_seq - 1, info, path, table, time.time())
            if self._expected_final and all(
                st.complete and st.next_seq >= len(st.listed) for st in self._states.values()
            ):
                return
            now = time.monotonic()
            if progressed:
                last_progress = now
                continue
            if now - last_progress > self.timeout_s:
                raise self._timeout()
            if self.on_poll is not None:
                self.on_poll()
            time.sleep(self.poll_interval_s)

    def iter_shards(self) -> Iterator[pa.Table]:
        """Yield each verified shard's table once, as it becomes available (zero copy)."""
        for shard in self.iter_entries():
            yield shard.table

    def read_all(self) -> pa.Table:
        """Wait for the whole stage and return all shards concatenated (producer rank, then seq)."""
        entries = sorted(self.iter_entries(), key=lambda s: (s.producer_rank, s.seq))
        if not entries:
            if self.schema is None:
                raise DataPlaneError(f"{self.dir}: stage is complete but empty and no schema was given")
            return self.schema.empty_table()
        return pa.concat_tables([e.table for e in entries])
