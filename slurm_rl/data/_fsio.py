"""Small durable-file helpers: atomic JSON replace, exclusive create, directory fsync."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """fsync a directory so that renames/creations inside it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_name(final: Path) -> Path:
    """A unique hidden temp name next to ``final`` (same directory, hence same filesystem)."""
    return final.with_name(f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _write_tmp_json(final: Path, obj: Any) -> Path:
    tmp = tmp_name(final)
    data = json.dumps(obj, indent=1, sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def atomic_write_json(final: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``final``: temp file, fsync, rename over, fsync the directory."""
    tmp = _write_tmp_json(final, obj)
    try:
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)


def exclusive_write_json(final: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``final`` only if ``final`` does not exist (raises FileExistsError).

    Uses a hard link of a fully written temp file, so readers never see a partial file.
    """
    tmp = _write_tmp_json(final, obj)
    try:
        os.link(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(final.parent)


def read_json(path: Path) -> Any:
    """Read a JSON file (no pickle, ever)."""
    with open(path, "rb") as f:
        return json.loads(f.read())


def makedirs_private(path: Path) -> None:
    """Create ``path`` and its missing parents, each with mode 0700."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)
