"""Co-execution groups run for real: jobs share a rollout and a training pool, each parametrised
over both computes (``emulated``: 8 slots, the cost model; ``cpu``: 4 slots, the real engines).

Checked from the files: pools are handed round-robin by phase, no slot ever serves two jobs at
once (each holder starts after the previous one parked), every sample of every job is produced
once and trained once (long-tail migration included), warm switches are recorded, and with the
real engines each job's per-step losses equal its solo run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from slurm_rl.control.events import read_events
from slurm_rl.control.grants import GroupPaths, grant_numbers, read_grant
from slurm_rl.control.heartbeats import read_heartbeat
from slurm_rl.control.paths import RunPaths
from slurm_rl.inspect.report import read_metrics
from slurm_rl.mux.launcher import prepare_group, run_group_local
from test_scheduling_backends import check_every_sample_once
from emulated_configs import write_config
from identity import LOGPROB_ATOL, assert_losses_match, assert_params_match
from shared_runs import shared_root, shared_run
from toy_data import TOY_DATA, TOY_REWARD, TOY_REWARD_WORKERS
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ["emulated", "cpu"]

EMULATED_COSTS = {
    "rollout_s_per_token": 2.0e-5, "inference_s_per_token": 2.0e-6, "actor_s_per_token": 8.0e-6,
    "response_len_mean": 128, "response_len_max": 512, "response_len_sigma": 1.0, "prompt_len": 32,
    "model_params": 10_000_000,
}


def job_config(device: str, run_dir: Path, iterations: int = 2, seed: int = 1234) -> dict:
    """A job for a group: rollout on its upper ranks, actor + inference on the lower ones."""
    if device == "cpu":  # 4 ranks: actor 0, inference 1, rollout 2-3; 64 samples, 2 mini-batches
        return {
            "cluster": {"num_nodes": 1, "gpus_per_node": 4,
                        "component_placement": {"actor": "0", "inference": "1", "rollout": "2-3"}},
            "runtime": {"device": "cpu", "run_dir": str(run_dir), "wait_timeout_s": 120.0, "ack_timeout_s": 120.0,
                        "heartbeat_timeout_s": 60.0, "run_timeout_s": 600.0, "seed": seed,
                        "keep_iterations": 10},
            "train": {"num_iterations": iterations, "rollout_batch_size": 16, "group_size": 4,
                      "global_batch_size": 32, "micro_batch_size": 8, "minibatch_order": "index"},
            "scheduler": {"policy": "static", "max_running_requests": 16},
            "model": {"hidden_size": 64, "num_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
            "data": {"train_files": [str(TOY_DATA / "copy_6.jsonl")]},
            "reward": {"fn": TOY_REWARD, "workers": TOY_REWARD_WORKERS},
            "actor": {"lr": 1.0e-3},
            "algorithm": {"clip_eps": 0.2, "kl_coef": 0.05},
            "rollout": {"backend": "hf", "sub_batch": 4, "max_new_tokens": 7},
        }
    return {  # 8 ranks: actor 0-1, inference 2-3, rollout 4-7; 128 long-tailed samples
        "cluster": {"num_nodes": 1, "gpus_per_node": 8,
                    "component_placement": {"actor": "0-1", "inference": "2-3", "rollout": "4-7"}},
        "runtime": {"device": "emulated", "run_dir": str(run_dir), "heartbeat_timeout_s": 20.0,
                    "wait_timeout_s": 60.0, "run_timeout_s": 300.0, "seed": seed, "keep_iterations": 10},
        "train": {"num_iterations": iterations, "rollout_batch_size": 16, "group_size": 8,
                  "global_batch_size": 32, "micro_batch_size": 4},
        "scheduler": {"policy": "static", "max_running_requests": 8},
        "emulated": dict(EMULATED_COSTS),
    }


def pools(device: str) -> dict:
    return {"rollout": "0-1", "train": "2-3"} if device == "cpu" else {"rollout": "0-3", "train": "4-7"}


def write_group(tmp_path: Path, device: str, jobs: dict[str, dict], **group) -> Path:
    for name, cfg in jobs.items():
        write_config(tmp_path / f"{name}.yaml", cfg)
    doc = {"group": {"dir": str(tmp_path / "group"), "pools": pools(device), "tail_fraction": 0.8, "tail_slots": 1,
                     "poll_interval_s": 0.02, "timeout_s": 600, "park_s": 0.02, **group},
           "jobs": {name: {"config": f"{name}.yaml", "slo": 2.0} for name in jobs}}
    path = tmp_path / "group.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def turns(group_dir: Path) -> dict[str, list[tuple[str, int]]]:
    """The (job, iteration) turns of each pool, in grant order."""
    paths = GroupPaths(group_dir)
    out: dict[str, list[tuple[str, int]]] = {"rollout": [], "train": []}
    for n in grant_numbers(paths):
        for pool, pg in read_grant(paths, n).pools.items():
            t = pg["turn"]
            if t is not None and (not out[pool] or out[pool][-1] != (t["job"], t["iteration"])):
                out[pool].append((t["job"], t["iteration"]))
    return out


def phases(group_dir: Path) -> list[dict]:
    return read_events(GroupPaths(group_dir), "phase")


def check_slots_exclusive(group_dir: Path) -> None:
    """On every slot, a job starts only after the previous holder parked and released it."""
    by_slot: dict[int, list[dict]] = {}
    for p in phases(group_dir):
        if not p.get("skipped"):
            by_slot.setdefault(p["slot"], []).append(p)
    assert by_slot
    for slot, items in by_slot.items():
        items.sort(key=lambda p: p["started_at"])
        for a, b in zip(items, items[1:]):
            assert b["granted_seen_at"] >= a["released_at"] - 1e-3, (slot, a, b)


def rollout_rows(run_dir: Path, k: int) -> dict[int, tuple[list[int], float, list[float]]]:
    """sample id -> (response ids, reward, sampled logprobs) of iteration ``k``."""
    from slurm_rl.data.reader import StageReader

    t = StageReader(run_dir, k, "rollouts", None, timeout_s=5).read_all()
    return {sid: (ids, r, lp) for sid, ids, r, lp in zip(
        t.column("sample_id").to_pylist(), t.column("response_ids").to_pylist(), t.column("reward").to_pylist(),
        t.column("sampled_logprobs").to_pylist())}


def check_same_computation(muxed: Path, alone: Path, cfg: dict) -> None:
    """Same sampled tokens and rewards for every sample, same per-step losses and final weights
    (within float noise on each quantity's scale: see ``identity``)."""
    for k in range(cfg["train"]["num_iterations"]):
        a, b = rollout_rows(muxed, k), rollout_rows(alone, k)
        assert {s: row[:2] for s, row in a.items()} == {s: row[:2] for s, row in b.items()}, k
        # the logprobs of the sampled tokens: equal up to the batch grouping's float noise
        assert max(abs(x - y) for s in a for x, y in zip(a[s][2], b[s][2])) <= LOGPROB_ATOL, k
    a = [x for m in read_metrics(muxed) for x in m["losses"]]
    b = [x for m in read_metrics(alone) for x in m["losses"]]
    assert len(a) == 4, a
    assert_losses_match(a, b)
    assert_params_match(muxed, alone, rtol=1e-5)


def run_group(path: Path):
    spec = prepare_group(path)
    return spec, run_group_local(spec.dir, log=lambda m: None)


def round_robin_jobs(device: str, tmp: Path) -> dict[str, dict]:
    """Two jobs of 2 iterations; the group file's order (b, a) is not the alphabetical one."""
    return {"b": job_config(device, tmp / "unused-b", seed=22), "a": job_config(device, tmp / "unused-a", seed=11)}


def shared_group(tmp_path_factory, device: str) -> Path:
    """The finished group of :func:`round_robin_jobs`, run once per session (the uninterrupted
    reference of the group requeue test too); its group dir."""
    def make(base: Path) -> tuple[Path, str]:
        spec, result = run_group(write_group(base, device, round_robin_jobs(device, base)))
        assert result.ok, result
        return spec.dir, ""

    return shared_run(shared_root(tmp_path_factory), f"mux-round-robin-{device}", make)[0]


@pytest.mark.slow
@pytest.mark.parametrize("device", BACKENDS)
def test_two_jobs_share_the_pools_round_robin(tmp_path: Path, tmp_path_factory, device: str) -> None:
    # the group file's order is the round-robin order (here not the alphabetical one)
    jobs = round_robin_jobs(device, tmp_path)
    group_dir = shared_group(tmp_path_factory, device)
    t = turns(group_dir)
    assert t["rollout"] == [("b", 0), ("a", 0), ("b", 1), ("a", 1)], t
    assert t["train"] == [("b", 0), ("a", 0), ("b", 1), ("a", 1)], t
    check_slots_exclusive(group_dir)
    done = [p for p in phases(group_dir) if not p.get("skipped")]
    assert all(p["resume_s"] >= 0 and p["park_s"] >= 0 for p in done)
    if device == "cpu":  # the real engines parked their state in host memory
        assert all(p["park_bytes"] > 0 for p in done if p["pool"] == "train")
    for name, cfg in jobs.items():
        job_dir = GroupPaths(group_dir).job_dir(name)
        check_every_sample_once(job_dir, cfg)
        assert [m["samples"] for m in read_metrics(job_dir)] == [cfg["train"]["rollout_batch_size"] * cfg["train"]["group_size"]] * 2
    if device == "cpu":  # multiplexing changes when a job runs, never what it computes
        for name, cfg in jobs.items():
            solo_dir = tmp_path / f"solo-{name}"
            solo = dict(cfg, runtime={**cfg["runtime"], "run_dir": str(solo_dir)})
            proc = subprocess.run([*CLI, "run",
                                   str(write_config(tmp_path / f"solo-{name}.yaml", solo)), "--no-inspect"],
                                  cwd=REPO, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            check_same_computation(GroupPaths(group_dir).job_dir(name), solo_dir, cfg)


@pytest.mark.slow
@pytest.mark.parametrize("device", BACKENDS)
def test_work_conserving_group_keeps_slots_exclusive_and_every_sample_once(tmp_path: Path, device: str) -> None:
    """``group.schedule: work_conserving`` (a free pool serves the next ready job): the grants follow
    it, each pool serves every phase of every job once, in on-policy order per job."""
    jobs = {"a": job_config(device, tmp_path / "unused-a", iterations=1, seed=31),
            "b": job_config(device, tmp_path / "unused-b", iterations=2, seed=32)}
    spec, result = run_group(write_group(tmp_path, device, jobs, schedule="work_conserving"))
    assert result.ok, result
    assert json.loads((spec.dir / "group.json").read_text())["schedule"] == "work_conserving"
    t = turns(spec.dir)
    for pool in ("rollout", "train"):
        for name, cfg in jobs.items():
            assert [k for j, k in t[pool] if j == name] == list(range(cfg["train"]["num_iterations"])), t
    check_slots_exclusive(spec.dir)
    for name, cfg in jobs.items():
        check_every_sample_once(GroupPaths(spec.dir).job_dir(name), cfg)


@pytest.mark.slow
@pytest.mark.parametrize("device", BACKENDS)
def test_long_tail_migration_moves_the_tail_and_loses_no_sample(tmp_path: Path, device: str) -> None:
    """The tail of a job's rollout ends on one slot; the next job starts on the freed ones.

    The tail must outlast a hand-over (the revoked rank's request in flight, park, two polls,
    resume: ~30-50 ms here) many times over, or whether the next job starts before it ends is a
    race: emulated, a heavier long tail (lengths up to 2048 tokens, decode 5x slower); cpu, longer
    responses in sub-batches of 2 and the tail moved at 60% so it holds ~15 requests."""
    jobs = {"a": job_config(device, tmp_path / "x", seed=5), "b": job_config(device, tmp_path / "y", seed=6)}
    for cfg in jobs.values():
        if device == "cpu":
            cfg["data"]["train_files"], cfg["model"]["max_position_embeddings"] = [str(TOY_DATA / "copy_12.jsonl")], 64
            cfg["rollout"]["max_new_tokens"] = 13
            cfg["rollout"]["sub_batch"], cfg["scheduler"]["max_running_requests"] = 2, 32
        else:
            cfg["emulated"].update(rollout_s_per_token=1.0e-4, response_len_max=2048, response_len_sigma=1.5)
    spec, result = run_group(write_group(tmp_path, device, jobs, tail_fraction=0.6 if device == "cpu" else 0.8))
    assert result.ok, result
    revoked = [p for p in phases(spec.dir) if p.get("revoked")]
    assert revoked and all(p["pool"] == "rollout" for p in revoked)
    # the next job started on a freed slot while the tail of the previous one still ran
    overlap = False
    by_job_it: dict[tuple[str, int], list[dict]] = {}
    for p in phases(spec.dir):
        if p["pool"] == "rollout" and not p.get("skipped"):
            by_job_it.setdefault((p["job"], p["iteration"]), []).append(p)
    for (job, k), items in by_job_it.items():
        tail_end = max(p["ended_at"] for p in items)
        others = [p for (j, _), ps in by_job_it.items() if j != job for p in ps]
        overlap |= any(tail_end > o["started_at"] > min(p["started_at"] for p in items) for o in others)
    assert overlap
    for name, cfg in jobs.items():
        check_every_sample_once(GroupPaths(spec.dir).job_dir(name), cfg)


def _kill_rank_when_granted(group_dir: Path, job: str, rank: int, stop: threading.Event) -> None:
    """SIGKILL the rank once its job had a phase: the rank's pid from its heartbeat (a rank forked by
    the local launcher's fork server shows the server's cmdline and environ, not its own)."""
    paths = GroupPaths(group_dir)
    job_paths = RunPaths(paths.job_dir(job))  # this group's job: other tests may run groups with a job of that name
    while not stop.is_set():
        if any(p.get("job") == job for p in read_events(paths, "phase")):
            beat = read_heartbeat(job_paths, rank)
            if beat is not None:
                os.kill(int(beat["pid"]), signal.SIGKILL)
                return
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("device", BACKENDS)
def test_a_job_failing_inside_a_group_leaves_the_others_running(tmp_path: Path, device: str) -> None:
    """A rollout rank of job b is SIGKILLed after b's first phase: b fails, a finishes alone."""
    jobs = {"a": job_config(device, tmp_path / "x", iterations=3), "b": job_config(device, tmp_path / "y", iterations=3)}
    if device == "cpu":  # b's surviving ranks notice the dead one quickly
        jobs["b"]["runtime"].update(heartbeat_timeout_s=10.0, wait_timeout_s=30.0)
    path = write_group(tmp_path, device, jobs)
    spec = prepare_group(path)
    stop = threading.Event()
    victim = 3 if device == "cpu" else 5
    killer = threading.Thread(target=_kill_rank_when_granted, args=(spec.dir, "b", victim, stop), daemon=True)
    killer.start()
    try:
        result = run_group_local(spec.dir, log=lambda m: None)
    finally:
        stop.set()
    assert result.jobs["a"] == "finished", result
    assert result.jobs["b"].startswith("failed"), result
    assert result.scheduler_rc == 1
    failed = read_events(GroupPaths(spec.dir), "job_failed")
    assert [e["job"] for e in failed] == ["b"]
    check_every_sample_once(GroupPaths(spec.dir).job_dir("a"), jobs["a"])
    # after b left, a alone took every later turn
    t = turns(spec.dir)
    assert t["train"][-1] == ("a", 2)


def test_bad_group_file_exits_2_naming_each_key(tmp_path: Path) -> None:
    good = job_config("emulated", tmp_path / "x")
    write_config(tmp_path / "a.yaml", good)
    auto = dict(good, scheduler={"policy": "auto"}, cluster={**good["cluster"], "auto_scheduler": True,
                                                             "component_placement": {"actor": "0-1", "rollout": "2-5",
                                                                                     "inference": "6-7"}})
    write_config(tmp_path / "b.yaml", auto)
    doc = {"group": {"dir": str(tmp_path / "g"), "pools": {"rollout": "0-3", "train": "3-6"}, "tail_fraction": 1.5,
                     "colour": "red"},
           "jobs": {"a": {"config": "a.yaml", "slo": 0.5, "overrides": ["train.num_iterations=0"]},
                    "b": {"config": "b.yaml"}, "Bad Name": {"config": "a.yaml"}}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.run([*CLI, "mux", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for key in ("group.pools.train", "group.tail_fraction", "group.colour", "jobs.a.slo",
                "jobs.a.config: train.num_iterations", "jobs.b.config", "jobs.Bad Name"):
        assert key in proc.stderr, (key, proc.stderr)
    assert "scheduler.policy static" in proc.stderr
    assert not (tmp_path / "g").exists()  # nothing created, nothing launched


def sbatch_mux(slurm_cluster, tmp_path: Path, group: Path, *opts: str) -> str:
    """``sbatch OPTS sbatch/mux.sh GROUP`` on the local cluster, waited for; the job log (exit 0 asserted)."""
    log = tmp_path / "job.out"
    rc, _ = slurm_cluster.sbatch_wait(f"--output={log}", *opts, "sbatch/mux.sh", str(group), cwd=REPO)
    text = log.read_text() if log.exists() else ""
    assert rc == 0, text
    return text


@pytest.mark.slow
@pytest.mark.slurm
def test_sbatch_mux_runs_the_group_on_real_slurm(slurm_cluster, tmp_path: Path) -> None:
    """sbatch/mux.sh: the group scheduler in the batch script, one srun step per job."""
    jobs = {"a": job_config("emulated", tmp_path / "x", seed=1), "b": job_config("emulated", tmp_path / "y", seed=2)}
    path = write_group(tmp_path, "emulated", jobs)
    text = sbatch_mux(slurm_cluster, tmp_path, path, "--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4")
    group_dir = tmp_path / "group"
    lines = text.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("slurm_rl: EMULATING: runtime.device is emulated")]
    assert said and said == list(range(len(said))), text  # first: the jobs emulate on an allocation with GPUs
    assert lines[len(said)] == f"slurm_rl group dir: {group_dir}"
    assert "job a finished" in text and "job b finished" in text, text
    t = turns(group_dir)
    assert t["rollout"] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)], t
    check_slots_exclusive(group_dir)
    hosts = {json.loads(p.read_text())["host"] for p in (group_dir / "jobs" / "a" / "control" / "heartbeats").glob("*.json")}
    assert len(hosts) == 2, hosts  # the ranks ran on the job's two nodes
    for name, cfg in jobs.items():
        check_every_sample_once(GroupPaths(group_dir).job_dir(name), cfg)


@pytest.mark.slow
@pytest.mark.slurm
def test_sbatch_mux_rejects_a_bad_group_with_exit_2(slurm_cluster, tmp_path: Path) -> None:
    write_config(tmp_path / "a.yaml", job_config("emulated", tmp_path / "x"))
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"group": {"dir": str(tmp_path / "g"), "pools": {"rollout": "0-3", "train": "2-7"}},
                                    "jobs": {"a": {"config": "a.yaml"}}}))
    log = tmp_path / "job.out"
    rc, _ = slurm_cluster.sbatch_wait("--nodes=1", "--ntasks-per-node=1", f"--output={log}", "sbatch/mux.sh",
                                      str(path), cwd=REPO, timeout=300)
    assert rc == 2, log.read_text() if log.exists() else ""
    assert "group.pools.train" in log.read_text()
    assert not (tmp_path / "g").exists()


@pytest.mark.slow
@pytest.mark.slurm
def test_submitit_runs_a_group_on_real_slurm(slurm_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_rl.mux.launcher import submit_group

    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    jobs = {"a": job_config("emulated", tmp_path / "x", seed=3), "b": job_config("emulated", tmp_path / "y", seed=4)}
    job = submit_group(write_group(tmp_path, "emulated", jobs), executor="slurm")
    assert job.results() == [{"a": "finished", "b": "finished"}]
    group_dir = tmp_path / "group"
    assert turns(group_dir)["train"] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    for name, cfg in jobs.items():
        check_every_sample_once(GroupPaths(group_dir).job_dir(name), cfg)


def test_example_group_files_load() -> None:
    from slurm_rl.mux.group_file import load_group

    paths = sorted((REPO / "configs").rglob("group*.yaml"))
    assert paths
    for path in paths:
        spec = load_group(path)
        assert len(spec.jobs) >= 2 and set(spec.pools) == {"rollout", "train"}
        for job in spec.jobs:  # every rank sits on one slot of one pool
            assert sorted(job.rank_slots) == list(range(job.cfg.placement.world_size))


@pytest.mark.slow
@pytest.mark.slurm
def test_sbatch_mux_two_pools_as_a_heterogeneous_job(slurm_cluster, tmp_path: Path) -> None:
    """Component 0 (one node) holds the training pool, component 1 (another node) the rollout pool."""
    jobs = {"a": job_config("emulated", tmp_path / "x", seed=7), "b": job_config("emulated", tmp_path / "y", seed=8)}
    path = write_group(tmp_path, "emulated", jobs)
    text = sbatch_mux(slurm_cluster, tmp_path, path, "--nodes=1", "--ntasks-per-node=4", "--gres=gpu:4", ":",
                      "--nodes=1", "--ntasks-per-node=4", "--gres=gpu:4")
    assert "heterogeneous allocation, 2 components, 8 tasks" in text, text
    group_dir = tmp_path / "group"
    for name, cfg in jobs.items():
        job_dir = GroupPaths(group_dir).job_dir(name)
        hosts = {r: json.loads((job_dir / "control" / "heartbeats" / f"rank-{r:04d}.json").read_text())["host"]
                 for r in range(8)}
        train, rollout = {hosts[r] for r in range(4)}, {hosts[r] for r in range(4, 8)}
        assert len(train) == 1 and len(rollout) == 1 and train != rollout, hosts
        check_every_sample_once(job_dir, cfg)
    assert turns(group_dir)["train"] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


@pytest.mark.parametrize("override, key, text", [
    ("jobs.sft-like.slo=2.0", "jobs.sft-like.slo", "predicted 2."),
    ("group.host_memory_gb=10", "group.host_memory_gb", "park 14.4 GB on node 0"),
])
def test_admission_refuses_a_group_that_breaks_an_slo_or_residency(tmp_path: Path, override: str, key: str,
                                                                   text: str) -> None:
    """A member predicted slower than its SLO, or parked state beyond host memory: exit 2, the key named,
    nothing created — refused, not slowed silently. The example group itself is admitted."""
    group = REPO / "configs" / "examples" / "mux" / "group_2x8.yaml"
    proc = subprocess.run([*CLI, "mux", str(group), override,
                           f"group.dir={tmp_path / 'g'}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert key in proc.stderr and text in proc.stderr, proc.stderr
    assert not (tmp_path / "g").exists()
    ok = subprocess.run([*CLI, "mux", "--prepare-only", str(group),
                         f"group.dir={tmp_path / 'ok'}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    admission = json.loads((tmp_path / "ok" / "group.json").read_text())["admission"]
    assert admission["slo_checked"] and 2.0 < admission["predicted_slowdown"]["expected_lengths"]["sft-like"] <= 3.0


@pytest.mark.slow
def test_a_group_of_weave_jobs_runs_as_the_group_simulator_predicts(tmp_path: Path) -> None:
    """Two emulated jobs shaped like weave-trace jobs (``tools/live_mux.weave_group_file``: budget,
    length distribution and rollout/training ratio of a reasoning and an agentic job) run as one
    group for real: its span is the group simulator's prediction within 10 %, and every sample of
    every job is produced and trained once."""
    import importlib.util

    from slurm_rl.inspect.group_timeline import group_report_json
    from slurm_rl.mux.group_file import load_group
    from slurm_rl.mux.predict import predict_group

    mod_spec = importlib.util.spec_from_file_location("live_mux", REPO / "tools" / "live_mux.py")
    assert mod_spec is not None and mod_spec.loader is not None
    live_mux = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(live_mux)
    path = live_mux.weave_group_file(tmp_path, seed=0, iterations=3)
    spec = load_group(path)
    predicted = predict_group([j.cfg for j in spec.jobs], [j.name for j in spec.jobs], spec.pools["rollout"],
                              spec.pools["train"], spec.tail_fraction, spec.tail_slots,
                              {"rollout": 2 * spec.park_s, "train": 2 * spec.park_s})
    proc = subprocess.run([*CLI, "mux", str(path)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    span = float(group_report_json(spec.dir)["span"]["seconds"])
    assert abs(span / predicted["makespan_s"] - 1.0) <= 0.10, (span, predicted["makespan_s"])
    for job in spec.jobs:
        check_every_sample_once(GroupPaths(spec.dir).job_dir(job.name), yaml.safe_load(job.config_path.read_text()))
