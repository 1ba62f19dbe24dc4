"""Crash-safe control-file I/O: the writes of :mod:`slurm_rl.fsio` plus JSON parsing that names the file.

Every write here goes through :mod:`slurm_rl.fsio` (temp file, fsync, rename or link, directory
fsync), the one place files on shared storage are written; these names are kept for callers.
"""

from __future__ import annotations

import json
import os
from typing import Any

from slurm_rl.control.errors import TornFileError
from slurm_rl.fsio import (TEMP_SUFFIX, FileSystem, StorageError, atomic_write_bytes, atomic_write_json,
                           encode_json, fsync_dir, read_bytes_once, remove_stale_temp_files, write_json_exclusive)

__all__ = [
    "TEMP_SUFFIX", "FileSystem", "StorageError", "atomic_write_bytes", "atomic_write_json", "encode_json",
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
