"""Crash-safe writes of small files: temp file, fsync, rename (or link), directory fsync.

Readers only ever open final names, so they see either the old or the new complete content.
Temp files are named ``.<final>.<pid>.<random>.tmp`` in the same directory; a writer killed
mid-way leaves such a file behind, which readers never open (see :func:`remove_stale_temp_files`).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from slurm_rl.control.errors import TornFileError

TEMP_SUFFIX = ".tmp"


def _temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that a rename/link inside it is durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(path: Path, data: bytes, durable: bool) -> Path:
    tmp = _temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    return tmp


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically.

    ``durable=False`` skips both fsyncs (still atomic for readers); use it for liveness files
    such as heartbeats that are rewritten every second and need no crash durability.
    """
    final = Path(path)
    tmp = _write_temp(final, data, durable)
    try:
        os.replace(tmp, final)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        fsync_dir(final.parent)


def encode_json(obj: Any) -> bytes:
    """Encode a JSON document the way every control file is written (one line + newline)."""
    return (json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n").encode()


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, durable: bool = True) -> None:
    """Replace ``path`` with the JSON encoding of ``obj`` atomically."""
    atomic_write_bytes(path, encode_json(obj), durable=durable)


def write_json_exclusive(path: str | os.PathLike[str], obj: Any) -> None:
    """Publish ``obj`` at ``path`` only if nothing is there yet (never overwrites).

    The content is written and fsynced under a temp name, then hard-linked to the final name;
    ``link`` fails atomically if the final name exists, so of two racing writers exactly one
    wins. The loser gets ``FileExistsError`` naming the path.
    """
    final = Path(path)
    tmp = _write_temp(final, encode_json(obj), durable=True)
    try:
        os.link(tmp, final)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "already exists; refusing to overwrite it", str(final)) from None
    finally:
        _unlink_quietly(tmp)
    fsync_dir(final.parent)


def parse_json(data: bytes, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a control-file document, raising :class:`TornFileError` naming ``path``."""
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TornFileError(f"{path}: not a complete JSON document ({len(data)} bytes): {exc}") from None
    if not isinstance(doc, dict):
        raise TornFileError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def read_bytes_once(path: str | os.PathLike[str]) -> bytes:
    """Read a whole file with exactly one path lookup (``open``); the rest uses the descriptor.

    Raises ``FileNotFoundError`` if absent.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a JSON object from ``path``; ``FileNotFoundError`` if absent, :class:`TornFileError` if bad."""
    return parse_json(read_bytes_once(path), path)


def remove_stale_temp_files(directory: str | os.PathLike[str], older_than_s: float, now: float | None = None) -> int:
    """Delete temp files left in ``directory`` by killed writers; returns how many were removed.

    Lists the directory: call it at startup or rarely, never in a polling loop.
    """
    now = time.time() if now is None else now
    removed = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if not (entry.name.startswith(".") and entry.name.endswith(TEMP_SUFFIX)):
                continue
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime > older_than_s:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                continue
    return removed
