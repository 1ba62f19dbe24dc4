"""The forecast reads the history's values; the history does not know the forecast.

``scheduler/history.py`` (the values) sits below ``scheduler/forecast.py`` (fits on them),
which sits below ``scheduler/recorder.py`` (folds observations, fits the rollout bias)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_rl

SCHEDULER = Path(slurm_rl.__file__).parent / "scheduler"


def _parse(path: Path) -> ast.Module:
    """``ast.parse`` of ``path``. CPython 3.11 may raise a spurious ``SystemError: AST constructor recursion depth
    mismatch`` when another thread of the process builds AST objects at the same time (its depth counter is shared;
    python/cpython#106905): seen once in a whole-suite run, so a second parse is tried before failing."""
    try:
        return ast.parse(path.read_text(), str(path))
    except SystemError as err:
        if "recursion depth mismatch" not in str(err):
            raise
        return ast.parse(path.read_text(), str(path))


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-local imports included)."""
    names: set[str] = set()
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_history_imports_no_scheduler_module() -> None:
    imported = _imported_modules(SCHEDULER / "history.py")
    assert not {n for n in imported if n.startswith("slurm_rl.scheduler")}, imported


def test_forecast_and_history_do_not_import_each_other() -> None:
    assert "slurm_rl.scheduler.forecast" not in _imported_modules(SCHEDULER / "history.py")
    assert "slurm_rl.scheduler.recorder" not in _imported_modules(SCHEDULER / "forecast.py")
    assert "slurm_rl.scheduler.recorder" not in _imported_modules(SCHEDULER / "history.py")


@pytest.mark.parametrize("module", ["history", "forecast", "recorder"])
def test_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    code = f"import sys, slurm_rl.scheduler.{module}\nprint(sorted(sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if module == "history":
        assert "slurm_rl.scheduler.forecast" not in proc.stdout


def test_config_imports_nothing_from_the_scheduler() -> None:
    """``slurm_rl.config`` is the bottom layer: importing it and loading (validating) configs of every kind
    brings in nothing from ``slurm_rl/scheduler/`` (nor ``inspect/``), in a fresh interpreter."""
    repo = Path(slurm_rl.__file__).resolve().parents[1]
    code = (
        "import sys\n"
        "import slurm_rl.config as c\n"
        "assert not [m for m in sys.modules if m.startswith('slurm_rl.scheduler')], 'import'\n"
        f"for name in ('configs/examples/emulated_8.yaml', 'configs/examples/auto_8.yaml',"
        f" 'configs/examples/ppo_qwen2.5_0.5b.yaml'):\n"
        f"    c.load_config({str(repo)!r} + '/' + name, ['runtime.device=emulated', 'model.path=null'], env={{}})\n"
        "print(sorted(m for m in sys.modules if m.startswith(('slurm_rl.scheduler', 'slurm_rl.inspect'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
