"""Preemption of a co-execution group: every member checkpoints at its gate (a parked one too), the
group resumes each member from its checkpoint, and every member ends as in an uninterrupted group
(``emulated``: same samples and rewards; ``cpu``: same per-step losses too). Locally through the
same functions ``sbatch/mux.sh`` calls, and on the local Slurm cluster with
``scancel --signal=USR1 --batch`` and a real requeue."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from identity import assert_losses_match
from resume_helpers import outcome
from slurm_rl.control.events import read_events
from slurm_rl.control.grants import GroupPaths
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.mux.launcher import prepare_group, run_group_local
from slurm_rl.mux.group_requeue import decide, resume_group, stop_group
from resume_helpers import wait_until
from test_mux_live import REPO, job_config, round_robin_jobs, shared_group, turns, write_group
from test_scheduling_backends import check_every_sample_once

BACKENDS = ["emulated", pytest.param("cpu", marks=pytest.mark.slow)]
ITERATIONS = 2  # round_robin_jobs'


def assert_same_members(group_dir: Path, reference: Path, cfgs: dict[str, dict], iterations: int = ITERATIONS) -> None:
    """Each member: same per-iteration samples, rewards, mini-batches and per-step losses as in the
    uninterrupted group, every sample produced and trained once."""
    for name, cfg in cfgs.items():
        got, ref = outcome(GroupPaths(group_dir).job_dir(name)), outcome(GroupPaths(reference).job_dir(name))
        assert [m["iteration"] for m in got] == list(range(iterations)), got
        for x, y in zip(got, ref):
            assert {k: v for k, v in x.items() if k != "losses"} == {k: v for k, v in y.items() if k != "losses"}
            assert (x["losses"] is None) == (y["losses"] is None)
            assert_losses_match(x["losses"] or [], y["losses"] or [])
        check_every_sample_once(GroupPaths(group_dir).job_dir(name), cfg)


@pytest.mark.slow
@pytest.mark.parametrize("device", BACKENDS)
def test_stopped_group_resumes_every_member_from_its_checkpoint(tmp_path: Path, device: str, tmp_path_factory) -> None:
    jobs = round_robin_jobs(device, tmp_path)
    spec = prepare_group(write_group(tmp_path, device, jobs))
    asked: list[str] = []

    def preempt() -> None:  # what sbatch/mux.sh does on USR1, here at the gate of iteration 1 for every
        # member whatever the timing: asked once b's first rollout turn is granted (b is inside iteration 0,
        # a has not passed gate 1: it waits for the rollout pool b holds)
        wait_until("b's first rollout turn", lambda: (spec.dir / "control" / "grants").is_dir()
                   and ("b", 0) in turns(spec.dir)["rollout"])
        asked.extend(stop_group(spec.dir, "USR1 (test)", at_iteration=1))

    thread = threading.Thread(target=preempt, daemon=True)
    thread.start()
    first = run_group_local(spec.dir, log=lambda m: None)
    thread.join(timeout=30)
    assert sorted(asked) == ["a", "b"]
    assert first.jobs == {"a": "stopped", "b": "stopped"}, first.jobs
    stopped_at = {}
    for name in jobs:
        status = read_coordinator_status(RunPaths(GroupPaths(spec.dir).job_dir(name)))
        assert status is not None and status.state == "stopped" and status.checkpoint, status
        stopped_at[name] = status.stopped_at_iteration
    assert stopped_at == {"a": 1, "b": 1}, stopped_at
    decision = decide(spec.dir)
    assert decision.requeue, decision
    assert sorted(resume_group(spec.dir)) == ["a", "b"]
    second = run_group_local(spec.dir, log=lambda m: None)
    assert second.jobs == {"a": "finished", "b": "finished"}, second.jobs
    assert decide(spec.dir).finished
    # the requeued group's scheduler carried on from the last grant: each member's turns go on
    # from the iteration it stopped at, in the same cyclic order
    t = turns(spec.dir)
    for pool in ("rollout", "train"):
        for name in jobs:
            iters = [k for j, k in t[pool] if j == name]
            assert sorted(set(iters)) == list(range(ITERATIONS)), (pool, name, t)
    assert [sorted(e["members"]) for e in read_events(GroupPaths(spec.dir), "group_resumed")] == [["a", "b"]]
    assert_same_members(spec.dir, shared_group(tmp_path_factory, device), jobs)


@pytest.mark.slow
@pytest.mark.slurm
def test_sbatch_mux_requeues_a_preempted_group(slurm_cluster, tmp_path: Path) -> None:
    """``scancel --signal=USR1 --batch``: the group checkpoints, requeues itself and resumes each member."""
    from test_requeue_slurm import JOB_TIMEOUT_S

    # 4 iterations: the signal reaches the members a second or so after it is sent (scancel, the batch
    # script's trap, the stop requests), and each stops at its next gate, inside the run
    jobs = {name: job_config("emulated", tmp_path / f"unused-{name}", iterations=4, seed=seed)
            for name, seed in (("b", 22), ("a", 11))}
    (tmp_path / "reference").mkdir()
    reference = prepare_group(write_group(tmp_path / "reference", "emulated", jobs))
    assert run_group_local(reference.dir, log=lambda m: None).ok
    for cfg in jobs.values():
        cfg["runtime"]["poll_interval_s"] = 0.25  # iterations long enough to be interrupted inside
    path = write_group(tmp_path, "emulated", jobs)
    log = tmp_path / "job.out"
    proc = slurm_cluster.run("sbatch", "--parsable", "--requeue", "--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4",
                             "--open-mode=append", f"--output={log}", str(REPO / "sbatch" / "mux.sh"), str(path))
    job_id = proc.stdout.strip().split(";")[0]
    group_dir = tmp_path / "group"
    wait_until("a's first rollout turn", lambda: (group_dir / "control" / "grants").is_dir()
               and ("a", 0) in turns(group_dir)["rollout"], JOB_TIMEOUT_S)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job_id)
    wait_until(f"job {job_id} to end", lambda: slurm_cluster.job_gone(job_id), JOB_TIMEOUT_S)
    text = log.read_text()
    assert "USR1 (preemption/time limit) received" in text, text
    assert f"requeueing job {job_id}" in text and f"resuming group {group_dir}" in text, text
    assert "job a finished" in text and "job b finished" in text, text
    for name in jobs:
        kinds = [e["kind"] for e in read_events(RunPaths(GroupPaths(group_dir).job_dir(name)))]
        assert kinds.count("stopped") == 1 and kinds.count("resumed") == 1, kinds
    assert_same_members(group_dir, reference.dir, jobs, iterations=4)
