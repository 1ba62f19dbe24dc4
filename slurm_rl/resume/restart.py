"""Prepare a RUN_DIR for a new incarnation of its run (``slurm-rl run --resume``, a requeued job).

The run goes on from its newest valid checkpoint (iteration ``k``; none: from the start):

- whatever the interrupted incarnation left of iterations ``>= k`` is removed (data-plane
  directories, metrics rows, progress and heartbeat files, the stop request, checkpoint staging),
  so iteration ``k`` is re-run from its start: no sample is lost or counted twice;
- the epoch log is kept (it is the run's history); ``control/resume.json`` records the
  iteration, the checkpoint and the last epoch of the old incarnation: the new coordinator
  publishes the config's placement as the next epoch and the ranks start after that epoch;
- the coordinator status says ``resuming`` with iteration ``k - 1`` released.

Overrides may change how the run executes (placement, hence the actor's DP size, timeouts,
iterations); what would change its results (model, seed, batch sizes, algorithm, data, reward) is
refused with exit code 2.
"""

from __future__ import annotations

import os
import shutil
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import filelock

from slurm_rl.config import ActorSection, Config, ConfigError, ConfigIssue, load_config
from slurm_rl.control.atomic import atomic_write_bytes, atomic_write_json, read_json
from slurm_rl.control.epochs import EpochStore
from slurm_rl.control.errors import TornFileError
from slurm_rl.control.events import append_event
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import read_coordinator_status, write_coordinator_status
from slurm_rl.data.gc import list_iterations
from slurm_rl.data.layout import iteration_dir
from slurm_rl.fsio import replace_symlink
from slurm_rl.metrics import METRICS_FILE, read_metrics
from slurm_rl.resume.checkpoints import RunCheckpoint, latest_valid, remove_staging
from slurm_rl.resume.replay import restore_replay
from slurm_rl.resume.stop import clear_stop

RESUME_FILE = "resume.json"
# Sections and keys a resumed run may not change: they decide what the run computes.
# How the actor is laid out and run: a resumed run may change these (the checkpoint is full state
# by parameter name, loaded at any TP, DP and ZeRO setting); every other actor key decides results.
ACTOR_LAYOUT_KEYS = ("zero1", "threads", "warm_joiners", "recompute", "tensor_parallel", "tensor_parallel_choices",
                     "pipeline_parallel")
FROZEN = ("model", "algorithm", "data", "reward", "rollout", "emulated", "runtime.seed", "runtime.device",
          *(f"actor.{f.name}" for f in dataclasses.fields(ActorSection) if f.name not in ACTOR_LAYOUT_KEYS),
          "train.rollout_batch_size", "train.group_size", "train.global_batch_size", "train.micro_batch_size",
          "train.max_tokens_per_microbatch", "train.use_remove_padding", "train.balance_batch",
          "train.minibatch_order", "scheduler.seed")


@dataclass(frozen=True)
class ResumePoint:
    """Where a new incarnation starts: read by the ranks and the coordinator."""

    iteration: int
    after_epoch: int  # the last epoch of the previous incarnation; the ranks apply epochs after it
    checkpoint: str | None  # checkpoint directory relative to RUN_DIR (None: from the start)
    incarnation: int

    def checkpoint_path(self, run_dir: Path) -> Path | None:
        return None if self.checkpoint is None else Path(run_dir) / self.checkpoint


def resume_path(run_dir: Path) -> Path:
    return Path(run_dir) / "control" / RESUME_FILE


def read_resume_point(run_dir: Path) -> ResumePoint | None:
    """The resume point of the current incarnation (None: the run's first incarnation)."""
    try:
        doc = read_json(resume_path(run_dir))
    except FileNotFoundError:
        return None
    try:
        return ResumePoint(int(doc["iteration"]), int(doc["after_epoch"]),
                           None if doc.get("checkpoint") is None else str(doc["checkpoint"]), int(doc["incarnation"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError([ConfigIssue("resume", str(resume_path(run_dir)),
                                       f"a resume point with iteration, after_epoch, incarnation ({exc!r})")]) from None


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


def _frozen_changes(old: Config, new: Config) -> list[ConfigIssue]:
    issues = []
    for key in FROZEN:
        try:
            before, after = _get(old, key), _get(new, key)
        except (AttributeError, KeyError):
            continue
        if before != after:
            issues.append(ConfigIssue(key, repr(after), f"the value the run started with ({before!r}): a resumed "
                                                        "run keeps what decides its results; start a new run instead"))
    return issues


LEASE_GRACE_S = 10.0  # a coordinator killed with its ranks lets go of the lease within this


def _check_not_running(paths: RunPaths) -> None:
    lock = filelock.FileLock(str(paths.lease_lock), timeout=LEASE_GRACE_S)
    try:
        lock.acquire(timeout=LEASE_GRACE_S)
    except filelock.Timeout:
        raise ConfigError([ConfigIssue("--resume", str(paths.run_dir), "a run dir whose coordinator is not running "
                                       f"(the lease {paths.lease_lock} is still held after {LEASE_GRACE_S:.0f}s)")]) from None
    lock.release()


def _truncate_metrics(run_dir: Path, iteration: int) -> int:
    rows = [r for r in read_metrics(run_dir) if int(r.get("iteration", -1)) < iteration]
    path = run_dir / METRICS_FILE
    if path.exists():
        import json

        atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in rows).encode())
    return len(rows)


def _clear_dir(directory: Path) -> None:
    if directory.is_dir():
        for entry in directory.iterdir():
            if entry.is_file():
                entry.unlink()


def prepare_resume(run_dir: str | Path, overrides: Sequence[str] = (),
                   log: Callable[[str], None] = lambda m: None) -> tuple[Config, Path, ResumePoint]:
    """Make ``run_dir`` ready for a new incarnation; returns its config, path and resume point.
    Raises :class:`ConfigError` (exit 2, nothing changed) for a bad run dir or override."""
    root = Path(run_dir).absolute()
    if not (root / "config.yaml").is_file():
        raise ConfigError([ConfigIssue("--resume", str(root), "a run dir holding config.yaml (made by a run)")])
    paths = RunPaths(root)
    _check_not_running(paths)
    old = load_config(root / "config.yaml", [f"runtime.run_dir={root}"])
    cfg = load_config(root / "config.yaml", [*overrides, f"runtime.run_dir={root}"])
    issues = _frozen_changes(old, cfg)
    if issues:
        raise ConfigError(issues)
    checkpoint: RunCheckpoint | None = latest_valid(root, log=log)
    k = checkpoint.iteration if checkpoint is not None else 0
    previous = read_resume_point(root)
    try:
        status = read_coordinator_status(paths)
    except TornFileError:  # a coordinator killed mid-write of a non-atomic copy: nothing to keep from it
        status = None
    previous_state = status.state if status is not None else None
    latest = EpochStore(paths).latest()
    # Nothing of iterations >= k survives: they are re-run from their start.
    for it in list_iterations(root):
        if it >= k:
            shutil.rmtree(iteration_dir(root, it), ignore_errors=True)
    # ... but the samples an asynchronous run drew ahead of the checkpoint's gate (its replay buffer)
    replayed = restore_replay(checkpoint.path, root) if checkpoint is not None else []
    rows = _truncate_metrics(root, k)
    for directory in (paths.progress_dir, paths.heartbeats_dir):
        _clear_dir(directory)
    clear_stop(root)
    remove_staging(root)
    shutil.rmtree(root / "checkpoints" / "final", ignore_errors=True)
    if overrides:
        atomic_write_bytes(root / "config.yaml", cfg.to_yaml().encode())
    point = ResumePoint(iteration=k, after_epoch=latest.epoch if latest is not None else -1,
                        checkpoint=None if checkpoint is None else os.path.relpath(checkpoint.path, root),
                        incarnation=(previous.incarnation if previous else 0) + 1)
    atomic_write_json(resume_path(root), {**point.__dict__, "resumed_at": time.time(),
                                          "previous_state": previous_state, "overrides": list(overrides)})
    write_coordinator_status(paths, {"state": "resuming", "released_iteration": k - 1, "released_epoch": None,
                                     "generation": status.generation if status is not None else 0, "time": time.time()})
    append_event(paths, "resumed", {"iteration": k, "checkpoint": point.checkpoint, "incarnation": point.incarnation,
                                    "previous_state": previous_state, "metrics_rows": rows,
                                    "overrides": list(overrides), "replayed_iterations": replayed})
    log(f"resuming {root} at iteration {k} (" + (f"checkpoint {point.checkpoint}" if checkpoint else "no checkpoint: "
                                                  "from the start") + f", incarnation {point.incarnation})")
    return cfg, root, point


JOBS_DIR = ".jobs"  # <runs parent>/.jobs/<job id> -> the run dir a Slurm job created


def job_link(runs_parent: Path, job_id: str) -> Path:
    return Path(runs_parent) / JOBS_DIR / job_id


def record_job(run_dir: Path, job_id: str) -> None:
    """Remember which run dir Slurm job ``job_id`` created (found again when it is requeued)."""
    link = job_link(run_dir.parent, job_id)
    link.parent.mkdir(mode=0o700, exist_ok=True)
    replace_symlink(link, run_dir)


def previous_incarnation(config_path: str | Path, overrides: Sequence[str], env: dict[str, str]) -> Path | None:
    """The run dir of this Slurm job's previous incarnation when the job was requeued
    (``SLURM_RESTART_COUNT`` > 0): the one recorded for ``SLURM_JOB_ID``, else an explicit
    ``runtime.run_dir`` that already holds a run. None for a first start."""
    if int(env.get("SLURM_RESTART_COUNT", "0") or 0) <= 0 or not env.get("SLURM_JOB_ID"):
        return None
    cfg = load_config(config_path, overrides, env=env)
    wanted = Path(cfg.runtime.run_dir).absolute()
    link = job_link(wanted.parent, env["SLURM_JOB_ID"])
    if link.is_symlink() and (link.resolve() / "config.yaml").is_file():
        return link.resolve()
    if (wanted / "config.yaml").is_file():
        return wanted
    return None
