"""The one place where files on shared storage are opened, written, renamed, read and removed.

Every control file (epochs, acks, progress, status, heartbeats, lease, grants), every Arrow shard
and manifest, and the run's ``config.yaml`` go through these functions, and each primitive
operation of them first calls :meth:`FileSystem.before` with the operation and the path. The
plain :class:`FileSystem` does nothing there; one configured with a delay or faults slows or fails
operations, so a slow or failing shared file system can be emulated at this one place.

Crash-safe writes: temp file in the same directory (``.<final>.<pid>.<random>.tmp``), write,
fsync, rename (or hard link for write-once files), directory fsync. Readers only ever open final
names, so they see the old or the new complete content; a failed write (``ENOSPC``, ``EIO``)
removes its temp file and raises :class:`StorageError` naming the final path, the operation and
the errno, and leaves the final name untouched.

Fault injection (tests, drills, benchmarks), read once at process start from the environment::

    SLURM_RL_FS_FAULTS="delay_ms=30"                     every operation sleeps 30 ms first
    SLURM_RL_FS_FAULTS="eio=write:*/acks/000002/*"       os.write to matching paths fails with EIO
    SLURM_RL_FS_FAULTS="delay_ms=20;enospc=open:*.arrow*"

Faults are ``<errno name>=<op>:<fnmatch pattern>`` with op one of :data:`OPS`; patterns match the
path operated on (for writes that is the temp file ``.NAME.*.tmp`` next to the final name).
Code can also pass a ``FileSystem`` explicitly (``fs=``) instead of relying on the environment.
"""

from __future__ import annotations

import errno as errno_mod
import json
import os
import secrets
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, NoReturn

from slurm_rl.errors import SlurmRLError

FAULTS_ENV = "SLURM_RL_FS_FAULTS"
TEMP_SUFFIX = ".tmp"
OPS = ("open", "write", "fsync", "read", "rename", "link", "unlink", "stat", "mkdir")

PathLike = str | os.PathLike[str]


class StorageError(SlurmRLError, OSError):
    """A file operation on shared storage failed (ENOSPC, EIO, ...); names the file and the step.

    ``errno`` is the original one; ``filename`` the final path the caller asked for.
    """


@dataclass(frozen=True)
class Fault:
    """Fail operation ``op`` on paths matching ``pattern`` (fnmatch) with ``errno``."""

    op: str
    pattern: str
    errno: int

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"fault op {self.op!r}: allowed are {', '.join(OPS)}")


@dataclass(frozen=True)
class FileSystem:
    """The file system as this process sees it: real, optionally slowed (``delay_s`` per
    operation) or failing (``faults``). Immutable; pass one explicitly or use :data:`DEFAULT_FS`."""

    delay_s: float = 0.0
    faults: tuple[Fault, ...] = ()

    def before(self, op: str, path: PathLike) -> None:
        """Called before every primitive operation ``op`` on ``path``: sleep and/or fail."""
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        for fault in self.faults:
            if fault.op == op and fnmatchcase(os.fspath(path), fault.pattern):
                raise OSError(fault.errno, f"{os.strerror(fault.errno)} (injected by {FAULTS_ENV})", os.fspath(path))

    @classmethod
    def parse(cls, spec: str) -> "FileSystem":
        """Build from a ``SLURM_RL_FS_FAULTS`` value (see the module doc); ``ValueError`` names the bad item."""
        delay_s, faults = 0.0, []
        for item in filter(None, (part.strip() for part in spec.split(";"))):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep:
                raise ValueError(f"{FAULTS_ENV}: item {item!r} is not key=value")
            if key == "delay_ms":
                try:
                    delay_s = float(value) / 1000.0
                except ValueError:
                    raise ValueError(f"{FAULTS_ENV}: delay_ms={value!r} is not a number") from None
                if delay_s < 0:
                    raise ValueError(f"{FAULTS_ENV}: delay_ms={value!r} must be >= 0")
                continue
            code = getattr(errno_mod, key.upper(), None)
            op, colon, pattern = value.partition(":")
            if not isinstance(code, int) or not colon or not pattern:
                raise ValueError(f"{FAULTS_ENV}: item {item!r}: expected delay_ms=N or ERRNO=op:pattern "
                                 f"(e.g. eio=write:*/epochs/*)")
            faults.append(Fault(op.strip(), pattern.strip(), code))
        return cls(delay_s, tuple(faults))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "FileSystem":
        """The file system configured by ``SLURM_RL_FS_FAULTS`` (the real one when unset)."""
        return cls.parse(environ.get(FAULTS_ENV, ""))


DEFAULT_FS = FileSystem.from_env()
"""This process's file system, fixed at import (process start) from ``SLURM_RL_FS_FAULTS``."""


def _fs(fs: FileSystem | None) -> FileSystem:
    return DEFAULT_FS if fs is None else fs


def temp_path(final: Path) -> Path:
    """A unique hidden temp name next to ``final`` (same directory, hence same file system)."""
    return final.with_name(f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def _storage_error(exc: OSError, final: Path, step: str) -> OSError:
    """Name the final path and the step; keep FileNotFoundError/FileExistsError as they are."""
    if isinstance(exc, (FileNotFoundError, FileExistsError, StorageError)):
        return exc
    code = exc.errno if exc.errno is not None else errno_mod.EIO
    return StorageError(code, f"{step} failed: {exc.strerror or exc}", str(final))


def _raise(exc: OSError, final: Path, step: str) -> NoReturn:
    error = _storage_error(exc, final, step)
    if error is exc:
        raise exc
    raise error from exc


def unlink_quietly(path: PathLike, fs: FileSystem | None = None) -> None:
    """Remove ``path`` if it exists (cleanup: errors other than absence are swallowed)."""
    try:
        _fs(fs).before("unlink", path)
        os.unlink(path)
    except OSError:
        pass


def fsync_dir(directory: PathLike, fs: FileSystem | None = None) -> None:
    """fsync a directory so that a rename/link inside it is durable."""
    fs = _fs(fs)
    fs.before("open", directory)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fs.before("fsync", directory)
        os.fsync(fd)
    finally:
        os.close(fd)


class _TempWriter:
    """A write-only binary file object over a descriptor; every write goes through ``fs.before``."""

    def __init__(self, fd: int, path: Path, fs: FileSystem) -> None:
        self.fd, self.path, self.fs, self.size, self.closed = fd, path, fs, 0, False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        while view:
            self.fs.before("write", self.path)
            view = view[os.write(self.fd, view):]
        self.size += n
        return n

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


@contextmanager
def atomic_file(path: PathLike, *, durable: bool = True, exclusive: bool = False,
                fs: FileSystem | None = None) -> Iterator[_TempWriter]:
    """Write a file under a temp name and publish it at ``path`` when the block ends without error.

    The block writes to the yielded file object (``.path`` is the temp file, e.g. to hash it).
    ``durable`` fsyncs the file and the directory; ``exclusive`` publishes with ``link`` (never
    overwrites: ``FileExistsError`` naming the path). On any error the temp file is removed, the
    final name is untouched, and OS errors become :class:`StorageError` naming ``path``.
    """
    fs = _fs(fs)
    final = Path(path)
    tmp = temp_path(final)
    step = "creating temp file"
    try:
        fs.before("open", tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        _raise(exc, final, f"{step} {tmp.name}")
    published = False
    try:
        try:
            writer = _TempWriter(fd, tmp, fs)
            step = "writing"
            yield writer
            if durable:
                step = "fsync"
                fs.before("fsync", tmp)
                os.fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            step = "linking into place"
            fs.before("link", final)
            try:
                os.link(tmp, final)
            except FileExistsError:
                raise FileExistsError(errno_mod.EEXIST, "already exists; refusing to overwrite it", str(final)) from None
        else:
            step = "renaming into place"
            fs.before("rename", final)
            os.replace(tmp, final)
        published = True
        if exclusive:
            unlink_quietly(tmp, fs)
        if durable:
            step = "fsync of the directory"
            fsync_dir(final.parent, fs)
    except OSError as exc:
        if not published:
            unlink_quietly(tmp, fs)
        _raise(exc, final, step)
    except BaseException:
        if not published:
            unlink_quietly(tmp, fs)
        raise


def atomic_write_bytes(path: PathLike, data: bytes, *, durable: bool = True, fs: FileSystem | None = None) -> None:
    """Replace ``path`` with ``data`` atomically.

    ``durable=False`` skips both fsyncs (still atomic for readers); use it for liveness files
    such as heartbeats that are rewritten every second and need no crash durability.
    """
    with atomic_file(path, durable=durable, fs=fs) as f:
        f.write(data)


def encode_json(obj: Any) -> bytes:
    """Encode a JSON document the way every file is written (one line + newline, sorted keys)."""
    return (json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n").encode()


def atomic_write_json(path: PathLike, obj: Any, *, durable: bool = True, fs: FileSystem | None = None) -> None:
    """Replace ``path`` with the JSON encoding of ``obj`` atomically."""
    atomic_write_bytes(path, encode_json(obj), durable=durable, fs=fs)


def write_json_exclusive(path: PathLike, obj: Any, *, fs: FileSystem | None = None) -> None:
    """Publish ``obj`` at ``path`` only if nothing is there yet (never overwrites).

    Written and fsynced under a temp name, then hard-linked to the final name; ``link`` fails
    atomically if the final name exists, so of two racing writers exactly one wins. The loser
    gets ``FileExistsError`` naming the path.
    """
    with atomic_file(path, durable=True, exclusive=True, fs=fs) as f:
        f.write(encode_json(obj))


def append_bytes(path: PathLike, data: bytes, *, fs: FileSystem | None = None) -> None:
    """Append ``data`` with one ``write`` on an ``O_APPEND`` descriptor (records of a JSONL log).

    A short or failed write raises :class:`StorageError` naming ``path``; a reader of the log
    skips a record without its trailing newline. If an earlier append was cut short (the file
    does not end with a newline), ``data`` starts on a new line, so the cut record never swallows
    this one.
    """
    fs = _fs(fs)
    final = Path(path)
    step = "opening for append"
    try:
        fs.before("open", final)
        fd = os.open(final, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            step = "appending"
            fs.before("write", final)
            written = os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        _raise(exc, final, step)
    if written != len(data):
        raise StorageError(errno_mod.ENOSPC, f"short append ({written} of {len(data)} bytes)", str(final))


def rename(src: PathLike, dst: PathLike, *, fs: FileSystem | None = None) -> None:
    """``os.rename`` through the file system (e.g. claiming a ticket); ``FileNotFoundError`` if
    ``src`` is gone, other errors :class:`StorageError` naming ``dst``."""
    try:
        _fs(fs).before("rename", dst)
        os.rename(src, dst)
    except OSError as exc:
        _raise(exc, Path(dst), f"renaming {os.fspath(src)} to it")


def replace_symlink(link: PathLike, target: PathLike, *, fs: FileSystem | None = None) -> None:
    """Point symlink ``link`` at ``target`` atomically: a symlink under a :func:`temp_path` name
    (so :func:`remove_stale_temp_files` finds one a killed writer left), renamed over ``link``."""
    final = Path(link)
    tmp = temp_path(final)
    fs = _fs(fs)
    try:
        fs.before("open", tmp)
        os.symlink(target, tmp)
        fs.before("rename", final)
        os.replace(tmp, final)
    except OSError as exc:
        unlink_quietly(tmp, fs)
        _raise(exc, final, "replacing symlink")


def open_read(path: PathLike, *, nofollow: bool = False, fs: FileSystem | None = None) -> int:
    """Open ``path`` read-only and return the descriptor (``nofollow``: refuse a symlink).

    ``FileNotFoundError`` if absent; other errors become :class:`StorageError` naming the path.
    """
    fs = _fs(fs)
    flags = os.O_RDONLY | (os.O_NOFOLLOW if nofollow else 0)
    try:
        fs.before("open", path)
        return os.open(path, flags)
    except OSError as exc:
        if nofollow and exc.errno == errno_mod.ELOOP:
            raise StorageError(exc.errno, "is a symbolic link; refusing to follow it", os.fspath(path)) from exc
        _raise(exc, Path(path), "opening")


def read_bytes_once(path: PathLike, *, fs: FileSystem | None = None) -> bytes:
    """Read a whole file with exactly one path lookup (``open``); the rest uses the descriptor.

    ``FileNotFoundError`` if absent; read errors become :class:`StorageError` naming the path.
    """
    fs = _fs(fs)
    fd = open_read(path, fs=fs)
    try:
        chunks = []
        fs.before("read", path)
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError as exc:
        _raise(exc, Path(path), "reading")
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_jsonl(path: PathLike, *, fs: FileSystem | None = None) -> list[dict[str, Any]]:
    """The complete JSON-object records of an append-only log (:func:`append_bytes`), oldest
    first; a last record without its newline (cut short) and damaged lines are skipped; empty
    when the file is absent."""
    try:
        data = read_bytes_once(path, fs=fs)
    except FileNotFoundError:
        return []
    out = []
    for line in data.split(b"\n")[:-1]:  # the last piece is empty or an unfinished record
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def stat(path: PathLike, *, fs: FileSystem | None = None) -> os.stat_result:
    """``os.stat`` through the file system (``FileNotFoundError`` if absent)."""
    _fs(fs).before("stat", path)
    return os.stat(path)


def stat_key(path: PathLike, fs: FileSystem | None = None) -> tuple[int, int, int] | None:
    """A cheap change marker of a file (mtime, size, inode), or None when it does not exist.

    Three separate numbers: an atomic rewrite within one coarse mtime tick whose size is one
    byte shorter on the next inode (``"complete": false`` -> ``true``) must still count as a change."""
    try:
        s = stat(path, fs=fs)
    except FileNotFoundError:
        return None
    return (s.st_mtime_ns, s.st_size, s.st_ino)


def makedirs_private(path: PathLike, *, fs: FileSystem | None = None) -> None:
    """Create ``path`` and its missing parents, each with mode 0700 (existing ones are left alone)."""
    fs = _fs(fs)
    missing = []
    p = Path(path)
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            fs.before("mkdir", d)
            d.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            _raise(exc, d, "creating directory")


def remove_temp_files_of(root: PathLike, pids: Collection[int] | None = None) -> int:
    """Delete the temp files (``.NAME.PID.RANDOM.tmp``) under ``root``, recursively, of writers ``pids``
    (every writer when None); how many. For a launcher that has just killed those writers: a killed
    writer leaves its temp file behind, and no reader ever opens one."""
    removed = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
                continue
            parts = name[:-len(TEMP_SUFFIX)].rsplit(".", 2)
            if len(parts) != 3 or not parts[1].isdigit() or (pids is not None and int(parts[1]) not in pids):
                continue
            try:
                os.unlink(os.path.join(dirpath, name))
                removed += 1
            except FileNotFoundError:
                continue
    return removed


def remove_stale_temp_files(directory: PathLike, older_than_s: float, now: float | None = None, *,
                            prefix: str = "", fs: FileSystem | None = None) -> int:
    """Delete temp files (``.NAME.*.tmp``) left in ``directory`` by killed writers; how many.

    ``prefix`` restricts to temp files of final names starting with it (e.g. one producer's
    shards). Lists the directory: call it at startup or rarely, never in a polling loop.
    """
    now = time.time() if now is None else now
    removed = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if not (entry.name.startswith("." + prefix) and entry.name.endswith(TEMP_SUFFIX)):
                continue
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime > older_than_s:
                    _fs(fs).before("unlink", entry.path)
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                continue
    return removed

