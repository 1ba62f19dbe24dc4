"""Per-producer stage manifests (JSON): the only list of shards a consumer may read.

Each producer rank owns ``manifest-RRRR.json`` of a stage and rewrites it atomically after every
shard (append-only list) and once more with ``complete: true``. Several producers therefore write
one stage concurrently without locks; the stage is complete when every expected producer's
manifest is complete.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

from slurm_rl.data.errors import InvalidManifestError
from slurm_rl.data.layout import manifest_path, validate_shard_name
from slurm_rl.fsio import FileSystem, read_bytes_once

MANIFEST_FORMAT = "slurm_rl.data.manifest/1"


@dataclass(frozen=True)
class ShardInfo:
    """One shard as listed in a manifest."""

    name: str
    rows: int
    bytes: int
    tokens: int
    xxh3_64: str
    sample_id_min: int | None
    sample_id_max: int | None
    sample_count: int
    created_at: float

    def __post_init__(self) -> None:  # built once: a manifest is rewritten, and re-read, after every shard
        object.__setattr__(self, "_json", {name: getattr(self, name) for name in _SHARD_FIELDS})

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dict(self._json)  # type: ignore[attr-defined]

    def lists_as(self, entry: Any) -> bool:
        """Whether a manifest's ``entry`` lists exactly this shard."""
        return entry == self._json  # type: ignore[attr-defined]

    @classmethod
    def from_json(cls, obj: Any, producer_rank: int, where: Path, field: str = "shards[?]") -> "ShardInfo":
        """Parse and validate one manifest entry (name, types, ranges); errors name ``field``."""
        if not isinstance(obj, dict):
            raise InvalidManifestError(f"{where}: field '{field}' is not an object: {obj!r}")
        try:
            name = validate_shard_name(obj["name"], producer_rank, f"{where}: field '{field}.name'")
            ints = {k: obj[k] for k in ("rows", "bytes", "tokens", "sample_count")}
            for k, v in ints.items():
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise InvalidManifestError(f"{where}: field '{field}.{k}' (shard {name}) must be a non-negative "
                                               f"int, got {v!r}")
            digest = obj["xxh3_64"]
            if not isinstance(digest, str) or len(digest) != 16 or any(c not in "0123456789abcdef" for c in digest):
                raise InvalidManifestError(f"{where}: field '{field}.xxh3_64' (shard {name}) must be 16 lower-case "
                                           f"hex digits, got {digest!r}")
            for k in ("sample_id_min", "sample_id_max"):
                v = obj[k]
                if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                    raise InvalidManifestError(f"{where}: field '{field}.{k}' (shard {name}) must be an int or null, "
                                               f"got {v!r}")
            lo, hi = obj["sample_id_min"], obj["sample_id_max"]
            created = obj["created_at"]
            if isinstance(created, bool) or not isinstance(created, (int, float)):
                raise InvalidManifestError(f"{where}: field '{field}.created_at' (shard {name}) must be a number, "
                                           f"got {created!r}")
            return cls(
                name=name,
                rows=ints["rows"],
                bytes=ints["bytes"],
                tokens=ints["tokens"],
                xxh3_64=digest,
                sample_id_min=lo,
                sample_id_max=hi,
                sample_count=ints["sample_count"],
                created_at=float(created),
            )
        except KeyError as e:
            raise InvalidManifestError(f"{where}: field '{field}' lacks key {e}") from None


_SHARD_FIELDS = tuple(f.name for f in fields(ShardInfo))


@dataclass
class ProducerManifest:
    """Everything one producer rank published for one stage of one iteration."""

    iteration: int
    stage: str
    producer_rank: int
    schema_version: int
    shards: list[ShardInfo] = field(default_factory=list)
    complete: bool = False
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "format": MANIFEST_FORMAT,
            "iteration": self.iteration,
            "stage": self.stage,
            "producer_rank": self.producer_rank,
            "schema_version": self.schema_version,
            "shards": [s.to_json() for s in self.shards],
            "complete": self.complete,
            "updated_at": self.updated_at,
            "rows": sum(s.rows for s in self.shards),
            "tokens": sum(s.tokens for s in self.shards),
        }

    @classmethod
    def parse(cls, raw: bytes, where: Path, *, iteration: int, stage: str, producer_rank: int,
              known: Sequence[ShardInfo] = ()) -> "ProducerManifest":
        """Parse and validate manifest bytes; the identity fields must match what the caller expects.

        ``known``: the shards of this manifest as parsed before (a follower re-reading an append-only
        manifest): an entry equal to the known one at its position is taken as is, not re-validated.
        """
        try:
            obj = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InvalidManifestError(f"{where}: not valid JSON ({len(raw)} bytes; truncated?): {e}") from e
        if not isinstance(obj, dict) or obj.get("format") != MANIFEST_FORMAT:
            got = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
            raise InvalidManifestError(f"{where}: field 'format' must be {MANIFEST_FORMAT!r}, got {got!r}")
        for key, want in (("iteration", iteration), ("stage", stage), ("producer_rank", producer_rank)):
            if obj.get(key) != want:
                raise InvalidManifestError(f"{where}: field '{key}' is {obj.get(key)!r}, expected {want!r}")
        shards_raw = obj.get("shards")
        if not isinstance(shards_raw, list):
            raise InvalidManifestError(f"{where}: field 'shards' must be a list, got {shards_raw!r}")
        if not isinstance(obj.get("complete"), bool):
            raise InvalidManifestError(f"{where}: field 'complete' must be a bool, got {obj.get('complete')!r}")
        for key in ("schema_version",):
            v = obj.get(key, -1)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidManifestError(f"{where}: field '{key}' must be an int, got {v!r}")
        updated = obj.get("updated_at", 0.0)
        if isinstance(updated, bool) or not isinstance(updated, (int, float)):
            raise InvalidManifestError(f"{where}: field 'updated_at' must be a number, got {updated!r}")
        shards = [known[i] if i < len(known) and known[i].lists_as(s)
                  else ShardInfo.from_json(s, producer_rank, where, f"shards[{i}]") for i, s in enumerate(shards_raw)]
        names = [s.name for s in shards]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise InvalidManifestError(f"{where}: field 'shards' lists {dup} more than once")
        return cls(
            iteration=iteration,
            stage=stage,
            producer_rank=producer_rank,
            schema_version=obj.get("schema_version", -1),
            shards=shards,
            complete=obj["complete"],
            updated_at=float(updated),
        )

    @classmethod
    def load(cls, path: Path, *, iteration: int, stage: str, producer_rank: int,
             fs: FileSystem | None = None, known: Sequence[ShardInfo] = ()) -> "ProducerManifest":
        """Read and validate a manifest file (``known``: as in :meth:`parse`)."""
        return cls.parse(read_bytes_once(path, fs=fs), path, iteration=iteration, stage=stage,
                         producer_rank=producer_rank, known=known)


def produced_rows(run_dir: str | Path, iteration: int, stage: str, producer_ranks: Sequence[int],
                  fs: FileSystem | None = None) -> int:
    """Rows the given producers have published for ``stage`` so far (reads one manifest each)."""
    total = 0
    for rank in producer_ranks:
        path = manifest_path(run_dir, iteration, stage, rank)
        try:
            m = ProducerManifest.load(path, iteration=iteration, stage=stage, producer_rank=rank, fs=fs)
        except FileNotFoundError:
            continue
        total += sum(s.rows for s in m.shards)
    return total
