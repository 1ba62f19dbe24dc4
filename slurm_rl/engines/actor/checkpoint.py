"""Actor checkpoints: safetensors of plain tensors plus JSON metadata, any DP size on resume.

Layout of a checkpoint directory::

    meta.json               step, LR-schedule position (consumed samples), RNG, data state,
                            model config, DP size and ZeRO setting at save
    model.safetensors       parameters by megatron name
    optimizer.safetensors   exp_avg/<name>, exp_avg_sq/<name> (full, unsharded)

The directory is written under a temporary name and renamed into place, so a reader never sees
a partial checkpoint. Nothing is unpickled on load.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch.distributed as dist

from slurm_rl.fsio import atomic_write_bytes, fsync_dir, rename

from .trainer import ActorTrainer

FORMAT = "slurm_rl.actor/1"


def save_checkpoint(trainer: ActorTrainer, path: str | os.PathLike[str]) -> Path | None:
    """Save the actor (collective over its ranks); its first rank writes ``path``.

    Returns the path on the writing rank, None on the others, once the checkpoint is in place
    (all DP ranks return after the rename). Refuses to overwrite.
    """
    target = Path(path)
    state = trainer.state_dict()
    # The actor's first rank gathers the full state (TP shards, ZeRO-1 slices) and writes it.
    written = _write(state, target) if state is not None else None
    if len(trainer.ranks) > 1:  # bounded by the group's timeout
        dist.barrier(group=trainer.group_cache.get(trainer.ranks, "actor checkpoint"))
    return written


def _write(state: dict, target: Path) -> Path:
    from safetensors.torch import save_file

    if target.exists():
        raise FileExistsError(f"checkpoint {target} already exists")
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state["model"].items()},
              str(tmp / "model.safetensors"))
    save_file({k: v.contiguous() for k, v in state["optimizer"].items()},
              str(tmp / "optimizer.safetensors"))
    meta = {"format": FORMAT, "world_rank": dist.get_rank(), **state["meta"]}
    atomic_write_bytes(tmp / "meta.json", json.dumps(meta, indent=1).encode())
    rename(tmp, target)
    fsync_dir(target.parent)
    return target


def read_meta(path: str | os.PathLike[str]) -> dict:
    """The JSON metadata of a checkpoint."""
    with open(Path(path) / "meta.json") as f:
        meta = json.load(f)
    if meta.get("format") != FORMAT:
        raise ValueError(f"checkpoint {path}: format {meta.get('format')!r}, expected {FORMAT}")
    return meta


def load_checkpoint(trainer: ActorTrainer, path: str | os.PathLike[str]) -> dict:
    """Load a checkpoint into an active trainer of any DP size; returns its metadata.

    Every actor rank reads the files and keeps its own slice of the optimizer state.
    """
    from safetensors.torch import load_file

    meta = read_meta(path)
    if meta.get("model") != trainer.model_cfg.to_dict():
        raise ValueError(f"checkpoint {path}: model config {meta.get('model')} differs from "
                         f"the trainer's {trainer.model_cfg.to_dict()}")
    state = {"model": load_file(str(Path(path) / "model.safetensors")),
             "optimizer": load_file(str(Path(path) / "optimizer.safetensors")), "meta": meta}
    trainer.load_state_dict(state)
    return meta
