"""Run checkpoints: ``RUN_DIR/checkpoints/iter-NNNNNN`` taken at the gate of iteration N.

A checkpoint at gate ``N`` holds everything a new incarnation needs to run iterations ``N..``
and produce what an uninterrupted run would: the actor (``actor/``: parameters, Adam state, step,
LR schedule position by consumed samples, RNG, data state; written by the actor's DP rank 0) and
``run.json``, the manifest: iteration, the epoch in force, the coordinator generation, the number
of metrics rows, and every file with its size and xxh3-64 digest. The data plane is not saved:
iteration ``N`` is re-run from its start (requests and sampling seeds are functions of the
seed and the iteration, so the re-run is the same run), but for the samples an asynchronous run
drew ahead of the gate with weights it no longer has (``replay/``: :mod:`slurm_rl.resume.replay`).

Atomic: the files are written into ``.iter-NNNNNN.tmp-<generation>``, fsynced, the manifest is
written last, then the directory is renamed into place and its parent fsynced. A directory
named ``iter-*`` is therefore complete; :func:`verify` still checks every size and digest so
that a checkpoint damaged later (or hand-edited) is refused with the file named, never loaded.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from slurm_rl.control.atomic import atomic_write_json, fsync_dir, read_json
from slurm_rl.control.errors import TornFileError, UnsafePathError
from slurm_rl.control.paths import safe_join
from slurm_rl.errors import InputError
from slurm_rl.faults import fault_point

FORMAT = "slurm_rl.run_checkpoint/1"
MANIFEST = "run.json"
ACTOR_DIR = "actor"
CRITIC_DIR = "critic"  # PPO's critic (algorithm.adv_estimator gae), saved beside the actor
_NAME_RE = re.compile(r"^iter-(\d{6,})$")
_STAGING_RE = re.compile(r"^\.iter-(\d{6,})\.tmp-\d+$")
_REQUIRED = {"format": str, "iteration": int, "epoch": int, "generation": int, "created_at": float,
             "metrics_rows": int, "files": dict}


class CheckpointError(InputError):
    """A checkpoint is missing, incomplete or damaged (names the directory and the file)."""


@dataclass(frozen=True)
class RunCheckpoint:
    """A verified checkpoint: its directory and manifest."""

    path: Path
    manifest: dict[str, Any]

    @property
    def iteration(self) -> int:
        return int(self.manifest["iteration"])

    @property
    def actor_dir(self) -> Path | None:
        """The actor state (None: the run has no actor state to restore, e.g. emulated)."""
        return self.path / ACTOR_DIR if any(f.startswith(ACTOR_DIR + "/") for f in self.manifest["files"]) else None


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_name(iteration: int) -> str:
    return f"iter-{iteration:06d}"


def staging_dir(run_dir: Path, iteration: int, generation: int) -> Path:
    """Where the checkpoint of gate ``iteration`` is assembled before it is renamed into place."""
    return checkpoints_dir(run_dir) / f".{checkpoint_name(iteration)}.tmp-{generation}"


def _digest(path: Path) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def finalize(staging: Path, *, iteration: int, epoch: int, generation: int, metrics_rows: int,
             extra: dict[str, Any] | None = None) -> Path:
    """Seal ``staging`` (files already written by the ranks): fsync every file, write the
    manifest with sizes and digests, rename to ``iter-NNNNNN``. Returns the final path."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in staging.rglob("*") if p.is_file()):
        rel = path.relative_to(staging).as_posix()
        if rel == MANIFEST:
            continue
        _fsync_file(path)
        files[rel] = {"bytes": path.stat().st_size, "xxh3_64": _digest(path)}
    for directory in sorted({p.parent for p in staging.rglob("*")} | {staging}):
        fsync_dir(directory)
    fault_point("checkpoint_write", iteration=iteration, generation=generation)
    manifest = {"format": FORMAT, "iteration": iteration, "epoch": epoch, "generation": generation,
                "created_at": time.time(), "metrics_rows": metrics_rows, "files": files, **(extra or {})}
    atomic_write_json(staging / MANIFEST, manifest)
    final = staging.parent / checkpoint_name(iteration)
    if final.exists():  # a coordinator killed after the rename: the same gate's checkpoint, replaced
        shutil.rmtree(final)
    os.replace(staging, final)
    fsync_dir(final.parent)
    return final


def verify(path: Path) -> RunCheckpoint:
    """Read and check a checkpoint: manifest fields, every file's size and digest, no path
    outside the directory. Raises :class:`CheckpointError` naming what is wrong."""
    try:
        manifest = read_json(path / MANIFEST)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path}: no {MANIFEST} (incomplete)") from None
    except TornFileError as exc:
        raise CheckpointError(f"checkpoint {path}: {exc}") from None
    for key, kind in _REQUIRED.items():
        value = manifest.get(key)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CheckpointError(f"checkpoint {path}/{MANIFEST}: field {key!r} is {value!r}, expected {kind.__name__}")
    if manifest["format"] != FORMAT:
        raise CheckpointError(f"checkpoint {path}/{MANIFEST}: format {manifest['format']!r}, expected {FORMAT!r}")
    match = _NAME_RE.match(path.name)
    if match is None or int(match.group(1)) != manifest["iteration"]:
        raise CheckpointError(f"checkpoint {path}: directory name does not match iteration {manifest['iteration']}")
    for rel, entry in manifest["files"].items():
        try:
            target = safe_join(path, rel)
        except UnsafePathError as exc:
            raise CheckpointError(f"checkpoint {path}/{MANIFEST}: files: {exc}") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) or not isinstance(entry.get("xxh3_64"), str):
            raise CheckpointError(f"checkpoint {path}/{MANIFEST}: files[{rel!r}] is {entry!r}, expected "
                                  "{'bytes': int, 'xxh3_64': str}")
        if not target.is_file():
            raise CheckpointError(f"checkpoint {path}: {rel} is missing")
        size = target.stat().st_size
        if size != entry["bytes"]:
            raise CheckpointError(f"checkpoint {path}: {rel} has {size} bytes, the manifest says {entry['bytes']}")
        if _digest(target) != entry["xxh3_64"]:
            raise CheckpointError(f"checkpoint {path}: {rel} does not match its xxh3_64 digest (damaged)")
    return RunCheckpoint(path, manifest)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete-looking checkpoint directories, oldest first (not verified)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME_RE.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_valid(run_dir: Path, log: Any = None) -> RunCheckpoint | None:
    """The newest checkpoint that verifies; damaged newer ones are reported through ``log``
    (a callable taking a message) and skipped."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            return verify(path)
        except CheckpointError as exc:
            if log is not None:
                log(f"skipping {exc}")
    return None


def prune(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints and any staging directory of an older
    gate; returns what was removed."""
    removed = []
    for path in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def remove_staging(run_dir: Path) -> list[Path]:
    """Remove staging directories left by a coordinator or rank killed while checkpointing."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if _STAGING_RE.match(p.name)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale
