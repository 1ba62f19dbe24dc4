"""The suite ledger's per-test CPU (tests/suite_ledger.py): the live descendants it counts are this process's
subtree, found without walking every process of the machine."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from suite_ledger import _descendant_pids, _descendants_cpu

# a child that starts a grandchild, which spins for SPIN_S of CPU then sleeps until killed
TREE = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time\\nt = time.process_time()\\nwhile time.process_time() - t < %s: pass\\nprint('spun', flush=True)\\ntime.sleep(60)"])
time.sleep(60)
"""
SPIN_S = 0.3


def _wait_for(what: str, check, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)


def test_descendants_are_this_process_subtree_as_psutil_finds_them() -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}  # the session's zygotes, without xdist
    cpu_before = _descendants_cpu()
    child = subprocess.Popen([sys.executable, "-c", TREE % SPIN_S])
    try:
        _wait_for("the grandchild to start", lambda: len({p.pid for p in me.children(recursive=True)} - before) == 2)
        tree = {p.pid for p in me.children(recursive=True)}
        found = set(_descendant_pids())
        after = {p.pid for p in me.children(recursive=True)}
        grandchild = psutil.Process(next(iter(tree - before - {child.pid})))
        assert grandchild.ppid() == child.pid
        # the same processes as psutil's walk (another test's leftover children may come and go meanwhile)
        assert {child.pid, grandchild.pid} <= found <= tree | after
        _wait_for("the grandchild to spin", lambda: sum(grandchild.cpu_times()[:2]) >= SPIN_S)
        # the grandchild's spin is counted (the interpreters' starts add more; the scale is the spin)
        assert _descendants_cpu() - cpu_before >= SPIN_S
    finally:
        grandchild_pids = {p.pid for p in me.children(recursive=True)} - before - {child.pid}
        for pid in grandchild_pids:
            psutil.Process(pid).kill()
        child.kill()
        child.wait()
    assert not set(_descendant_pids()) & ({child.pid} | grandchild_pids)


def test_only_a_run_of_every_test_is_the_whole_suite(pytestconfig) -> None:
    """The ledger is written for the whole suite only: not for a selection and not for ``--collect-only``."""
    from types import SimpleNamespace

    from suite_ledger import whole_suite

    def config(**option):
        opts = {"markexpr": "", "keyword": "", "lf": False, "deselect": None, "ignore": None, "collectonly": False}
        return SimpleNamespace(option=SimpleNamespace(**{**opts, **option}), rootpath=pytestconfig.rootpath,
                               getini=pytestconfig.getini, args=[str(pytestconfig.rootpath / "tests")])

    assert whole_suite(config())
    assert not whole_suite(config(collectonly=True))
    assert not whole_suite(config(markexpr="not slow"))
