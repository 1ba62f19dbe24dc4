"""Runs made once per test session and read by several tests, also across pytest-xdist workers.

A run is keyed by a name; the first worker to ask makes it under a file lock in a directory every
worker of the session shares, the others wait on the lock and read what it left (the run dir and
the command's stdout). A run that failed is not cached: each test that asks sees the failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import filelock
import pytest
import yaml
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]
# A run waits for its lock at most this long (the slowest shared run takes ~2 min on 2 loaded cores).
LOCK_TIMEOUT_S = 1200.0


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory shared by every worker of this session (beside the workers' own temp dirs)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    root.mkdir(parents=True, exist_ok=True)
    return root


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``slurm-rl ARGS...`` as a subprocess of the repository root."""
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def launch(config: Path, cfg: dict, *extra: str) -> str:
    """Write ``cfg`` to ``config`` and ``slurm-rl run`` it (EXTRA appended); its stdout, exit 0 asserted."""
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    proc = cli("run", str(config), *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def shared_run(root: Path, key: str, make: Callable[[Path], tuple[Path, str]]) -> tuple[Path, str]:
    """The run ``key``: ``make(base_dir) -> (run_dir, stdout)`` is called once per session.

    ``make`` gets an empty directory of its own and must raise (assert) when the run failed."""
    base = root / key
    done = root / f"{key}.done.json"
    with filelock.FileLock(str(root / f"{key}.lock"), timeout=LOCK_TIMEOUT_S):
        if done.exists():
            doc = json.loads(done.read_text())
            return Path(doc["run_dir"]), doc["stdout"]
        if base.exists():  # a failed attempt's leftovers
            shutil.rmtree(base)
        base.mkdir(parents=True)
        run_dir, stdout = make(base)
        done.write_text(json.dumps({"run_dir": str(run_dir), "stdout": stdout}))
        return run_dir, stdout


def launched_run(root: Path, key: str, make_cfg: Callable[[Path], dict], *extra: str) -> Path:
    """The run dir of the run ``key`` (:func:`shared_run`): the config ``make_cfg(run_dir)`` launched with
    ``slurm-rl run`` (``extra`` appended)."""
    return shared_run(root, key, lambda base: (base / "run", launch(base / "c.yaml", make_cfg(base / "run"), *extra)))[0]


def runs_per_backend(tmp_path_factory: pytest.TempPathFactory, prefix: str,
                     make_cfg: Callable[[str, Path], dict]) -> Callable[[str], Path]:
    """A session fixture's getter: ``get(backend)`` is the run dir of ``make_cfg(backend, run_dir)`` launched once per
    session (across xdist workers) as the run ``PREFIX-BACKEND``."""
    root = shared_root(tmp_path_factory)
    return lambda backend: launched_run(root, f"{prefix}-{backend}", lambda run_dir: make_cfg(backend, run_dir),
                                        "--no-inspect")


@pytest.fixture(scope="session")
def scripted_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The finished 8-rank emulated run of ``emulated_config`` (scripted: two placement changes, three
    iterations), launched with ``slurm-rl run`` (the summary and plots included); its dir and stdout."""
    from emulated_configs import emulated_config

    def make(base: Path) -> tuple[Path, str]:
        run_dir = base / "scripted"
        return run_dir, launch(base / "scripted.yaml", emulated_config(run_dir))

    return shared_run(shared_root(tmp_path_factory), "scripted-8", make)


@pytest.fixture(scope="session")
def run_64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The finished 64-rank emulated run of ``emulated_config`` (8 nodes x 8, three iterations);
    the tests that read it are ``serial`` (64 processes of their own)."""
    from emulated_configs import emulated_config

    def make(base: Path) -> tuple[Path, str]:
        run_dir = base / "run64"
        cfg = emulated_config(run_dir, nodes=8, gpus_per_node=8, iterations=3)
        return run_dir, launch(base / "c64.yaml", cfg, "--no-inspect")

    return shared_run(shared_root(tmp_path_factory), "emulated-64", make)[0]
