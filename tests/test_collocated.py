"""Collocated placement (RLinf's ``actor,rollout,inference: all``): every rank serves every component
and time-slices them within an iteration — rollout, then inference, then training.

A collocated run on 2 ranks, stopped at iteration 2 and resumed, ends as the uninterrupted
disaggregated reference run of the resume tests (actor 0-1, rollout 2, inference 3) on both computes:
the same prompts, samples, rewards and, on cpu, per-step losses and final weights. No mini-batch
starts before the iteration's last response is generated and scored, and the weight sync moves no
bytes (each rank's engines take its own replica of the actor). A whole job on one rank and a
hybrid placement (actor and rollout shared, inference apart) run every iteration too, and a collocated
job on two Slurm nodes trains as the reference.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from resume_helpers import BACKENDS, assert_same_outcome, cli, run_config, run_until_stopped, without_kl
from slurm_rl.control.activity import read_spans
from slurm_rl.control.epochs import EpochStore
from slurm_rl.control.paths import RunPaths
from slurm_rl.data.layout import stage_dir
from slurm_rl.data.manifest import ProducerManifest
from slurm_rl.data.reader import StageReader
from slurm_rl.metrics import read_metrics
from emulated_configs import write_config

REPO = Path(__file__).resolve().parents[1]
COLLOCATED = {"actor,rollout,inference,reward": "all"}  # RLinf's collocated form (reward beside the rollout)


def collocated_config(backend: str, run_dir: Path) -> dict:
    cfg = run_config(backend, run_dir, keep_iterations=10)
    cfg["cluster"].update(gpus_per_node=2, component_placement=dict(COLLOCATED))
    # RLinf's offload keys: the actor's state waits in host memory while its ranks generate and score
    cfg["actor"] = {**cfg.get("actor", {}), "offload_weight": True, "offload_grad": True, "offload_optimizer": True}
    return cfg


def check_phases_in_order(run_dir: Path, k: int, shared_inference: bool = True, actor_waits: bool = True) -> None:
    """In iteration ``k`` every response was generated before any was scored (where the inference
    ranks also decode), and every one was scored (its inference shard written) before the first
    mini-batch was stamped (``actor_waits``: the actor's ranks also generate or score, or the actor waits for
    every sample); an actor on ranks of its own beside a shared scorer may start as soon as its first mini-batch is
    scored: its first mini-batch then starts after the first shard, its last after the last."""
    rollouts = StageReader(run_dir, k, "rollouts", None, timeout_s=5).read_all()
    last_generated = max(rollouts.column("t_end").to_pylist())
    stage = stage_dir(run_dir, k, "inference")
    shards = [s for m in sorted(stage.glob("manifest-*.json"))
              for s in ProducerManifest.load(m, iteration=k, stage="inference",
                                             producer_rank=int(m.stem.split("-")[1])).shards]
    if shared_inference:
        assert min(s.created_at for s in shards) >= last_generated, k
    plan = json.loads((stage_dir(run_dir, k, "actor_batch") / "plan.json").read_text())
    starts = [m["start_at"] for m in plan["minibatches"]]
    if actor_waits:
        assert min(starts) >= max(s.created_at for s in shards), k
    else:
        assert min(starts) >= min(s.created_at for s in shards) and max(starts) >= max(s.created_at for s in shards), k


@pytest.mark.slow  # three runs: the suite's, not the quick loop's (as the DAPO and PPO resume checks)
@pytest.mark.parametrize("backend,packed", [(b, False) for b in BACKENDS] + [("cpu", True)])
def test_collocated_run_stopped_and_resumed_ends_as_the_disaggregated_one(backend: str, packed: bool, reference,
                                                                          packed_reference, tmp_path: Path) -> None:
    """Also with packed micro-batches (``train.use_remove_padding``, cpu) against the padded reference (both without
    a KL: ``resume_helpers.without_kl`` says why)."""
    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    cfg = collocated_config(backend, run_dir)
    if packed:
        cfg = without_kl(cfg)
        cfg["train"] |= {"use_remove_padding": True, "max_tokens_per_microbatch": 40}
    config.write_text(yaml.safe_dump(cfg))
    run_until_stopped(config, run_dir, at_iteration=2)
    assert [m["iteration"] for m in read_metrics(run_dir)] == [0, 1]
    resumed = cli("run", "--resume", str(run_dir), "--no-inspect")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_same_outcome(run_dir, (packed_reference if packed else reference)(backend),
                        params_rtol=3e-5 if packed else 1e-6)  # packed: see test_resume
    for epoch in EpochStore(RunPaths(run_dir)).all():
        assert epoch.ranks_of("actor") == epoch.ranks_of("rollout") == epoch.ranks_of("inference") == [0, 1]
    for k in range(4):
        check_phases_in_order(run_dir, k)
    # every iteration each rank parked its actor state to generate, and (cpu) the rollout engine to train;
    # the emulated compute charges the cost model's offload time for the same moves (the simulator's too)
    for rank in (0, 1):
        offloads = [s for s in read_spans(RunPaths(run_dir), rank) if s["kind"] == "offload"]
        assert [s["phase"] for s in offloads] == ["generate", "train"] * 4, offloads
        assert all(s["bytes"] > 0 for s in offloads)
    if backend == "cpu":  # both ranks hold the whole actor (TP 1): their engines took their own weights
        assert [m["sync_bytes"] for m in read_metrics(run_dir)] == [0] * 4
        assert all(m["sync_bytes"] > 0 for m in read_metrics(reference(backend)))


def test_validate_names_the_mode_and_each_ranks_components(tmp_path: Path) -> None:
    cfg = collocated_config("emulated", tmp_path / "run")
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mode: collocated" in proc.stdout and "ranks 0-1" in proc.stdout, proc.stdout
    assert "actor, rollout, inference" in proc.stdout
    cfg["cluster"].update(gpus_per_node=4, component_placement={"actor,rollout": "0-1", "inference": "2-3"})
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 0 and "mode: hybrid" in proc.stdout, proc.stdout + proc.stderr
    # auto pins the shared ranks (tests/test_bad_input.py: what it refuses); plan chooses co-location by itself
    cfg["cluster"]["auto_scheduler"], cfg["scheduler"]["policy"] = True, "auto"
    assert cli("validate", str(write_config(tmp_path / "c.yaml", cfg))).returncode == 0
    cfg["scheduler"]["policy"] = "plan"
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 2 and "a disaggregated placement (it time-slices every rank in the iterations it " \
        "runs collocated: scheduler.time_slicing)" in proc.stderr, proc.stdout + proc.stderr


def test_a_collocated_placement_whose_phases_cannot_fit_is_refused(tmp_path: Path) -> None:
    """On cuda, a shared rank's phases must fit in one GPU (``slurm_rl/memory_fit.py``, a lower bound): with
    ``runtime.gpu_memory_gb`` below what the actor's state, the rollout engine and the scorers need, validate
    exits 2 naming the placement and what to change; with room it prints what each phase holds."""
    cfg = run_config("cpu", tmp_path / "run")
    cfg["runtime"]["device"] = "cuda"
    cfg["cluster"].update(gpus_per_node=2, component_placement={"actor,rollout,inference": "all"})
    cfg["runtime"]["gpu_memory_gb"] = 1e-4  # 100 kB: the quick model's state alone is larger
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cluster.component_placement" in proc.stderr and "phases that fit in one GPU" in proc.stderr
    assert "ranks [0, 1] serve actor, rollout, inference" in proc.stderr and "actor.offload_weight" in proc.stderr
    cfg["runtime"]["gpu_memory_gb"] = 80.0
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "memory at least: generate" in proc.stdout and "of 80.0 GB" in proc.stdout, proc.stdout


def test_plan_time_slicing_is_checked_and_said(tmp_path: Path) -> None:
    """Under ``plan`` validate says whether plan may run an iteration collocated. On cuda every component must
    then fit one GPU: left null (the default) plan runs every iteration disaggregated where they cannot (and
    the run's config says so), ``true`` exits 2 naming ``scheduler.time_slicing``, ``false`` switches it off.
    ``true`` also exits 2 where plan could never run an iteration collocated, and under another policy."""
    from slurm_rl.config import load_config
    from slurm_rl.launch.prepare import prepare_run
    from slurm_rl.scheduler.live_state import start_placement

    cfg = run_config("cpu", tmp_path / "run")
    cfg["cluster"].update(gpus_per_node=4, auto_scheduler=True,
                          component_placement={"actor": "0", "rollout": "1-2", "inference": "3"})
    cfg["scheduler"]["policy"] = "plan"
    cfg["train"].update(global_batch_size=8, micro_batch_size=2)
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "time slicing: plan may run an iteration collocated" in proc.stdout, proc.stdout
    assert start_placement(load_config(tmp_path / "c.yaml", env={}))["actor"] == (0, 1, 2, 3)  # epoch 0: every rank
    cfg["runtime"].update(device="cuda", gpu_memory_gb=1e-4)  # 100 kB: no component fits
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "time slicing: off (every component on one GPU would need at least generate" in proc.stdout, proc.stdout
    _, run_dir = prepare_run(tmp_path / "c.yaml")  # what the run's coordinator and a resume read
    assert load_config(run_dir / "config.yaml", env={}).scheduler.time_slicing is False
    assert start_placement(load_config(run_dir / "config.yaml", env={}))["actor"] == (0,)  # starts as configured
    cfg["scheduler"]["time_slicing"] = True
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "scheduler.time_slicing: got True" in proc.stderr and "actor, rollout, inference on every rank" in proc.stderr
    cfg["scheduler"]["time_slicing"] = False
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "time slicing: off (scheduler.time_slicing is false)" in proc.stdout, proc.stdout
    # true where plan could never run an iteration collocated, or under a policy that never chooses: exit 2
    cfg["runtime"].update(device="cpu", gpu_memory_gb=None)
    cfg["scheduler"]["time_slicing"] = True
    cfg["train"].update(micro_batch_size=4)  # the actor at DP 4 cannot split 8 samples into micro-batches of 4
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("scheduler.time_slicing: got True; allowed: false or null here: plan cannot run an iteration "
            "collocated (the actor at DP 4 on every rank cannot split") in proc.stderr, proc.stderr
    cfg["train"].update(micro_batch_size=2)
    cfg["scheduler"]["policy"] = "auto"
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "scheduler.time_slicing: got True; allowed: null or false under scheduler.policy 'auto'" in proc.stderr


def test_phase_memory_counts_what_each_phase_holds(tmp_path: Path) -> None:
    """The fit check's arithmetic for 1e9 parameters in fp32 on an 80 GB GPU: while generating, the hf engine's
    weights, the reference and the old log-probs' copy (4 bytes a parameter each) and the actor's 16 bytes a
    parameter unless offloaded; while training, the actor and the scorers; vLLM takes its memory share."""
    from slurm_rl.config import config_from_mapping
    from slurm_rl.memory_fit import phase_memory

    cfg = run_config("cpu", tmp_path / "run")
    cfg["runtime"].update(device="cuda", gpu_memory_gb=80.0)
    cfg["actor"] = {**cfg.get("actor", {}), "precision": "fp32"}
    cfg["algorithm"] = {**cfg.get("algorithm", {}), "kl_coef": 0.01, "old_logprobs": "actor"}
    cfg["cluster"].update(gpus_per_node=2, component_placement={"actor,rollout,inference": "all"})
    (pm,) = phase_memory(config_from_mapping(cfg), int(1e9))
    assert pm.ranks == (0, 1) and pm.budget == 80e9
    assert pm.generate == {"rollout": 4e9, "reference": 4e9, "old log-probs": 4e9, "actor kept": 16e9}
    assert pm.train == {"actor": 16e9, "reference": 4e9, "old log-probs": 4e9} and pm.need == 28e9
    cfg["actor"]["offload_weight"] = True
    cfg["rollout"] = {**cfg.get("rollout", {}), "backend": "vllm", "gpu_memory_utilization": 0.5}
    (pm,) = phase_memory(config_from_mapping(cfg), int(1e9))
    assert pm.generate == {"rollout": 40e9, "reference": 4e9, "old log-probs": 4e9} and pm.need == 48e9
    assert pm.train == {"actor": 16e9}  # the scorers park with the actor's offload while the rank trains
    cfg["cluster"]["component_placement"] = {"actor": 0, "rollout,inference": 1}  # the actor on a rank of its own
    (pm,) = phase_memory(config_from_mapping(cfg), int(1e9))
    assert pm.ranks == (1,) and pm.train == {"reference": 4e9, "old log-probs": 4e9} and pm.need == 48e9


@pytest.mark.parametrize(("backend", "slots", "placement", "mode"), [
    ("emulated", 1, {"actor,rollout,inference,reward": 0}, "collocated"),
    pytest.param("cpu", 1, {"actor,rollout,inference": 0}, "collocated", marks=pytest.mark.slow),
    ("emulated", 3, {"actor,rollout": "0-1", "inference": 2, "reward": "all"}, "hybrid"),
    # PPO: RLinf's one-GPU layout with the critic (its inference part scores the values)
    pytest.param("cpu", 1, {"actor,critic,rollout,inference": 0}, "collocated", marks=pytest.mark.slow),
])
def test_one_gpu_and_hybrid_jobs_run_every_iteration(backend: str, slots: int, placement: dict, mode: str,
                                                     tmp_path: Path) -> None:
    """A whole job on one rank (RLinf's single-GPU example), and a hybrid one: every iteration trains
    every sample, after its responses are generated and scored."""
    cfg = run_config(backend, tmp_path / "run", keep_iterations=10)
    cfg["cluster"].update(gpus_per_node=slots, component_placement=placement)
    ppo = any("critic" in key for key in placement)
    if ppo:
        cfg["algorithm"]["adv_estimator"] = "gae"
    proc = cli("run", str(write_config(tmp_path / "c.yaml", cfg)), "--no-inspect")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = read_metrics(tmp_path / "run")
    per_iteration = cfg["train"]["rollout_batch_size"] * cfg["train"]["group_size"]
    assert [m["samples"] for m in metrics] == [per_iteration] * len(metrics) and len(metrics) == 4
    if backend == "cpu":
        assert all(len(m["losses"]) == 2 for m in metrics)
        assert all(len(m.get("critic/vf_losses") or []) == (2 if ppo else 0) for m in metrics)
    for k in range(4):  # hybrid: the inference rank scores as responses stream in, the actor waits for it
        check_phases_in_order(tmp_path / "run", k, shared_inference=mode == "collocated")
    validate = cli("validate", str(tmp_path / "c.yaml"))
    assert f"mode: {mode}" in validate.stdout, validate.stdout


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("placement", "stop_at"), [
    ({"actor,rollout": "0", "inference": "1"}, None),
    ({"actor": "0", "rollout,inference": "1"}, 2),  # stopped at the gate of iteration 2 and resumed
], ids=["actor-shared", "scorer-shared-resumed"])
def test_auto_grows_a_hybrid_actor_into_ranks_freed_by_finished_components(backend: str, placement: dict,
                                                                            stop_at: int | None, reference,
                                                                            tmp_path: Path) -> None:
    """``auto`` on a hybrid placement pins the shared rank: it keeps its components while any has work, and the
    actor grows onto the rank that frees up (DP 1 -> 2) once its components finished; every iteration starts from
    the hybrid placement again. With the actor shared with the rollout (rank 0) the inference rank joins before
    the first mini-batch (the actor waits for every sample, and the boundary handshake lets auto see them all
    scored); with the rollout and inference shared (rank 1) the rank joins once it has generated and scored
    everything, by the last mini-batch at the latest. The run, also stopped and resumed, trains as the
    disaggregated reference (actor DP 2 on ranks of its own): the same prompts, rewards and, on cpu, per-step
    losses and final weights."""
    run_dir = tmp_path / "run"
    cfg = run_config(backend, run_dir, keep_iterations=10)
    cfg["cluster"].update(gpus_per_node=2, auto_scheduler=True, component_placement=placement)
    cfg["scheduler"] = {**cfg["scheduler"], "policy": "auto"}
    config = write_config(tmp_path / "c.yaml", cfg)
    if stop_at is None:
        proc = cli("run", str(config), "--no-inspect")
    else:
        run_until_stopped(config, run_dir, at_iteration=stop_at)
        assert [m["iteration"] for m in read_metrics(run_dir)] == list(range(stop_at))
        proc = cli("run", "--resume", str(run_dir), "--no-inspect")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_same_outcome(run_dir, reference(backend))
    hybrid = {c: sorted(r for key, ranks in placement.items() if c in key.split(",") for r in [int(ranks)])
              for c in ("actor", "rollout", "inference")}
    epochs = EpochStore(RunPaths(run_dir)).all()
    for k in range(4):
        mine = [e for e in epochs if e.iteration == k]
        start = [e for e in mine if e.boundary == "iteration"] or [e for e in epochs if e.epoch == 0]
        assert {c: start[-1].ranks_of(c) for c in hybrid} == hybrid, (k, [e.to_json() for e in mine])
        grown = [e for e in mine if e.ranks_of("actor") == [0, 1]]
        assert grown and not grown[0].ranks_of("rollout") and not grown[0].ranks_of("inference"), \
            (k, [e.to_json() for e in mine])
        plan = json.loads((stage_dir(run_dir, k, "actor_batch") / "plan.json").read_text())
        dps = [m["dp"] for m in plan["minibatches"]]
        assert dps == [2, 2] if "actor,rollout" in placement else dps[-1] == 2, (k, plan["minibatches"])
        # the scorer shared with the rollout (rank 1) scores in shards; the actor alone on rank 0 starts on the first
        check_phases_in_order(run_dir, k, shared_inference="rollout,inference" in placement,
                              actor_waits="actor,rollout" in placement)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_node_collocated_job_through_sbatch_trains_as_the_disaggregated_one(slurm_cluster, backend: str,
                                                                                reference, tmp_path: Path) -> None:
    """RLinf's two-node collocated example as an sbatch job (2 nodes x 1 GPU here, every component on every
    GPU): the ranks ran on both nodes, each iteration generated, then scored, then trained, and the run
    trained as the disaggregated reference (the same prompts, rewards and, on cpu, per-step losses and final
    weights)."""
    run_dir = tmp_path / "run"
    cfg = collocated_config(backend, run_dir)
    cfg["cluster"]["num_nodes"] = 2
    del cfg["cluster"]["gpus_per_node"]  # from the allocation
    log = tmp_path / "job.out"
    rc, _ = slurm_cluster.sbatch_wait("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1", f"--output={log}",
                                      "sbatch/train.sh", str(write_config(tmp_path / "c.yaml", cfg)), cwd=REPO,
                                      timeout=900)
    assert rc == 0, log.read_text() if log.exists() else ""
    assert_same_outcome(run_dir, reference(backend))
    hosts = {json.loads(p.read_text())["host"] for p in (run_dir / "control" / "acks" / "000000").glob("rank-*.json")}
    assert len(hosts) == 2, hosts
    for epoch in EpochStore(RunPaths(run_dir)).all():
        assert epoch.ranks_of("actor") == epoch.ranks_of("rollout") == epoch.ranks_of("inference") == [0, 1]
    for k in range(4):
        check_phases_in_order(run_dir, k)


def test_an_actor_dp_the_mini_batch_cannot_split_is_refused_before_launch(tmp_path: Path) -> None:
    """Collocated on 4 ranks, a mini-batch of 8 in micro-batches of 4 cannot split over DP 4: validate (and so
    run, submit, sbatch/train.sh) exits 2 naming the actor's entry and the DP sizes that would do, where the
    ranks used to fail at start; the emulated compute, which splits nothing, takes it."""
    cfg = collocated_config("cpu", tmp_path / "run")
    cfg["cluster"]["gpus_per_node"] = 4
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("cluster.component_placement.actor: got 'all'" in proc.stderr and "DP 4 does not divide "
            "train.global_batch_size 8 into micro-batches of train.micro_batch_size 4 (DP sizes 1, 2 do)" in proc.stderr)
    assert not (tmp_path / "run").exists()
    emulated = collocated_config("emulated", tmp_path / "run")
    emulated["cluster"]["gpus_per_node"] = 4
    assert cli("validate", str(write_config(tmp_path / "e.yaml", emulated))).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_changes_mode_at_iteration_boundaries_and_trains_as_the_reference(backend: str, reference,
                                                                                tmp_path: Path) -> None:
    """Placement is data, modes included: a scripted run starts disaggregated (actor 0-1, rollout 2,
    inference 3), is collocated on ranks 0-1 for iterations 1-2 (ranks 2-3 idle) and disaggregated again from
    iteration 3. Only the collocated iterations time-slice (park the actor's state to generate, bring it back
    to train; on cpu their weight sync moves no bytes), and the run trains as the disaggregated reference."""
    cfg = run_config(backend, tmp_path / "run", keep_iterations=10)
    cfg["actor"] = {**cfg.get("actor", {}), "offload_weight": True}
    cfg["scheduler"] = {**cfg.get("scheduler", {}), "policy": "scripted", "script": [
        {"at_iteration": 1, "placement": {"actor,rollout,inference": "0-1"}, "reason": "collocate"},
        {"at_iteration": 3, "placement": {"actor": "0-1", "rollout": "2", "inference": "3"}, "reason": "disaggregate"}]}
    proc = cli("run", str(write_config(tmp_path / "c.yaml", cfg)), "--no-inspect")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = tmp_path / "run"
    assert_same_outcome(run_dir, reference(backend))
    modes = [(e.iteration, e.ranks_of("rollout"), e.ranks_of("inference")) for e in EpochStore(RunPaths(run_dir)).all()]
    assert modes == [(0, [2], [3]), (1, [0, 1], [0, 1]), (3, [2], [3])], modes
    offloads = [s for s in read_spans(RunPaths(run_dir), 0) if s["kind"] == "offload"]
    assert [s["phase"] for s in offloads] == ["generate", "train"] * 2, offloads
    for k in (1, 2):
        check_phases_in_order(run_dir, k)
    if backend == "cpu":
        assert [m["sync_bytes"] > 0 for m in read_metrics(run_dir)] == [True, False, False, True]
