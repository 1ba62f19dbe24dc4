"""Paths under ``RUN_DIR/data`` and validation of every name read back from files.

Layout::

    RUN_DIR/data/iter-000012/<stage>/shard-0003-000004.arrow   (producer rank 3, 5th shard)
    RUN_DIR/data/iter-000012/<stage>/manifest-0003.json        (one per producer rank)
    RUN_DIR/data/iter-000012/<stage>/expected.json             (optional: expected producer ranks)
    RUN_DIR/data/iter-000012/pending/pending-0003-000007-000.{arrow,json}   (migrated requests)
"""

from __future__ import annotations

import re
from pathlib import Path

from slurm_rl.data.errors import DataPlaneError, InvalidManifestError

DATA_DIRNAME = "data"
PENDING_STAGE = "pending"
_STAGE_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_ITER_RE = re.compile(r"^iter-(\d{6,})$")
SHARD_RE = re.compile(r"^shard-(\d{4,})-(\d{6,})\.arrow$")
PENDING_ARROW_RE = re.compile(r"^pending-(\d{4,})-(\d{6,})-(\d{3,})\.arrow$")


def validate_stage(stage: str) -> str:
    """Return ``stage`` if it is a safe stage name (lowercase, digits, underscore)."""
    if not isinstance(stage, str) or not _STAGE_RE.match(stage):
        raise DataPlaneError(f"invalid stage name {stage!r}: expected [a-z][a-z0-9_]*")
    return stage


def _check_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataPlaneError(f"{name} must be a non-negative int, got {value!r}")
    return value


def data_root(run_dir: str | Path) -> Path:
    """``RUN_DIR/data``."""
    return Path(run_dir) / DATA_DIRNAME


def iteration_dir(run_dir: str | Path, iteration: int) -> Path:
    """``RUN_DIR/data/iter-XXXXXX``."""
    return data_root(run_dir) / f"iter-{_check_int('iteration', iteration):06d}"


def parse_iteration_dirname(name: str) -> int | None:
    """Iteration number of an ``iter-XXXXXX`` directory name, else None."""
    m = _ITER_RE.match(name)
    return int(m.group(1)) if m else None


def stage_dir(run_dir: str | Path, iteration: int, stage: str) -> Path:
    """``RUN_DIR/data/iter-XXXXXX/<stage>``."""
    return iteration_dir(run_dir, iteration) / validate_stage(stage)


def manifest_path(run_dir: str | Path, iteration: int, stage: str, producer_rank: int) -> Path:
    """Per-producer manifest path of a stage."""
    return stage_dir(run_dir, iteration, stage) / f"manifest-{_check_int('producer_rank', producer_rank):04d}.json"


def expected_path(run_dir: str | Path, iteration: int, stage: str) -> Path:
    """Stage-level file listing the producer ranks a consumer must wait for."""
    return stage_dir(run_dir, iteration, stage) / "expected.json"


def shard_name(producer_rank: int, seq: int) -> str:
    """File name of shard ``seq`` of ``producer_rank``."""
    return f"shard-{_check_int('producer_rank', producer_rank):04d}-{_check_int('seq', seq):06d}.arrow"


def validate_shard_name(name: object, producer_rank: int, where: str | Path) -> str:
    """Check a shard name read from a manifest: a bare ``shard-RRRR-SSSSSS.arrow`` of this producer."""
    if not isinstance(name, str) or "/" in name or "\\" in name or ".." in name or name.startswith("."):
        raise InvalidManifestError(f"{where}: refusing shard name {name!r} (path components not allowed)")
    m = SHARD_RE.match(name)
    if m is None:
        raise InvalidManifestError(f"{where}: shard name {name!r} does not match shard-RRRR-SSSSSS.arrow")
    if int(m.group(1)) != producer_rank:
        raise InvalidManifestError(f"{where}: shard {name!r} does not belong to producer rank {producer_rank}")
    return name


def validate_pending_name(name: object, where: str | Path) -> str:
    """Check a pending-request file name read from a ticket."""
    if not isinstance(name, str) or "/" in name or "\\" in name or ".." in name or not PENDING_ARROW_RE.match(name):
        raise InvalidManifestError(f"{where}: refusing pending file name {name!r}")
    return name
