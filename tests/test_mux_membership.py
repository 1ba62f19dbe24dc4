"""Live joins and leaves: ``slurm-rl mux add`` puts a job into a running group, ``mux remove``
takes one out; over both computes (``emulated`` and ``cpu``).

One group run per backend, shared by the checks: a and b start; once a's first rollout turn is
granted, c is added (it enters the rotation at the next meta-iteration, every sample of every job
is produced and trained once); once c's first rollout turn is granted, b is removed (it stops at
its next gate, its ranks exit: their memory is gone, and it leaves the rotation).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from slurm_rl.control.events import read_events
from slurm_rl.control.grants import GroupPaths
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.control.paths import RunPaths
from slurm_rl.mux.launcher import prepare_group, run_group_local
from resume_helpers import wait_until
from test_mux_live import BACKENDS, check_slots_exclusive, job_config, turns, write_group
from test_scheduling_backends import check_every_sample_once
from emulated_configs import write_config
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]
# b runs until it is removed: far more iterations than it can run before (a removal that did not work
# shows as b running on, not as a test that passed by luck)
B_ITERATIONS = 200


def _granted(group_dir: Path, pool: str, job: str) -> bool:
    return any(t[0] == job for t in turns(group_dir)[pool])


def _rank_pids(run_dir: Path) -> dict[int, int]:
    """Each rank's pid, from its heartbeat."""
    out = {}
    for p in (run_dir / "control" / "heartbeats").glob("rank-*.json"):
        doc = json.loads(p.read_text())
        out[int(p.stem.split("-")[1])] = int(doc["pid"])
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


class _Driver(threading.Thread):
    """Adds c once a's first rollout turn is granted, removes b once c's first rollout turn is
    granted (measuring b's ranks' RSS just before), through the command line."""

    def __init__(self, group_dir: Path, c_config: Path) -> None:
        super().__init__(daemon=True)
        self.group_dir, self.c_config = group_dir, c_config
        self.add: subprocess.CompletedProcess | None = None
        self.remove: subprocess.CompletedProcess | None = None
        self.b_pids: dict[int, int] = {}
        self.b_rss_kb: dict[int, int] = {}
        self.error: BaseException | None = None

    def _cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, "mux", *args], capture_output=True, text=True,
                              timeout=120, cwd=REPO)

    def run(self) -> None:
        try:
            wait_until("a's first rollout turn", lambda: (self.group_dir / "control" / "grants").is_dir()
                  and _granted(self.group_dir, "rollout", "a"))
            self.add = self._cli("add", str(self.group_dir), "c", str(self.c_config), "--slo", "4")
            wait_until("c's first rollout turn", lambda: _granted(self.group_dir, "rollout", "c"))
            b_dir = GroupPaths(self.group_dir).job_dir("b")
            self.b_pids = _rank_pids(b_dir)
            self.b_rss_kb = {r: _rss_kb(p) for r, p in self.b_pids.items() if _alive(p)}
            self.remove = self._cli("remove", str(self.group_dir), "b")
        except BaseException as exc:  # reported by the test
            self.error = exc


@pytest.fixture(scope="module", params=BACKENDS)
def joined_group(request, tmp_path_factory):
    device = request.param
    tmp = tmp_path_factory.mktemp(f"membership-{device}")
    iterations = 3 if device == "emulated" else 2
    jobs = {"a": job_config(device, tmp / "x", iterations=iterations, seed=1),
            "b": job_config(device, tmp / "y", iterations=B_ITERATIONS, seed=2)}
    jobs["b"]["runtime"]["keep_iterations"] = B_ITERATIONS  # what b trained before it left stays readable
    path = write_group(tmp, device, jobs, schedule="round_robin")
    c_cfg = job_config(device, tmp / "z", iterations=iterations, seed=3)
    write_config(tmp / "c.yaml", c_cfg)
    spec = prepare_group(path)
    driver = _Driver(spec.dir, tmp / "c.yaml")
    driver.start()
    result = run_group_local(spec.dir, log=lambda m: None)
    driver.join(timeout=60)
    return device, spec.dir, result, driver, {**jobs, "c": c_cfg}


@pytest.mark.slow
def test_add_admits_a_job_that_enters_the_rotation_next_meta_iteration(joined_group) -> None:
    device, group_dir, result, driver, cfgs = joined_group
    assert driver.error is None, driver.error
    assert driver.add is not None and driver.add.returncode == 0, driver.add and driver.add.stderr
    assert "admitted job c" in driver.add.stdout
    records = sorted((group_dir / "control" / "membership").glob("*.json"))
    joins = [json.loads(p.read_text()) for p in records]
    assert [r.get("join") or r.get("leave") for r in joins] == ["c", "b"]
    assert result.jobs["a"] == "finished" and result.jobs["c"] == "finished", result.jobs
    t = turns(group_dir)
    # c's first turn on each pool comes after a's and b's turns of the iteration that was running when it joined
    joined = read_events(GroupPaths(group_dir), "job_joined")
    assert [e["job"] for e in joined] == ["c"]
    first_c = t["rollout"].index(("c", 0))
    assert ("a", 0) in t["rollout"][:first_c] and ("b", 0) in t["rollout"][:first_c], t
    # one cyclic order on both pools: every pool serves the members in the same order. Where c enters the
    # rotation before b (a, c, b), b -- removed once c's first rollout turn is granted -- may leave before its
    # second turn: a, c (seen on cpu)
    orders = {pool: [j for j, k in t[pool] if k == 1][:3] for pool in ("rollout", "train")}
    assert orders["rollout"] == orders["train"], t
    assert orders["rollout"] in (["a", "b", "c"], ["a", "c", "b"], ["a", "c"]), t
    check_slots_exclusive(group_dir)
    for name in ("a", "c"):
        check_every_sample_once(GroupPaths(group_dir).job_dir(name), cfgs[name])


@pytest.mark.slow
def test_remove_stops_the_job_at_its_gate_and_frees_its_memory(joined_group) -> None:
    device, group_dir, result, driver, cfgs = joined_group
    assert driver.error is None, driver.error
    assert driver.remove is not None and driver.remove.returncode == 0, driver.remove and driver.remove.stderr
    assert result.jobs["b"] == "stopped", result.jobs
    b_dir = GroupPaths(group_dir).job_dir("b")
    status = read_coordinator_status(RunPaths(b_dir))
    assert status is not None and status.state == "stopped" and "removed" in (status.stop or {}).get("reason", "")
    # its ranks held memory while parked, and exited: the memory is gone
    assert driver.b_rss_kb and min(driver.b_rss_kb.values()) > 10_000, driver.b_rss_kb
    assert not [p for p in driver.b_pids.values() if _alive(p)]
    # it left the rotation: no turn of b after the leave, and b trained fewer iterations than configured
    stopped = read_events(GroupPaths(group_dir), "job_stopped")
    assert [e["job"] for e in stopped] == ["b"]
    t = turns(group_dir)
    b_iters = {k for j, k in t["train"] if j == "b"}
    assert max(b_iters) < cfgs["b"]["train"]["num_iterations"] - 1, t
    # what b trained before it left, it trained once
    last = status.stopped_at_iteration
    assert last is not None
    done = dict(cfgs["b"], train={**cfgs["b"]["train"], "num_iterations": last})
    check_every_sample_once(b_dir, done)


@pytest.mark.slow
def test_add_refuses_with_exit_2_and_the_reason(joined_group, tmp_path: Path) -> None:
    """A finished group takes no job; a bad name or config is named (exit 2, nothing created)."""
    device, group_dir, *_ = joined_group
    write_config(tmp_path / "d.yaml", job_config(device, tmp_path / "w", seed=4))
    cmd = [*CLI, "mux", "add", str(group_dir)]
    done = subprocess.run([*cmd, "d", str(tmp_path / "d.yaml")], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and "only a running group takes a job" in done.stderr, done.stderr
    bad = subprocess.run([*cmd, "Bad!", str(tmp_path / "d.yaml")], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2
    assert not (group_dir / "jobs" / "d").exists()


def test_add_refuses_a_job_that_would_break_an_slo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Admission against the group's members: a newcomer whose SLO cannot hold is refused, exit 2
    naming its SLO; a dry run of an admissible one changes nothing."""
    from slurm_rl.cli import main

    jobs = {"a": job_config("emulated", tmp_path / "x", seed=1), "b": job_config("emulated", tmp_path / "y", seed=2)}
    spec = prepare_group(write_group(tmp_path, "emulated", jobs))
    write_config(tmp_path / "c.yaml", job_config("emulated", tmp_path / "z", seed=3))
    cmd = ["mux", "add", str(spec.dir), "c", str(tmp_path / "c.yaml")]
    capsys.readouterr()
    assert main([*cmd, "--slo", "1.05"]) == 2
    refused = capsys.readouterr().err
    assert "jobs.c.slo" in refused and "slower than alone" in refused, refused
    assert main([*cmd, "--slo", "4", "--dry-run", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["members"] == ["a", "b", "c"] and figures["predicted_slowdown"]["max_lengths"]["c"] > 1.0
    assert not (spec.dir / "jobs" / "c").exists() and not (spec.dir / "control" / "membership").exists()
