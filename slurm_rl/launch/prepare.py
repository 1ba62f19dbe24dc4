"""Prepare a run directory before anything is launched: validate, create RUN_DIR 0700, write config.

Every launch path (local, sbatch, submitit) calls this once, on the submitting side, so a bad
config fails with exit code 2 before any rank or GPU is touched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from slurm_rl.config import Config, load_config
from slurm_rl.control.paths import RunPaths


def prepare_run(
    config_path: str | Path, overrides: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> tuple[Config, Path]:
    """Load and validate the config, create the run dir, write ``RUN_DIR/config.yaml`` (resolved).

    Raises ``ConfigError`` (nothing created) on a bad config.
    """
    cfg = load_config(config_path, overrides, env=env)
    run_dir = Path(cfg.runtime.run_dir).absolute()
    if (run_dir / "control" / "epochs").is_dir() and any((run_dir / "control" / "epochs").iterdir()):
        raise FileExistsError(f"run dir {run_dir} already holds a run (control/epochs is not empty); pick another runtime.run_dir")
    paths = RunPaths(run_dir).ensure()
    (run_dir / "logs").mkdir(mode=0o700, exist_ok=True)
    text = cfg.to_yaml()
    tmp = run_dir / ".config.yaml.tmp"
    tmp.write_text(text)
    os.replace(tmp, run_dir / "config.yaml")
    _point_latest(run_dir)
    return cfg, paths.run_dir


def _point_latest(run_dir: Path) -> None:
    """Keep ``<parent>/latest`` pointing at the newest run dir (a convenience for inspection)."""
    link = run_dir.parent / "latest"
    try:
        tmp = run_dir.parent / f".latest.{os.getpid()}"
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(run_dir.name)
        os.replace(tmp, link)
    except OSError:
        pass
