"""The replay buffer of an asynchronous run's checkpoint: the samples generated ahead of the actor.

With ``algorithm.max_staleness`` >= 1 the rollout of iteration ``j`` runs in iteration ``j - 1``, with that
iteration's weights. At the gate of iteration ``N`` the samples of ``N`` therefore exist already,
drawn by weights a resumed run no longer has: the checkpoint keeps their ``rollouts`` stage (Arrow shards,
producer manifests, the expected producers) under ``replay/``, and a resume puts them back before the ranks
start, so the resumed run trains on the samples the uninterrupted one trained on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from slurm_rl.data.layout import data_root, iteration_dir, parse_iteration_dirname, stage_dir

REPLAY_DIR = "replay"
STAGE = "rollouts"  # what the rollout wrote: the actor side of a later iteration reads it from there


def save_replay(run_dir: Path, checkpoint: Path, iterations: range) -> list[int]:
    """Copy the ``rollouts`` stage of each of ``iterations`` (those present) into ``checkpoint/replay``;
    the iterations copied."""
    saved = []
    for j in iterations:
        src = stage_dir(run_dir, j, STAGE)
        if not src.is_dir():
            continue
        dst = checkpoint / REPLAY_DIR / iteration_dir(run_dir, j).name / STAGE
        if dst.exists():  # a checkpoint of this gate retried by a new coordinator generation
            shutil.rmtree(dst)
        shutil.copytree(src, dst)
        saved.append(j)
    return saved


def restore_replay(checkpoint: Path, run_dir: Path) -> list[int]:
    """Put a checkpoint's replay buffer back under ``RUN_DIR/data`` (its iterations removed before); the
    iterations restored."""
    root = checkpoint / REPLAY_DIR
    restored = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        j = parse_iteration_dirname(entry.name)
        if j is None or not (entry / STAGE).is_dir():
            continue
        dst = data_root(run_dir) / entry.name / STAGE
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(entry / STAGE, dst)
        restored.append(j)
    return restored
