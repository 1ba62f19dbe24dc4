"""``slurm-rl export RUN_DIR [--checkpoint final | iter-N] --to DIR``: a run's actor as a Hugging
Face directory (safetensors, ``config.json``, tokenizer files) that ``transformers`` and vLLM load.

The actor checkpoint holds megatron-named fp32 tensors (``engines.actor.checkpoint``); they are
converted tensor by tensor (``engines.convert.megatron_to_hf``) and saved in the dtype of the run's
``model.path`` checkpoint (fp32 for a random model), with its ``config.json`` and tokenizer files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from slurm_rl.errors import InputError


def actor_checkpoint_dir(run_dir: Path, checkpoint: str) -> Path:
    """The actor checkpoint directory of ``checkpoint`` (``final`` or ``iter-N``) in ``run_dir``."""
    from slurm_rl.resume.checkpoints import ACTOR_DIR, checkpoint_name, checkpoints_dir, list_checkpoints

    root = checkpoints_dir(run_dir)
    if checkpoint == "final":
        path = root / "final"
    else:
        m = re.fullmatch(r"iter-(\d+)", checkpoint)
        if not m:
            raise InputError(f"--checkpoint: got {checkpoint!r}; allowed: final or iter-N")
        path = root / checkpoint_name(int(m.group(1))) / ACTOR_DIR
    if not (path / "model.safetensors").is_file():
        have = ["final"] if (root / "final").is_dir() else []
        have += [p.name for p in list_checkpoints(run_dir)]
        raise InputError(f"--checkpoint: {checkpoint!r} has no actor weights in {path}; "
                         f"this run has: {', '.join(have) or 'no checkpoint'}")
    return path


def export_run(run_dir: str | Path, to: str | Path, checkpoint: str = "final") -> dict[str, Any]:
    """Write the actor of ``checkpoint`` as a Hugging Face directory ``to``; returns figures."""
    import time

    run_dir, out = Path(run_dir), Path(to)
    if not (run_dir / "config.yaml").is_file():
        raise InputError(f"RUN_DIR: {run_dir} holds no config.yaml (not a run directory)")
    if out.exists() and any(out.iterdir()):
        raise InputError(f"--to: {out} exists and is not empty; pick a new directory")
    source = actor_checkpoint_dir(run_dir, checkpoint)  # checked before the (seconds of) imports below
    t0 = time.perf_counter()
    from safetensors import safe_open

    from slurm_rl.config import load_config
    from slurm_rl.engines.convert import megatron_to_hf
    from slurm_rl.engines.hf_checkpoint import write_hf_dir
    from slurm_rl.rl.tokenizer import load_tokenizer
    from slurm_rl.worker.real_compute import engine_model_config

    cfg = load_config(run_dir / "config.yaml", [f"runtime.run_dir={run_dir}"])
    tok = load_tokenizer(cfg.model.path, cfg.model.tokenizer_path)
    model_cfg = engine_model_config(cfg, len(tok))
    with safe_open(str(source / "model.safetensors"), framework="pt") as f:
        named = ((name, f.get_tensor(name)) for name in f.keys())
        write_hf_dir(megatron_to_hf(named, model_cfg), model_cfg, out, config_source=cfg.model.path,
                     tokenizer_source=cfg.model.tokenizer_path or cfg.model.path)
    if cfg.model.path is None and cfg.model.tokenizer_path is None:
        tok.save_pretrained(str(out))  # the built-in character tokenizer
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    return {"checkpoint": str(source), "to": str(out), "architecture": model_cfg.architecture,
            "bytes": size, "seconds": round(time.perf_counter() - t0, 3)}
