"""Every vLLM check of the suite in one subprocess per test session: importing and starting vLLM is
most of their cost (it sets process-wide state, so it runs apart from pytest, as a ``__main__``).

``vllm_results(tmp_path_factory, NAME)`` gives the JSON that ``NAME``'s ``run_checks`` wrote
(``tp``: tests/test_vllm_tp.py, ``engine``: tests/test_vllm_engine.py, ``hf_models``:
tests/test_vllm_hf_models.py, ``options``: tests/test_vllm_options.py); the first
worker to ask runs the subprocess, the others read its files (``shared_runs.shared_run``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shared_runs import REPO, shared_root, shared_run

CHECKS = ("tp", "engine", "hf_models", "options")  # tests/test_vllm_<name>.py, run in this order (tp first: it
# forks its second rank, before any engine or torch thread exists)
# The checks' engines hold a few hundred tokens at most: a 64 MiB KV cache instead of the engine's 1 GiB
# default on cpu (vLLM zeroes it: 0.7 s of CPU per engine).
KV_CACHE_GIB = 1 / 16


def freeze_survivors() -> None:
    """Collect, then freeze what survives (``gc.freeze``). vLLM collects the whole heap five times while it
    builds an engine (``load_model``, ``freeze_gc_heap``, the profiling KV cache): over the imports of torch,
    transformers and vLLM, 0.28 s each, 12.6 s of the checks' 47 s. Frozen, those collections walk only
    what was made since; vLLM's shutdown unfreezes the heap again, so call this before each engine."""
    import gc

    gc.collect()
    gc.freeze()


def vllm_results(tmp_path_factory: pytest.TempPathFactory, name: str) -> Any:
    """The results of ``test_vllm_<name>.run_checks`` (the subprocess runs once per session)."""
    def make(base: Path) -> tuple[Path, str]:
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1")
        proc = subprocess.run([sys.executable, __file__, str(base)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return base, proc.stdout

    base, _ = shared_run(shared_root(tmp_path_factory), "vllm-checks", make)
    return json.loads((base / f"{name}.json").read_text())


if __name__ == "__main__":
    import importlib

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    for check in CHECKS:
        freeze_survivors()
        importlib.import_module(f"test_vllm_{check}").run_checks(Path(sys.argv[1]) / f"{check}.json")
