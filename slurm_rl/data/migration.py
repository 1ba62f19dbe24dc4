"""Unfinished rollout requests handed from a released rollout rank to the remaining ones.

A released rank calls :func:`write_pending`: its requests (prompt, partial response, partial
logprobs, sampling state) go to ``iter-XXXXXX/pending/pending-FFFF-TTTTTT-CCC.arrow`` plus a JSON
ticket ``...json`` (rows, bytes, xxh3_64, sample ids) created exclusively after the Arrow file is
durable. A remaining rank claims a ticket by renaming it to ``claimed-RRRR--<ticket>``: rename is
atomic, so exactly one claimer wins each ticket and no request is taken twice or lost.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from slurm_rl.data._fsio import exclusive_write_json, fsync_dir, makedirs_private, read_json
from slurm_rl.data.errors import DataPlaneError, InvalidManifestError
from slurm_rl.data.layout import PENDING_STAGE, iteration_dir, validate_pending_name
from slurm_rl.data.schemas import PENDING, conform
from slurm_rl.data.shardio import open_shard, write_shard

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
    makedirs_private(d)
    chunks = max(1, min(num_chunks, n))
    bounds = np.linspace(0, n, chunks + 1).astype(int)
    out = []
    for c in range(chunks):
        part = table.slice(bounds[c], bounds[c + 1] - bounds[c])
        stem = f"pending-{from_rank:04d}-{tag:06d}-{c:03d}"
        arrow, ticket = f"{stem}.arrow", f"{stem}.json"
        if (d / ticket).exists() or any(d.glob(f"claimed-*--{ticket}")):
            raise DataPlaneError(f"{d / ticket}: pending ticket already exists (rank {from_rank}, tag {tag})")
        nbytes, digest = write_shard(d / arrow, part, fsync=fsync)
        sample_ids = [int(x) for x in part.column("sample_id").to_numpy()]
        info = PendingTicket(ticket, arrow, from_rank, part.num_rows, nbytes, digest, sample_ids)
        try:
            exclusive_write_json(
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
            )
        except FileExistsError:
            raise DataPlaneError(f"{d / ticket}: pending ticket already exists (rank {from_rank}, tag {tag})") from None
        out.append(info)
    return out


def _parse_ticket(path: Path, ticket: str) -> PendingTicket:
    obj = read_json(path)
    if not isinstance(obj, dict) or obj.get("format") != TICKET_FORMAT:
        raise InvalidManifestError(f"{path}: not a {TICKET_FORMAT} ticket")
    try:
        arrow = validate_pending_name(obj["arrow"], path)
        ids = obj["sample_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise InvalidManifestError(f"{path}: sample_ids must be a list of ints")
        return PendingTicket(ticket, arrow, int(obj["from_rank"]), int(obj["rows"]), int(obj["bytes"]), str(obj["xxh3_64"]), ids)
    except KeyError as e:
        raise InvalidManifestError(f"{path}: ticket lacks key {e}") from None


def list_pending(run_dir: str | Path, iteration: int) -> list[str]:
    """Names of unclaimed tickets (sorted). Lists one directory: call at epoch changes, not in hot loops."""
    d = pending_dir(run_dir, iteration)
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.glob("pending-*.json"))


def _load_claimed(d: Path, ticket_file: str) -> tuple[PendingTicket, pa.Table]:
    ticket = ticket_file.split("--", 1)[1]
    info = _parse_ticket(d / ticket_file, ticket)
    table = open_shard(d / info.arrow, nbytes=info.bytes, digest=info.xxh3_64, schema=PENDING)
    got = table.column("sample_id").to_pylist()
    if got != info.sample_ids:
        raise DataPlaneError(f"{d / info.arrow}: sample ids differ from ticket {d / ticket_file}")
    return info, table


def claim_pending(
    run_dir: str | Path,
    iteration: int,
    rank: int,
    *,
    max_rows: int | None = None,
    from_ranks: Sequence[int] | None = None,
) -> pa.Table:
    """Claim unclaimed pending tickets for ``rank`` and return their requests (PENDING schema).

    Claims whole tickets until at least ``max_rows`` rows are claimed (all if None), optionally
    only those written by ``from_ranks``. Each ticket goes to exactly one caller, across
    processes and hosts sharing RUN_DIR. Returns an empty table when nothing is left.
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
            os.rename(d / name, d / target)
        except FileNotFoundError:
            if not (d / target).exists():  # someone else won this ticket
                continue
        fsync_dir(d)
        _, table = _load_claimed(d, target)
        tables.append(table)
        claimed_rows += table.num_rows
    return pa.concat_tables(tables) if tables else PENDING.empty_table()


def load_claimed(run_dir: str | Path, iteration: int, rank: int) -> pa.Table:
    """All requests ``rank`` has claimed in ``iteration`` (e.g. after a restart of that rank)."""
    d = pending_dir(run_dir, iteration)
    if not d.is_dir():
        return PENDING.empty_table()
    files = sorted(p.name for p in d.glob(f"claimed-{rank:04d}--pending-*.json"))
    tables = [_load_claimed(d, f)[1] for f in files]
    return pa.concat_tables(tables) if tables else PENDING.empty_table()
