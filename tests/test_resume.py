"""Checkpoint, stop, resume: a run interrupted (stopped at a gate, its ranks SIGKILLed, its
coordinator SIGKILLed) ends like an uninterrupted one, over the emulated and the real cpu compute."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from slurm_rl.control.epochs import EpochStore
from slurm_rl.control.lease import read_lease
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.progress import read_all_progress
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.metrics import read_metrics
from slurm_rl.resume import checkpoints

from resume_helpers import (BACKENDS, INTERRUPTIBLE, RESUME_PLACEMENT, assert_same_outcome, cli, run_config,
                            run_until_stopped, start_run, wait_until, without_kl)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stopped_run_resumes_at_another_dp_size_identically(backend: str, reference, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(run_config(backend, run_dir)))
    out = run_until_stopped(config, run_dir, at_iteration=2)
    assert "resume with: slurm-rl run --resume" in out
    assert [m["iteration"] for m in read_metrics(run_dir)] == [0, 1]
    ckpt = checkpoints.verify(run_dir / "checkpoints" / "iter-000002")
    assert ckpt.iteration == 2 and ckpt.manifest["metrics_rows"] == 2
    assert (ckpt.actor_dir is not None) == (backend == "cpu")
    assert not (run_dir / "checkpoints" / "final").exists()  # a stopped run is not finished

    resumed = cli("run", "--resume", str(run_dir), RESUME_PLACEMENT, "--no-inspect")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming" in resumed.stdout and "at iteration 2" in resumed.stdout
    assert_same_outcome(run_dir, reference(backend))
    epochs = EpochStore(RunPaths(run_dir)).all()
    assert epochs[-1].reason.startswith("resumed at iteration 2") and epochs[-1].ranks_of("actor") == [0]
    assert [m["actor_dp"] for m in read_metrics(run_dir)] == [2, 2, 1, 1]


# Packed micro-batches (train.use_remove_padding) in token bins smaller than a padded micro-batch of 4: the
# actor, the reference and the policy scorers pack; the run trains as the padded reference within float noise
# (both without a KL: resume_helpers.without_kl says why).
PACKED = {"use_remove_padding": True, "max_tokens_per_microbatch": 40}


@pytest.mark.slow  # a cpu run stopped and resumed (the packed computation has no emulated counterpart)
def test_packed_run_stopped_and_resumed_at_another_dp_size_ends_as_the_padded_reference(packed_reference,
                                                                                        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    cfg = without_kl(run_config("cpu", run_dir))
    cfg["train"] |= PACKED
    config.write_text(yaml.safe_dump(cfg))
    run_until_stopped(config, run_dir, at_iteration=2)
    resumed = cli("run", "--resume", str(run_dir), RESUME_PLACEMENT, "--no-inspect")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [m["actor_dp"] for m in read_metrics(run_dir)] == [2, 2, 1, 1]
    # packing reshapes every matmul (fp32 rounding of every log-prob): final weights measured 1.1e-5 (Intel host,
    # output_layer) and 1.9e-5 (AMD EPYC, linear_qkv) of their largest entry apart, 3e-5 allowed as for the packed
    # scaling identity (1.9e-5 of 0.08 is 0.15 % of one Adam step of lr 1e-3)
    assert_same_outcome(run_dir, packed_reference("cpu"), params_rtol=3e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_whose_ranks_are_killed_resumes_from_its_last_checkpoint(backend: str, reference, tmp_path: Path) -> None:
    """Every rank SIGKILLed inside iteration 2 (a lost node): the run resumes from the checkpoint
    at gate 2 and re-runs iteration 2 from its start: no sample lost or counted twice."""
    from slurm_rl.launch.local import LocalJob

    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(run_config(backend, run_dir, checkpoint_every=1, **INTERRUPTIBLE)))
    assert cli("prepare", str(config)).returncode == 0
    job = LocalJob(run_dir, 4)
    try:
        def inside_iteration_2() -> bool:
            # A rank reports "working" as it leaves the gate, before it writes anything: wait for
            # iteration 2's first data too, so the resume meets the interrupted iteration's partial data.
            assert job.poll() is None, "the run ended before it could be killed"
            docs = read_all_progress(RunPaths(run_dir), range(4)).values()
            working = any(d.iteration == 2 and d.state == "working" for d in docs)
            return working and (run_dir / "data" / "iter-000002").is_dir()

        wait_until("iteration 2 to start and write data", inside_iteration_2)
    finally:
        job.kill()  # SIGKILL to each rank's process group (the coordinator included)
    assert [m["iteration"] for m in read_metrics(run_dir)] == [0, 1]

    resumed = cli("run", "--resume", str(run_dir), "--no-inspect")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "at iteration 2 (checkpoint checkpoints/iter-000002" in resumed.stdout
    assert_same_outcome(run_dir, reference(backend))
    # checkpoint_every=1 with keep_checkpoints=2: the newest two gates are kept
    assert [p.name for p in checkpoints.list_checkpoints(run_dir)] == ["iter-000002", "iter-000003"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_coordinator_killed_mid_iteration_is_replaced(backend: str, reference, tmp_path: Path) -> None:
    """SIGKILL the coordinator inside iteration 1: rank 0 starts the next generation, which takes
    the lease, reads epochs, acks and progress and drives the same iteration to its end."""
    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(run_config(backend, run_dir)))
    proc = start_run(config)
    try:
        def inside_iteration_1() -> bool:
            assert proc.poll() is None, "the run ended before its coordinator could be killed"
            docs = read_all_progress(RunPaths(run_dir), range(4)).values()
            return any(d.iteration == 1 and d.state == "working" for d in docs)

        wait_until("iteration 1 to start", inside_iteration_1)
        victim = read_lease(RunPaths(run_dir))["holder"]["pid"]
        os.kill(victim, signal.SIGKILL)
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert read_lease(RunPaths(run_dir))["generation"] == 2
    assert any("coordinator restarted (generation 2)" in e.reason for e in EpochStore(RunPaths(run_dir)).all())
    assert "coordinator process" in (run_dir / "logs" / "rank-0000.log").read_text()
    assert read_coordinator_status(RunPaths(run_dir)).state == "finished"
    assert_same_outcome(run_dir, reference(backend))


# -- the checkpoint store and the resume preparation, without a run ------------------------------
def _sealed(tmp_path: Path, iteration: int = 2) -> Path:
    staging = checkpoints.staging_dir(tmp_path, iteration, generation=1)
    (staging / "actor").mkdir(parents=True)
    (staging / "actor" / "model.safetensors").write_bytes(os.urandom(4096))
    (staging / "actor" / "meta.json").write_text(json.dumps({"step": 3}))
    return checkpoints.finalize(staging, iteration=iteration, epoch=5, generation=1, metrics_rows=iteration)


def test_checkpoint_is_sealed_with_a_manifest_of_digests(tmp_path: Path) -> None:
    path = _sealed(tmp_path)
    assert path.name == "iter-000002" and not checkpoints.remove_staging(tmp_path)
    ckpt = checkpoints.verify(path)
    assert ckpt.iteration == 2 and ckpt.actor_dir == path / "actor"
    assert set(ckpt.manifest["files"]) == {"actor/model.safetensors", "actor/meta.json"}


@pytest.mark.parametrize("damage, message", [
    (lambda p: (p / "actor" / "model.safetensors").write_bytes(b"\0" * 4096), "does not match its xxh3_64"),
    (lambda p: (p / "actor" / "meta.json").unlink(), "actor/meta.json is missing"),
    (lambda p: (p / "actor" / "model.safetensors").write_bytes(b"short"), "has 5 bytes"),
    (lambda p: (p / "run.json").write_text('{"format": "slurm_rl.run_checkpoint/1", "iter'), "not a complete JSON"),
    (lambda p: (p / "run.json").unlink(), "no run.json"),
])
def test_damaged_checkpoint_is_refused_naming_the_file(tmp_path: Path, damage, message: str) -> None:
    path = _sealed(tmp_path)
    damage(path)
    with pytest.raises(checkpoints.CheckpointError, match=message):
        checkpoints.verify(path)


def test_manifest_path_outside_the_checkpoint_is_refused(tmp_path: Path) -> None:
    path = _sealed(tmp_path)
    (tmp_path / "secret").write_text("x")
    manifest = json.loads((path / "run.json").read_text())
    manifest["files"]["../../secret"] = {"bytes": 1, "xxh3_64": "0"}
    (path / "run.json").write_text(json.dumps(manifest))
    with pytest.raises(checkpoints.CheckpointError, match="'..' is not allowed"):
        checkpoints.verify(path)


def test_newest_valid_checkpoint_wins_and_old_ones_are_pruned(tmp_path: Path) -> None:
    for k in (1, 2, 3):
        _sealed(tmp_path, k)
    (tmp_path / "checkpoints" / "iter-000003" / "actor" / "meta.json").write_text("{}")  # damaged newest
    seen: list[str] = []
    assert checkpoints.latest_valid(tmp_path, log=seen.append).iteration == 2
    assert "iter-000003" in seen[0] and "meta.json" in seen[0]
    removed = checkpoints.prune(tmp_path, keep=2)
    assert [p.name for p in removed] == ["iter-000001"]
    assert [p.name for p in checkpoints.list_checkpoints(tmp_path)] == ["iter-000002", "iter-000003"]


def test_resume_refuses_a_change_that_would_alter_the_results(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(run_config("emulated", run_dir)))
    assert cli("prepare", str(config)).returncode == 0
    proc = cli("run", "--resume", str(run_dir), "train.global_batch_size=16", "runtime.seed=7")
    assert proc.returncode == 2
    assert "train.global_batch_size: got '16'" in proc.stderr and "runtime.seed: got '7'" in proc.stderr
    assert not (run_dir / "control" / "resume.json").exists()  # nothing changed
    missing = cli("run", "--resume", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "a run dir holding config.yaml" in missing.stderr


def test_resume_refuses_a_run_whose_coordinator_holds_the_lease(tmp_path: Path) -> None:
    import filelock

    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(run_config("emulated", run_dir)))
    assert cli("prepare", str(config)).returncode == 0
    with filelock.FileLock(str(RunPaths(run_dir).lease_lock)):
        proc = cli("run", "--resume", str(run_dir))
    assert proc.returncode == 2 and "is still held" in proc.stderr


@pytest.mark.parametrize("status, policy, srun_exit, requeue, exclude", [
    ({"state": "finished"}, "checkpoint_and_requeue", 143, False, []),  # finished: a late signal changes nothing
    ({"state": "stopped", "stopped_at_iteration": 2, "stop": {"reason": "USR1"}}, "fail", 0, True, []),
    ({"state": "failed", "requeue": True, "exclude": ["n2"], "error": "DeadRankError"}, "checkpoint_and_requeue", 1,
     True, ["n2"]),
    ({"state": "failed", "requeue": False, "error": "ValueError: a bug"}, "checkpoint_and_requeue", 1, False, []),
    ({"state": "running"}, "fail", 137, False, []),  # a rank SIGKILLed, srun ended the step: fail by default
    ({"state": "running"}, "checkpoint_and_requeue", 137, True, []),
])
def test_requeue_decision(tmp_path: Path, status: dict, policy: str, srun_exit: int, requeue: bool,
                          exclude: list[str]) -> None:
    from slurm_rl.control.status import write_coordinator_status
    from slurm_rl.launch.requeue import decide

    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(run_config("emulated", run_dir, on_rank_failure=policy)))
    assert cli("prepare", str(config)).returncode == 0
    write_coordinator_status(RunPaths(run_dir), {"generation": 1, **status})
    decision = decide(run_dir, srun_exit)
    assert (decision.requeue, decision.exclude) == (requeue, exclude), decision


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_synchronous_run_trains_every_sample_on_the_policy_that_generated_it(backend: str, reference) -> None:
    """The actor batches carry the policy version each sample's rollout started from (the rows'
    ``weight_version``); a synchronous run (``algorithm.max_staleness: 0``) trains every one at staleness 0,
    and ``inspect`` shows the distribution."""
    run_dir = reference(backend)
    rows = read_metrics(run_dir)
    assert rows
    for row in rows:
        assert row["staleness/counts"] == {"0": row["samples"]} and row["samples"] > 0, row
        assert row["staleness/max"] == 0 and row["staleness/mean"] == 0.0
    report = json.loads(cli("inspect", str(run_dir), "--json").stdout)
    total = sum(r["samples"] for r in rows)
    assert report["staleness"]["total"] == {"0": total} and report["staleness"]["max"] == 0
    assert report["staleness"]["per_iteration"] == {str(r["iteration"]): {"0": r["samples"]} for r in rows}
    text = cli("inspect", str(run_dir)).stdout
    assert f"samples over {len(rows)} iterations: 0: {total} (100%); max 0" in text
    # the rows of the iteration the run keeps record the version that started and that ended each sample:
    # nothing lands mid-generation in a synchronous run, so both are the iteration's
    last = rows[-1]["iteration"]
    shards = sorted((run_dir / "data" / f"iter-{last:06d}" / "rollouts").glob("shard-*.arrow"))
    assert shards, f"no rollouts shard kept for iteration {last} under {run_dir}/data"
    for shard in shards:
        with pa.memory_map(str(shard)) as source:
            table = pa.ipc.open_file(source).read_all()
        assert set(table.column("weight_version").to_pylist()) == {last}
        assert table.column("weight_version_last").to_pylist() == table.column("weight_version").to_pylist()
