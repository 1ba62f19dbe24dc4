"""Names of every control file under RUN_DIR, and validation of paths read from files."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from slurm_rl.control.errors import UnsafePathError
from slurm_rl.fsio import DEFAULT_FS, FileSystem

RUN_DIR_MODE = 0o700


def create_run_dir(path: str | os.PathLike[str]) -> Path:
    """Create RUN_DIR (and parents) with mode 0700; an existing directory is tightened to 0700."""
    root = Path(path)
    root.mkdir(mode=RUN_DIR_MODE, parents=True, exist_ok=True)
    os.chmod(root, RUN_DIR_MODE)  # mkdir's mode is filtered by the umask
    return root


def safe_join(root: str | os.PathLike[str], rel: str) -> Path:
    """Join a relative path read from a file onto ``root``, refusing anything that could leave it.

    Rejects absolute paths, ``..`` components, empty names, NUL bytes and symlinks that resolve
    outside ``root``.
    """
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise UnsafePathError(f"path {rel!r} under {root}: must be a non-empty string without NUL bytes")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or rel.startswith("\\") or (len(rel) > 1 and rel[1] == ":"):
        raise UnsafePathError(f"path {rel!r} under {root}: absolute paths are not allowed")
    if any(part == ".." for part in pure.parts):
        raise UnsafePathError(f"path {rel!r} under {root}: '..' is not allowed")
    base = Path(root).resolve()
    joined = base.joinpath(*pure.parts)
    resolved = joined.resolve()
    if resolved != base and base not in resolved.parents:
        raise UnsafePathError(f"path {rel!r} resolves to {resolved}, outside {base}")
    return joined


@dataclass(frozen=True)
class RunPaths:
    """Every control-plane path of one run. Numbers are zero-padded: epochs 6 digits, ranks 4.

    ``fs`` is the file system every control file of the run is read and written through
    (default: :data:`slurm_rl.fsio.DEFAULT_FS`, set by ``SLURM_RL_FS_FAULTS`` at process start).
    """

    run_dir: Path
    fs: FileSystem = field(default=DEFAULT_FS, compare=False, repr=False)

    def __init__(self, run_dir: str | os.PathLike[str], fs: FileSystem | None = None) -> None:
        object.__setattr__(self, "run_dir", Path(run_dir))
        object.__setattr__(self, "fs", DEFAULT_FS if fs is None else fs)

    @property
    def control(self) -> Path:
        return self.run_dir / "control"

    @property
    def epochs_dir(self) -> Path:
        return self.control / "epochs"

    def epoch(self, epoch: int) -> Path:
        return self.epochs_dir / f"{epoch:06d}.json"

    @property
    def acks_root(self) -> Path:
        return self.control / "acks"

    def acks_dir(self, epoch: int) -> Path:
        return self.acks_root / f"{epoch:06d}"

    def ack(self, epoch: int, rank: int) -> Path:
        return self.acks_dir(epoch) / f"rank-{rank:04d}.json"

    @property
    def heartbeats_dir(self) -> Path:
        return self.control / "heartbeats"

    def heartbeat(self, rank: int) -> Path:
        return self.heartbeats_dir / f"rank-{rank:04d}.json"

    @property
    def progress_dir(self) -> Path:
        return self.control / "progress"

    def progress(self, rank: int) -> Path:
        return self.progress_dir / f"rank-{rank:04d}.json"

    @property
    def lease(self) -> Path:
        return self.control / "lease"

    @property
    def lease_lock(self) -> Path:
        return self.control / "lease.lock"

    @property
    def generations_dir(self) -> Path:
        return self.control / "generations"

    def generation_claim(self, generation: int) -> Path:
        return self.generations_dir / f"{generation:06d}.json"

    @property
    def events_dir(self) -> Path:
        return self.control / "events"

    @property
    def decisions(self) -> Path:
        return self.events_dir / "decisions.jsonl"

    @property
    def history(self) -> Path:
        """What the coordinator measured about the run (scheduler.history), rewritten at each gate."""
        return self.control / "history.json"

    def ensure(self) -> "RunPaths":
        """Create RUN_DIR (0700) and every control directory; idempotent. Returns self."""
        create_run_dir(self.run_dir)
        for directory in (self.epochs_dir, self.acks_root, self.heartbeats_dir, self.progress_dir, self.events_dir):
            directory.mkdir(mode=RUN_DIR_MODE, parents=True, exist_ok=True)
        return self
