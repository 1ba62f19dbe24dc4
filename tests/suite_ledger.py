"""The suite ledger: what a whole-suite run cost, written at its end (a pytest plugin).

Each test's wall and CPU seconds (setup, call and teardown together; CPU is the test process's own,
that of the child processes it waited for, what its live descendants spent meanwhile (a fork
server that outlives the test counts with the ranks it reaped), and what the session's zygotes forked
for it and reaped before the test ended (tests/zygotes.py); work inside Slurm jobs counts only in the
machine's total) are measured where the test runs, xdist worker or not, and sent to the controller
in the report's ``user_properties``. At the end of a run of the whole suite (no ``-m``, ``-k`` or
test paths given) the controller writes ``.test-ledger/latest.json`` and appends the same document
to ``.test-ledger/history.jsonl`` (in the repository root, not committed; every test's figures go to
``.test-ledger/latest-tests.json``), and prints the costliest tests. ``tools/test_budget.py`` shows a ledger and compares two.
``--ledger-out PATH`` writes a selection's ledger (the quick loop's, one module's) to PATH instead, every
test's figures under ``tests``.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_rl.launch.zygote import LABEL_ENV
from zygotes import zygote_children_cpu_s, zygote_cpu_s

REPO = Path(__file__).resolve().parents[1]
LEDGER_DIR = REPO / ".test-ledger"
TOP = 20
_CPU_KEY = "ledger_cpu_s"
_cpu_key = pytest.StashKey[float]()


def _child_pids(pid: int) -> list[int] | None:
    """The children of ``pid`` from ``/proc/PID/task/TID/children`` (None where the kernel has no such file)."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None
        except OSError:
            continue
    return found


def _descendant_pids() -> list[int]:
    """This process's live descendants. Walks its own subtree (``/proc/PID/task/TID/children``), not every
    process of the machine as ``psutil.Process.children(recursive=True)`` does: it runs six times a test, and
    a machine-wide walk costs 5-8 ms where a few hundred processes run."""
    import psutil

    out, stack = [], [os.getpid()]
    while stack:
        kids = _child_pids(stack.pop())
        if kids is None:
            return [p.pid for p in psutil.Process().children(recursive=True)]
        out.extend(kids)
        stack.extend(kids)
    return out


def _descendants_cpu() -> float:
    """CPU seconds of this process's live descendants, with the children each of them reaped."""
    import psutil

    total = 0.0
    for pid in _descendant_pids():
        try:
            t = psutil.Process(pid).cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _cpu_now() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + _descendants_cpu()


def machine_cpu_s() -> tuple[float, float]:
    """CPU seconds spent by every process of the machine since boot (user, nice, system), and the
    seconds the hypervisor gave the machine's CPUs to others (steal), from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return sum(fields[:3]) / tick, (fields[7] if len(fields) > 7 else 0) / tick


def kernel_threads_cpu_s() -> dict[int, float]:
    """CPU seconds spent so far by each of the kernel's threads (processes without a command line:
    reclaim and memory monitors such as kdamond, RCU, kworkers); they run for the machine, not for a test."""
    tick, found = os.sysconf("SC_CLK_TCK"), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes():
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def kernel_threads_spent_s(before: dict[int, float]) -> float:
    """What the kernel's threads spent since ``before`` (per thread: one that ended meanwhile is not
    counted, one that started is counted whole)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in kernel_threads_cpu_s().items())


def _phase_cpu_hook():
    """A hook wrapper for one test phase (setup, call or teardown) that stashes the phase's CPU seconds."""
    @pytest.hookimpl(hookwrapper=True)
    def hook(item: pytest.Item) -> Iterator[None]:
        os.environ[LABEL_ENV] = item.nodeid  # what the session's zygotes fork for this test carries it
        start = _cpu_now()
        yield
        item.stash[_cpu_key] = _cpu_now() - start + zygote_children_cpu_s(item.config, item.nodeid)

    return hook


pytest_runtest_setup = _phase_cpu_hook()
pytest_runtest_call = _phase_cpu_hook()
pytest_runtest_teardown = _phase_cpu_hook()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    report.user_properties.append((_CPU_KEY, item.stash.get(_cpu_key, 0.0)))
    item.stash[_cpu_key] = 0.0


def whole_suite(config: pytest.Config) -> bool:
    """Whether this run is the whole suite: no selection by marker, keyword, path or last failures, and
    tests that run (not ``--collect-only``)."""
    opt = config.option
    if getattr(opt, "markexpr", "") or getattr(opt, "keyword", "") or getattr(opt, "lf", False) \
            or getattr(opt, "deselect", None) or getattr(opt, "ignore", None) or getattr(opt, "collectonly", False):
        return False
    testpaths = [str((config.rootpath / p).resolve()) for p in config.getini("testpaths")]
    return all(str(Path(a).resolve()) in testpaths for a in config.args)


def host_speed_s() -> float:
    """Seconds of a fixed single-threaded CPU workload (integer and float arithmetic in the interpreter: ~0.2 s
    on an idle core here), best of three: the host's speed beside the suite's time, since hosts (and their
    load) differ up to 3x."""
    def work() -> float:
        t0 = time.perf_counter()
        acc = 0.0
        for i in range(400_000):
            acc += (i * i % 7) * 0.5
        return time.perf_counter() - t0

    return round(min(work() for _ in range(3)), 3)


class Ledger:
    """Collects the reports on the controller and writes the ledger at the session's end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.tests: dict[str, dict[str, Any]] = {}
        self.outcomes: dict[str, int] = {}
        self.wall0 = time.monotonic()
        self.time0 = time.time()
        self.cpu0, self.steal0 = machine_cpu_s()
        self.kernel0 = kernel_threads_cpu_s()
        self.speed0 = host_speed_s()
        self.doc: dict[str, Any] | None = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests.setdefault(report.nodeid, {"wall_s": 0.0, "cpu_s": 0.0, "outcome": "passed"})
        entry["wall_s"] += report.duration
        # when it ran (seconds since the session started) and where: the suite's timeline
        entry.setdefault("started_s", round(report.start - self.time0, 2))
        entry["ended_s"] = round(report.stop - self.time0, 2)
        entry["worker"] = getattr(report, "worker_id", None)  # xdist's (gw0, ...); None without xdist
        entry["cpu_s"] += dict(report.user_properties).get(_CPU_KEY, 0.0)
        if report.failed:
            entry["outcome"] = "failed"
        elif report.skipped and report.when != "teardown":
            entry["outcome"] = "skipped"

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        wall = time.monotonic() - self.wall0
        cpu, steal = machine_cpu_s()
        cpu, steal = cpu - self.cpu0, steal - self.steal0
        counts: dict[str, int] = {}
        for t in self.tests.values():
            counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
        ranked = sorted(self.tests.items(), key=lambda kv: -kv[1]["wall_s"])
        self.doc = {
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "pytest_s": round(wall, 1),
            "host_speed_s": {"start": self.speed0, "end": host_speed_s()},
            "machine_cpu_s": round(cpu, 1),
            "cores_busy": round(cpu / wall, 2) if wall > 0 else 0.0,
            "steal_s": round(steal, 1),
            "kernel_threads_cpu_s": round(kernel_threads_spent_s(self.kernel0), 1),
            "zygote_cpu_s": round(zygote_cpu_s(self.config), 1),
            "tests_cpu_s": round(sum(t["cpu_s"] for t in self.tests.values()), 1),
            "tests_wall_s": round(sum(t["wall_s"] for t in self.tests.values()), 1),
            "workers": getattr(self.config.option, "numprocesses", None),
            "exit_status": int(exitstatus),
            "counts": counts,
            "costliest": [{"test": k, "wall_s": round(v["wall_s"], 1), "cpu_s": round(v["cpu_s"], 1)}
                          for k, v in ranked[:TOP]],
        }
        modules: dict[str, dict[str, float]] = {}
        for name, t in self.tests.items():
            m = modules.setdefault(name.split("::")[0], {"wall_s": 0.0, "cpu_s": 0.0})
            m["wall_s"] += t["wall_s"]
            m["cpu_s"] += t["cpu_s"]
        self.doc["modules"] = {k: {x: round(y, 1) for x, y in v.items()}
                               for k, v in sorted(modules.items(), key=lambda kv: -kv[1]["wall_s"])}
        out = self.config.getoption("ledger_out")
        if out:
            Path(out).write_text(json.dumps(dict(self.doc, tests={k: v for k, v in ranked}), indent=1) + "\n")
        elif whole_suite(self.config):
            LEDGER_DIR.mkdir(exist_ok=True)
            (LEDGER_DIR / "latest-tests.json").write_text(json.dumps(
                {k: {x: round(y, 2) if isinstance(y, float) else y for x, y in v.items()} for k, v in ranked}, indent=0))
            (LEDGER_DIR / "latest.json").write_text(json.dumps(self.doc, indent=1) + "\n")
            with open(LEDGER_DIR / "history.jsonl", "a") as f:
                f.write(json.dumps(self.doc) + "\n")

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.doc is None or not (whole_suite(self.config) or self.config.getoption("ledger_out")):
            return
        d = self.doc
        tr = terminalreporter
        tr.section(f"suite ledger ({self.config.getoption('ledger_out') or '.test-ledger/latest.json'})")
        tr.write_line(f"pytest {d['pytest_s']:.0f} s, machine CPU {d['machine_cpu_s']:.0f} s "
                      f"({d['cores_busy']:.2f} cores busy; kernel threads {d['kernel_threads_cpu_s']:.0f} s, "
                      f"steal {d['steal_s']:.0f} s), tests' own CPU {d['tests_cpu_s']:.0f} s, "
                      f"the zygotes' and what they forked {d['zygote_cpu_s']:.0f} s; host speed "
                      f"{d['host_speed_s']['start']:.3f} s at the start, {d['host_speed_s']['end']:.3f} s at the end "
                      "(a fixed CPU workload: lower is faster)")
        for t in d["costliest"]:
            tr.write_line(f"{t['wall_s']:8.1f} s wall {t['cpu_s']:8.1f} s cpu  {t['test']}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--ledger-out", default=None, metavar="PATH",
                     help="write this run's ledger (any selection) to PATH instead of .test-ledger/")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        config.pluginmanager.register(Ledger(config), "suite_ledger_collector")
