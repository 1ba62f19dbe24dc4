"""Write one Arrow IPC shard durably; open one zero-copy after verifying size and xxh3_64."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from slurm_rl.data._fsio import fsync_dir, tmp_name
from slurm_rl.data.errors import CorruptShardError
from slurm_rl.data.schemas import check_schema, token_columns


_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14


def map_file(path: Path, *, populate: bool) -> pa.Buffer:
    """Read-only memory map of a whole file as a zero-copy ``pa.Buffer``.

    ``populate`` pre-faults the pages with one ``madvise`` (much cheaper than one page fault per
    4 KiB when the whole file is about to be hashed anyway). Raises FileNotFoundError.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return pa.py_buffer(b"")
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    if populate:
        try:
            mm.madvise(_MADV_POPULATE_READ)
        except OSError:  # older kernel: fall back to read-ahead hint
            mm.madvise(mmap.MADV_WILLNEED)
    return pa.py_buffer(mm)


def digest_buffer(buf: pa.Buffer | memoryview | bytes) -> str:
    """xxh3_64 hex digest of a buffer (the hash runs over the memory map, no copy)."""
    return xxhash.xxh3_64_hexdigest(buf)


def file_digest(path: Path) -> tuple[int, str]:
    """``(size, xxh3_64 hex)`` of a file, hashed over a memory map."""
    buf = map_file(path, populate=True)
    return buf.size, digest_buffer(buf)


def row_tokens(table: pa.Table, columns: list[str] | None = None) -> np.ndarray:
    """Per-row token counts (sum of list lengths of the token columns), int64."""
    cols = token_columns(table.schema) if columns is None else columns
    total = np.zeros(table.num_rows, dtype=np.int64)
    for c in cols:
        lengths = pc.fill_null(pc.list_value_length(table.column(c)), 0)
        total += lengths.to_numpy().astype(np.int64, copy=False)
    return total


def count_tokens(table: pa.Table, columns: list[str] | None = None) -> int:
    """Total tokens of the token columns of ``table``."""
    cols = token_columns(table.schema) if columns is None else columns
    n = 0
    for c in cols:
        for chunk in table.column(c).chunks:
            if len(chunk):
                offsets = chunk.offsets
                n += int(offsets[len(chunk)].as_py()) - int(offsets[0].as_py())
    return n


def write_shard(final: Path, table: pa.Table, *, fsync: bool = True) -> tuple[int, str]:
    """Write ``table`` to ``final`` via a temp name + fsync + rename + dir fsync.

    Returns ``(bytes, xxh3_64 hex)`` of the published file. A crash leaves only a hidden
    ``.tmp-*`` file, never a partial file under the final name.
    """
    tmp = tmp_name(final)
    try:
        with pa.OSFile(str(tmp), "wb") as sink:
            with pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        os.chmod(tmp, 0o600)
        size, digest = file_digest(tmp)
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(final.parent)
    return size, digest


def open_shard(
    path: Path,
    *,
    nbytes: int,
    digest: str | None,
    schema: pa.Schema | None = None,
) -> pa.Table:
    """Memory-map ``path``, check size and checksum, and return a zero-copy table.

    ``digest=None`` skips the checksum (only for benchmarks). Raises CorruptShardError (naming
    the path) for a missing, truncated or modified shard; DataPlaneError for a schema mismatch.
    """
    try:
        buf = map_file(path, populate=digest is not None)
    except FileNotFoundError:
        raise CorruptShardError(str(path), "listed in the manifest but missing") from None
    if buf.size != nbytes:
        raise CorruptShardError(str(path), f"size {buf.size} bytes, manifest says {nbytes} (truncated or overwritten)")
    if digest is not None:
        actual = digest_buffer(buf)
        if actual != digest:
            raise CorruptShardError(str(path), f"xxh3_64 {actual} != manifest {digest}")
    try:
        table = pa.ipc.open_file(pa.BufferReader(buf)).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise CorruptShardError(str(path), f"not a readable Arrow IPC file: {e}") from e
    check_schema(table.schema, schema, path)
    return table
