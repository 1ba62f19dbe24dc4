"""Unfinished rollout requests handed from a released rollout rank to the remaining ones.

A released rank calls :func:`write_pending`: its requests (prompt, partial response, partial
logprobs, sampling state) go to ``iter-XXXXXX/pending/pending-FFFF-TTTTTT-CCC.arrow`` plus a JSON
ticket ``...json`` (rows, bytes, xxh3_64, sample ids) created exclusively after the Arrow file is
durable. A remaining rank claims a ticket by renaming it to ``claimed-RRRR--<ticket>``: rename is
atomic, so exactly one claimer wins each ticket and no request is taken twice or lost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from slurm_rl.data.errors import DataPlaneError, InvalidManifestError
from slurm_rl.data.layout import PENDING_STAGE, iteration_dir, validate_pending_name
from slurm_rl.data.schemas import PENDING, conform
from slurm_rl.data.shardio import open_shard, write_shard
from slurm_rl.fsio import FileSystem, fsync_dir, makedirs_private, read_bytes_once, rename, write_json_exclusive

TICKET_FORMAT = "slurm_rl.data.pending/1"


@dataclass(frozen=True)
class PendingTicket:
    """One batch of pending requests (an Arrow file plus its JSON ticket)."""

    ticket: str
    arrow: str
    from_rank: int
    rows: int
    bytes: int
    xxh3_64: str
    sample_ids: list[int]


def pending_dir(run_dir: str | Path, iteration: int) -> Path:
    """``RUN_DIR/data/iter-XXXXXX/pending``."""
    return iteration_dir(run_dir, iteration) / PENDING_STAGE


def _claimed_name(rank: int, ticket: str) -> str:
    return f"claimed-{rank:04d}--{ticket}"


def write_pending(
    run_dir: str | Path,
    iteration: int,
    from_rank: int,
    requests: pa.Table | list[dict] | dict,
    *,
    tag: int = 0,
    num_chunks: int = 1,
    fsync: bool = True,
    fs: FileSystem | None = None,
) -> list[PendingTicket]:
    """Publish ``requests`` (PENDING schema) of released rank ``from_rank`` as claimable work.

    ``num_chunks`` splits them into that many tickets so several remaining ranks can share the
    work; ``tag`` (e.g. the epoch number) keeps names unique if a rank is released twice in an
    iteration. Refuses to overwrite an existing ticket.
    """
    if isinstance(requests, list):
        requests = pa.Table.from_pylist(requests, schema=PENDING)
    table = conform(requests, PENDING)
    ids = table.column("sample_id").to_numpy()
    if len(np.unique(ids)) != len(ids):
        raise DataPlaneError(f"rank {from_rank}, iteration {iteration}: duplicate sample ids in pending requests")
    n = table.num_rows
    if n == 0:
        return []
    d = pending_dir(run_dir, iteration)
    makedirs_private(d, fs=fs)
    chunks = max(1, min(num_chunks, n))
    bounds = np.linspace(0, n, chunks + 1).astype(int)
    out = []
    for c in range(chunks):
        part = table.slice(bounds[c], bounds[c + 1] - bounds[c])
        stem = f"pending-{from_rank:04d}-{tag:06d}-{c:03d}"
        arrow, ticket = f"{stem}.arrow", f"{stem}.json"
        if (d / ticket).exists() or any(d.glob(f"claimed-*--{ticket}")):
            raise DataPlaneError(f"{d / ticket}: pending ticket already exists (rank {from_rank}, tag {tag})")
        nbytes, digest = write_shard(d / arrow, part, fsync=fsync, fs=fs)
        sample_ids = [int(x) for x in part.column("sample_id").to_numpy()]
        info = PendingTicket(ticket, arrow, from_rank, part.num_rows, nbytes, digest, sample_ids)
        try:
            write_json_exclusive(
                d / ticket,
                {
                    "format": TICKET_FORMAT,
                    "iteration": iteration,
                    "from_rank": from_rank,
                    "arrow": arrow,
                    "rows": part.num_rows,
                    "bytes": nbytes,
                    "xxh3_64": digest,
                    "sample_ids": sample_ids,
                    "written_at": time.time(),
                },
                fs=fs,
            )
        except FileExistsError:
            raise DataPlaneError(f"{d / ticket}: pending ticket already exists (rank {from_rank}, tag {tag})") from None
        out.append(info)
    return out


def _parse_ticket(path: Path, ticket: str, fs: FileSystem | None = None) -> PendingTicket:
    """Read and validate a ticket; ``InvalidManifestError`` naming the file and the field."""
    raw = read_bytes_once(path, fs=fs)
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidManifestError(f"{path}: not valid JSON ({len(raw)} bytes; truncated?): {e}") from None
    if not isinstance(obj, dict) or obj.get("format") != TICKET_FORMAT:
        got = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
        raise InvalidManifestError(f"{path}: field 'format' must be {TICKET_FORMAT!r}, got {got!r}")
    try:
        arrow = validate_pending_name(obj["arrow"], f"{path}: field 'arrow'")
        ids = obj["sample_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise InvalidManifestError(f"{path}: field 'sample_ids' must be a list of ints")
        for key in ("from_rank", "rows", "bytes"):
            v = obj[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidManifestError(f"{path}: field '{key}' must be a non-negative int, got {v!r}")
        digest = obj["xxh3_64"]
        if not isinstance(digest, str) or len(digest) != 16:
            raise InvalidManifestError(f"{path}: field 'xxh3_64' must be 16 hex digits, got {digest!r}")
        if obj["rows"] != len(ids):
            raise InvalidManifestError(f"{path}: field 'rows' is {obj['rows']}, but 'sample_ids' lists {len(ids)}")
        return PendingTicket(ticket, arrow, obj["from_rank"], obj["rows"], obj["bytes"], digest, ids)
    except KeyError as e:
        raise InvalidManifestError(f"{path}: ticket lacks field {e}") from None


def list_pending(run_dir: str | Path, iteration: int) -> list[str]:
    """Names of unclaimed tickets (sorted). Lists one directory: call at epoch changes, not in hot loops."""
    d = pending_dir(run_dir, iteration)
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.glob("pending-*.json"))


def _load_ticket(d: Path, ticket_file: str, ticket: str, fs: FileSystem | None) -> tuple[PendingTicket, pa.Table]:
    info = _parse_ticket(d / ticket_file, ticket, fs)
    table = open_shard(d / info.arrow, nbytes=info.bytes, digest=info.xxh3_64, schema=PENDING, fs=fs)
    got = table.column("sample_id").to_pylist()
    if got != info.sample_ids:
        raise DataPlaneError(f"{d / info.arrow}: sample ids differ from ticket {d / ticket_file}")
    return info, table


def _load_claimed(d: Path, ticket_file: str, fs: FileSystem | None = None) -> tuple[PendingTicket, pa.Table]:
    return _load_ticket(d, ticket_file, ticket_file.split("--", 1)[1], fs)


def claim_pending(
    run_dir: str | Path,
    iteration: int,
    rank: int,
    *,
    max_rows: int | None = None,
    from_ranks: Sequence[int] | None = None,
    fs: FileSystem | None = None,
) -> pa.Table:
    """Claim unclaimed pending tickets for ``rank`` and return their requests (PENDING schema).

    Claims whole tickets until at least ``max_rows`` rows are claimed (all if None), optionally
    only those written by ``from_ranks``. Each ticket goes to exactly one caller, across
    processes and hosts sharing RUN_DIR. Returns an empty table when nothing is left.

    A ticket is validated (and its Arrow file checksummed) before it is claimed: a corrupt one
    raises ``InvalidManifestError``/``CorruptShardError`` naming the file and stays unclaimed.
    """
    d = pending_dir(run_dir, iteration)
    names = list_pending(run_dir, iteration)
    if from_ranks is not None:
        wanted = tuple(f"pending-{r:04d}-" for r in from_ranks)
        names = [n for n in names if n.startswith(wanted)]
    if names:  # start at a rank-dependent ticket to spread concurrent claimers
        k = rank % len(names)
        names = names[k:] + names[:k]
    tables: list[pa.Table] = []
    claimed_rows = 0
    for name in names:
        if max_rows is not None and claimed_rows >= max_rows:
            break
        target = _claimed_name(rank, name)
        try:
            _, table = _load_ticket(d, name, name, fs)  # tickets are write-once: check before claiming
        except FileNotFoundError:
            if not (d / target).exists():  # someone else won this ticket
                continue
            _, table = _load_claimed(d, target, fs)
        else:
            try:
                rename(d / name, d / target, fs=fs)
            except FileNotFoundError:
                if not (d / target).exists():  # someone else won this ticket
                    continue
        fsync_dir(d, fs)
        tables.append(table)
        claimed_rows += table.num_rows
    return pa.concat_tables(tables) if tables else PENDING.empty_table()


def load_claimed(run_dir: str | Path, iteration: int, rank: int, fs: FileSystem | None = None) -> pa.Table:
    """All requests ``rank`` has claimed in ``iteration`` (e.g. after a restart of that rank)."""
    d = pending_dir(run_dir, iteration)
    if not d.is_dir():
        return PENDING.empty_table()
    files = sorted(p.name for p in d.glob(f"claimed-{rank:04d}--pending-*.json"))
    tables = [_load_claimed(d, f, fs)[1] for f in files]
    return pa.concat_tables(tables) if tables else PENDING.empty_table()
