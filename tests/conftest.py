"""Shared fixtures: the local Slurm test cluster (started once per session, on demand), the
uninterrupted reference run of the checkpoint/resume tests, and the hypothesis profiles.

Tests run in parallel under pytest-xdist (``-n``, see ``addopts`` in pyproject.toml). A test marked
``serial`` (timing-sensitive: ratios against a simulator, calibration, many ranks) runs alone: every
test holds a shared lock on the machine while it runs, a serial test an exclusive one (a waiting
serial test keeps new tests from starting). The Slurm tests share one cluster and run one after
the other in the ``slurm`` xdist group.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import filelock
import pytest
from hypothesis import settings

import hypothesis_profiles
from slurm_fixture import slurm_cluster  # noqa: F401
from resume_helpers import reference  # noqa: F401
from shared_runs import run_64, scripted_run  # noqa: F401

# how long a test waits for the machine (a serial test: for every running test to end)
MACHINE_LOCK_TIMEOUT_S = 1800.0


def pytest_configure(config: pytest.Config) -> None:
    # The hypothesis plugin loads --hypothesis-profile first; without one, the quick loop gets quick.
    if config.getoption("hypothesis_profile", None) is None:
        quick = "not slow" in (config.getoption("markexpr", "") or "")
        settings.load_profile(hypothesis_profiles.QUICK if quick else hypothesis_profiles.FULL)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        if item.get_closest_marker("slurm") is not None:  # one cluster: its tests one after the other
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif "scripted_run" in getattr(item, "fixturenames", ()):  # `inspect` writes its plots into the run dir
            item.add_marker(pytest.mark.xdist_group("scripted_run"))


def _machine_lock(config: pytest.Config) -> filelock.ReadWriteLock | None:
    """The session's machine lock under xdist (shared by its workers); None without xdist."""
    run = getattr(config, "workerinput", {}).get("testrunuid")
    if run is None:
        return None
    path = Path(tempfile.gettempdir()) / f"slurm-rl-tests-{run}.machine.db"
    return filelock.ReadWriteLock(str(path), timeout=MACHINE_LOCK_TIMEOUT_S)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Setup, call and teardown of a test under the machine lock: exclusive for ``serial`` tests."""
    lock = _machine_lock(item.config)
    if lock is None:
        yield
        return
    hold = lock.write_lock() if item.get_closest_marker("serial") is not None else lock.read_lock()
    with hold:
        yield
