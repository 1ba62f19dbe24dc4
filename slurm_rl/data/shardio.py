"""Write one Arrow IPC shard durably; open one zero-copy after verifying size and xxh3_64."""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from slurm_rl.fsio import FileSystem, StorageError, atomic_file, open_read
from slurm_rl.data.errors import CorruptShardError
from slurm_rl.data.schemas import check_schema, token_columns


_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14


def map_file(path: Path, *, populate: bool, fs: FileSystem | None = None) -> pa.Buffer:
    """Read-only memory map of a whole file as a zero-copy ``pa.Buffer``.

    ``populate`` pre-faults the pages with one ``madvise`` (much cheaper than one page fault per
    4 KiB when the whole file is about to be hashed anyway). Refuses a symbolic link (a shard
    is never one). Raises FileNotFoundError; other errors are ``StorageError`` naming the path.
    """
    fd = open_read(path, nofollow=True, fs=fs)
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


def file_digest(path: Path, fs: FileSystem | None = None) -> tuple[int, str]:
    """``(size, xxh3_64 hex)`` of a file, hashed over a memory map."""
    buf = map_file(path, populate=True, fs=fs)
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


def write_shard(final: Path, table: pa.Table, *, fsync: bool = True, fs: FileSystem | None = None) -> tuple[int, str]:
    """Write ``table`` to ``final`` through :func:`slurm_rl.fsio.atomic_file` (temp name, fsync,
    rename, dir fsync). Returns ``(bytes, xxh3_64 hex)`` of the published file.

    A crash or a write error (``StorageError`` naming ``final``: ENOSPC, EIO) leaves no file
    under the final name; only a crash can leave a hidden ``.shard-*.tmp`` file.
    """
    with atomic_file(final, durable=fsync, fs=fs) as sink:
        try:
            with pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        except pa.ArrowException as exc:  # an OSError raised by the sink, re-raised by Arrow
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, OSError):
                raise cause from exc
            raise StorageError(errno.EIO, f"writing Arrow IPC failed: {exc}", str(final)) from exc
        size, digest = file_digest(sink.path, fs=fs)
    return size, digest


def open_shard(
    path: Path,
    *,
    nbytes: int,
    digest: str | None,
    schema: pa.Schema | None = None,
    fs: FileSystem | None = None,
) -> pa.Table:
    """Memory-map ``path``, check size and checksum, and return a zero-copy table.

    ``digest=None`` skips the checksum (only for benchmarks). Raises CorruptShardError (naming
    the path) for a missing, truncated or modified shard; DataPlaneError for a schema mismatch.
    """
    try:
        buf = map_file(path, populate=digest is not None, fs=fs)
    except FileNotFoundError:
        raise CorruptShardError(str(path), "listed in the manifest but missing") from None
    except StorageError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptShardError(str(path), "is a symbolic link (a shard never is one)") from None
        raise
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
