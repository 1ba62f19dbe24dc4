"""Shared fixtures: the local Slurm test cluster (started once per session, on demand), the
uninterrupted reference run of the checkpoint/resume tests, and the hypothesis profiles.

Tests run in parallel under pytest-xdist (``-n``, see ``addopts`` in pyproject.toml). A test marked
``serial`` (timing-sensitive: ratios against a simulator, calibration, many ranks) runs apart from the
others, beside at most one other serial test, after the ordinary tests the workers hold have run
(tests/machine_lock.py). The Slurm tests share one cluster (started once, under
a file lock) and queue for its nodes like any Slurm job. Tests of a module with a module-scoped
fixture run on one worker (xdist group ``module:NAME``), so the fixture is built once.
"""

from __future__ import annotations

import os
import sys

# The suite starts hundreds of interpreters (CLI calls, Slurm job ranks, reward workers) and xdist
# workers that each rewrite every test module's asserts: where PYTHONDONTWRITEBYTECODE is set (some
# shells and containers set it) every one of them compiled slurm_rl and the tests anew. The test
# session writes the bytecode caches (__pycache__/, ignored by git); set before the workers start.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import itertools  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

import hypothesis_profiles
from machine_lock import ORDINARY, SERIAL, MachineLock
from xdist_serial import SERIAL_GROUP, SerialLastScheduling
from slurm_fixture import slurm_cluster  # noqa: F401
from resume_helpers import packed_reference, reference  # noqa: F401
from shared_runs import run_64, scripted_run  # noqa: F401

pytest_plugins = ["zygotes", "suite_ledger"]

# Slurm's client commands: a test that does not use the local cluster gets stand-ins that refuse (exit 1)
SLURM_CLIENTS = ("sbatch", "srun", "salloc", "squeue", "sinfo", "scontrol", "scancel", "sacct", "sacctmgr", "sstat")
# how long a test waits for the machine (a serial test: for every running test to end)
MACHINE_LOCK_TIMEOUT_S = 1800.0


def pytest_configure(config: pytest.Config) -> None:
    # The hypothesis plugin loads --hypothesis-profile first; without one, the quick loop gets quick.
    if config.getoption("hypothesis_profile", None) is None:
        quick = "not slow" in (config.getoption("markexpr", "") or "")
        settings.load_profile(hypothesis_profiles.QUICK if quick else hypothesis_profiles.FULL)


def _module_fixture_user(item: pytest.Item) -> bool:
    """Whether ``item`` uses a module- or class-scoped fixture (set up once per worker that runs it)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d[-1].scope in ("module", "class") for d in defs if d)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    # a wrapper, so the groups are marked before xdist's own hook reads them into the node ids
    for item in items:
        # a serial test is a group of its own (added below, in the final order), which the scheduler
        # hands only to a worker holding at most one test (tests/xdist_serial.py); a group that held a serial test and others
        # would run where its first test falls in the order, and the serial tests come after every other
        if item.get_closest_marker("xdist_group") is not None or item.get_closest_marker("serial") is not None:
            continue
        if "scripted_run" in getattr(item, "fixturenames", ()):  # `inspect` writes its plots into the run dir
            item.add_marker(pytest.mark.xdist_group("scripted_run"))
        elif item.get_closest_marker("vllm") is not None:  # one worker waits for the session's vLLM subprocess
            item.add_marker(pytest.mark.xdist_group("vllm-checks"))
        elif _module_fixture_user(item):  # one worker builds the module's fixture (a vLLM engine, a model)
            item.add_marker(pytest.mark.xdist_group(f"module:{item.module.__name__}"))
    # Modules with integration or Slurm tests first, serial tests last, the longest first (their
    # ``seconds``, measured in the whole suite): xdist queues two tests behind each worker's running one,
    # so in the order of the file three long serial tests went to one worker and ran one after the other
    # (69 s for 115 s of serial tests two at a time). The workers take tests in this order, so the short
    # ones fill the gaps at the end. Modules with Slurm tests (they mostly
    # wait on Slurm: requeues, job starts) alternate with the other heavy ones, so their waits overlap
    # with computing work and none of them is left to run alone before the serial tests. A module moves
    # as a whole (its module fixtures are built once without xdist too); the sort is stable, so every
    # worker agrees.
    modules = list(dict.fromkeys(item.module.__name__ for item in items))
    slurm = [m for m in modules if any(i.get_closest_marker("slurm") for i in items if i.module.__name__ == m)]
    heavy = [m for m in modules if m not in slurm
             and any(i.get_closest_marker("slow") for i in items if i.module.__name__ == m)]
    order = [m for pair in itertools.zip_longest(slurm, heavy) for m in pair if m is not None]
    position = {m: i for i, m in enumerate(order)}

    def rank(item: pytest.Item) -> tuple[int, int]:
        if (serial := item.get_closest_marker("serial")) is not None:
            return 2, -serial.kwargs.get("seconds", 0)
        name = item.module.__name__
        return (0, position[name]) if name in position else (1, 0)

    items.sort(key=rank)
    serial = [item for item in items if item.get_closest_marker("serial") is not None]
    for i, item in enumerate(serial):
        item.add_marker(pytest.mark.xdist_group(f"{SERIAL_GROUP}{i}"))
    return (yield)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` (pyproject's addopts), a serial test handed only to a worker holding at most one test."""
    if config.getoption("dist") != "loadgroup":
        return None
    return SerialLastScheduling(config, log)


def _machine_lock(config: pytest.Config) -> MachineLock | None:
    """The session's machine lock under xdist (shared by its workers); None without xdist."""
    run = getattr(config, "workerinput", {}).get("testrunuid")
    if run is None:
        return None
    return MachineLock(Path(tempfile.gettempdir()) / f"slurm-rl-tests-{run}.machine.json", MACHINE_LOCK_TIMEOUT_S)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of a test under the machine lock: ``serial`` tests apart from the others
    (tests/machine_lock.py)."""
    lock = _machine_lock(item.config)
    if lock is None:
        yield
        return
    serial = item.get_closest_marker("serial")
    with lock.hold(ORDINARY) if serial is None else lock.hold(SERIAL, priority=serial.kwargs.get("seconds", 0),
                                                              slots=serial.kwargs.get("slots", 1)):
        yield


def _uses_the_cluster(item: pytest.Item) -> bool:
    return item.get_closest_marker("slurm") is not None or "slurm_cluster" in getattr(item, "fixturenames", ())


@pytest.fixture(scope="session")
def refusing_slurm_clients(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of stand-ins for Slurm's clients that say who called them and exit 1."""
    bin_dir = tmp_path_factory.mktemp("no-slurm-bin")
    for name in SLURM_CLIENTS:
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\necho '{name}: not reachable from a test that does not use the local Slurm "
                        f"cluster (mark it slurm, or fake this call)' >&2\nexit 1\n")
        path.chmod(0o755)
    return bin_dir


@pytest.fixture(autouse=True)
def _no_real_slurm_unless_asked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test's outcome does not depend on the shell's Slurm environment: a test that does not use the
    local cluster sees no SLURM_* variable and only refusing stand-ins for Slurm's commands, whether or
    not the cluster's environment (tools/slurm/env.sh) or a job's was exported."""
    if _uses_the_cluster(request.node):
        return
    for key in list(os.environ):
        if key.startswith("SLURM_") and not key.startswith("SLURM_RL_"):
            monkeypatch.delenv(key)
    stubs = request.getfixturevalue("refusing_slurm_clients")
    monkeypatch.setenv("PATH", f"{stubs}{os.pathsep}{os.environ.get('PATH', '')}")
