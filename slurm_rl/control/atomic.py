"""Crash-safe control-file I/O: the writes of :mod:`slurm_rl.fsio` plus JSON parsing that names the file.

Every write here goes through :mod:`slurm_rl.fsio` (temp file, fsync, rename or link, directory
fsync), the one place files on shared storage are written; these names are kept for callers.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, TypeVar

from slurm_rl.control.errors import TornFileError
from slurm_rl.fsio import (TEMP_SUFFIX, FileSystem, StorageError, atomic_write_bytes, atomic_write_json,
                           encode_json, fsync_dir, read_bytes_once, remove_stale_temp_files, write_json_exclusive)

__all__ = [
    "TEMP_SUFFIX", "FileSystem", "JsonCache", "StorageError", "atomic_write_bytes", "atomic_write_json", "encode_json",
    "fsync_dir", "parse_json", "read_bytes_once", "read_json", "remove_stale_temp_files", "write_json_exclusive",
]


def parse_json(data: bytes, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a control-file document, raising :class:`TornFileError` naming ``path``."""
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TornFileError(f"{path}: not a complete JSON document ({len(data)} bytes): {exc}") from None
    if not isinstance(doc, dict):
        raise TornFileError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def read_json(path: str | os.PathLike[str], *, fs: FileSystem | None = None) -> dict[str, Any]:
    """Read a JSON object from ``path``; ``FileNotFoundError`` if absent, :class:`TornFileError` if bad."""
    return parse_json(read_bytes_once(path, fs=fs), path)


T = TypeVar("T")


class JsonCache:
    """Repeated reads of control files that a loop polls (rank progress, group members): a file
    whose bytes equal those of its previous read gives back the previous result, not parsed and
    checked again. Comparing bytes, not a stat key, keeps it exact where modification times are
    coarse. One cache per polling reader; a cached value is shared between reads, so callers do
    not mutate it."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[bytes, Any]] = {}

    def read(self, path: str | os.PathLike[str], check: Callable[[dict[str, Any]], T], *,
             fs: FileSystem | None = None) -> T:
        """``check(document)`` of the JSON object at ``path`` (``FileNotFoundError`` if absent,
        :class:`TornFileError` if not a document)."""
        key = os.fspath(path)
        try:
            data = read_bytes_once(key, fs=fs)
        except FileNotFoundError:
            self._last.pop(key, None)
            raise
        last = self._last.get(key)
        if last is None or last[0] != data:
            last = (data, check(parse_json(data, key)))
            self._last[key] = last
        return last[1]
