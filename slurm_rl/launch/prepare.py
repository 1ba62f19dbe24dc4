"""Prepare a run directory before anything is launched: validate, create RUN_DIR 0700, write config.

Every launch path (local, sbatch, submitit) calls this once, on the submitting side, so a bad
config or an unsafe RUN_DIR fails with exit code 2 before any rank or GPU is touched.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Mapping, Sequence

from slurm_rl.config import Config, ConfigError, ConfigIssue, load_config
from slurm_rl.control.paths import RunPaths
from slurm_rl.fsio import atomic_write_bytes, remove_stale_temp_files, replace_symlink

RUN_DIR_KEY = "runtime.run_dir"


def emulation_notice(cfg: Config, env: Mapping[str, str]) -> str | None:
    """What a run that emulates although it holds GPUs must say first (None otherwise)."""
    from slurm_rl.devices import allocation_gpus, visible_gpus

    if cfg.runtime.device != "emulated":
        return None
    held = allocation_gpus(env) or (f"{visible_gpus(env)} visible GPUs" if visible_gpus(env) else None)
    if held is None:
        return None
    return (f"slurm_rl: EMULATING: runtime.device is emulated, so this run computes nothing on the GPUs it holds "
            f"({held}); the cost model sleeps instead. Set runtime.device: auto (or cuda) to train on them.")


def check_run_dir(run_dir: Path) -> None:
    """Refuse a RUN_DIR (or its ``control/``) that exists and is not a directory, is owned by
    another user, or is writable by everyone: ``ConfigError`` naming ``runtime.run_dir``, the path
    and what is wrong. Nothing is read from such a directory and nothing is created in it."""
    issues = []
    for path in (run_dir, run_dir / "control"):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            issues.append(ConfigIssue(RUN_DIR_KEY, str(path), "a directory (this path exists and is not one)"))
            break
        if st.st_uid != os.geteuid():
            issues.append(ConfigIssue(RUN_DIR_KEY, str(path), f"a directory owned by this user (uid {os.geteuid()}); "
                                                              f"it is owned by uid {st.st_uid}"))
        if st.st_mode & stat.S_IWOTH:
            issues.append(ConfigIssue(RUN_DIR_KEY, str(path), f"a directory not writable by everyone; its mode is "
                                                              f"{stat.S_IMODE(st.st_mode):04o} (chmod o-w, or pick "
                                                              f"another runtime.run_dir)"))
    if issues:
        raise ConfigError(issues)


def prepare_run(
    config_path: str | Path, overrides: Sequence[str] = (), env: Mapping[str, str] | None = None,
    check_allocation: bool = False,
) -> tuple[Config, Path]:
    """Load and validate the config, check and create the run dir, write ``RUN_DIR/config.yaml``.

    Raises ``ConfigError`` (nothing created) on a bad config, bad input files (``inputs``) or an unsafe RUN_DIR (owned by
    someone else, world-writable), ``FileExistsError`` if RUN_DIR already holds a run. With
    ``check_allocation`` (sbatch/train.sh, inside its job): ``InputError`` naming the sbatch flags when the
    job holds fewer GPUs than the config needs (``launch.gpu_request``).
    """
    from slurm_rl.inputs import check_inputs, time_slicing_off_because

    cfg = load_config(config_path, overrides, env=env)
    check_inputs(cfg)
    if check_allocation:
        from slurm_rl.errors import InputError
        from slurm_rl.launch.gpu_request import allocation_problem

        problem = allocation_problem(cfg, os.environ if env is None else env)
        if problem is not None:
            raise InputError(problem)
    off = time_slicing_off_because(cfg) if cfg.scheduler.policy == "plan" and cfg.scheduler.time_slicing is None else []
    if off:  # null: plan time-slices where it can; written down for the coordinator and a resume
        cfg = load_config(config_path, [*overrides, "scheduler.time_slicing=false"], env=env)
        print(f"scheduler.time_slicing: off for this run ({'; '.join(off)})", file=sys.stderr, flush=True)
    from slurm_rl.scheduler.async_plan import plan_async, plans_async

    if plans_async(cfg):  # plan chooses an async run's placement once, here; the run keeps it (static)
        bound = cfg.algorithm.max_staleness
        chosen_overrides, chosen = plan_async(cfg)
        cfg = load_config(config_path, [*overrides, *chosen_overrides], env=env)
        figures = (f"simulated from emulated.* after the first iteration: {chosen['async_s']} s/iteration "
                   f"asynchronous on its best split, {chosen['synchronous_plan_s']} s under plan synchronously")
        if chosen["max_staleness"]:
            print(f"scheduler.policy plan with algorithm.max_staleness {bound}: placement {chosen['placement']} "
                  f"kept for the run (scheduler.policy static; {figures})", file=sys.stderr, flush=True)
        else:
            print(f"scheduler.policy plan with algorithm.max_staleness {bound}: synchronous (algorithm.max_staleness "
                  f"0; {figures})", file=sys.stderr, flush=True)
    notice = emulation_notice(cfg, os.environ if env is None else env)
    if notice is not None:  # the first line of the job's log (sbatch, submit) or of `slurm-rl run`
        print(notice, file=sys.stderr, flush=True)
    run_dir = Path(cfg.runtime.run_dir).absolute()
    check_run_dir(run_dir)
    if (run_dir / "control" / "epochs").is_dir() and any((run_dir / "control" / "epochs").iterdir()):
        raise FileExistsError(f"run dir {run_dir} already holds a run (control/epochs is not empty); pick another runtime.run_dir")
    paths = RunPaths(run_dir).ensure()
    (run_dir / "logs").mkdir(mode=0o700, exist_ok=True)
    remove_stale_temp_files(run_dir, older_than_s=-1.0, prefix="config.yaml")
    atomic_write_bytes(run_dir / "config.yaml", cfg.to_yaml().encode())
    _point_latest(run_dir)
    return cfg, paths.run_dir


def _point_latest(run_dir: Path) -> None:
    """Keep ``<parent>/latest`` pointing at the newest run dir (a convenience for inspection)."""
    try:
        replace_symlink(run_dir.parent / "latest", run_dir.name)
    except OSError:
        pass
