"""The simulator's collocated mode: every GPU serves rollout, then inference, then training, inside each
iteration (the phases a collocated run's shared ranks time-slice), the actor's offload charged per switch."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from cli_command import CLI
from slurm_rl.config import config_from_mapping
from slurm_rl.scheduler.cost_model import CostModel
from slurm_rl.scheduler.profiles import math_rl
from slurm_rl.scheduler.simulate import simulate
from slurm_rl.scheduler.simulator import SimulationSetupError

GPUS = 8


def _config(**changes: dict) -> dict:
    cfg = math_rl(GPUS, num_iterations=3)
    for section, values in changes.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    return cfg


def test_collocated_phases_take_every_gpu_in_order() -> None:
    """Each iteration: all 8 GPUs decode, then all score, then all train — three placement changes, in that
    order — and no phase starts before the one before it has ended."""
    report = simulate(config_from_mapping(_config()), policy="collocated")
    for it in report.iterations:
        ph = it.phases
        assert ph["rollout_end_s"] <= ph["inference_end_s"] <= ph["last_minibatch_start_s"] <= it.time_s
        # every rank scores once the rollout ended, trains once inference ended, and decodes again once the
        # last mini-batch ended (the next iteration's first phase; iteration 0 starts with it)
        shapes = [(d["t"], d["placement"]) for d in it.decisions]
        assert shapes[-3:] == [(pytest.approx(ph["rollout_end_s"], abs=1e-3), {"rollout": 0, "inference": GPUS, "actor": 0}),
                               (pytest.approx(ph["inference_end_s"], abs=1e-3), {"rollout": 0, "inference": 0, "actor": GPUS}),
                               (pytest.approx(it.time_s, abs=1e-3), {"rollout": GPUS, "inference": 0, "actor": 0})]
        assert len(shapes) == (4 if it.iteration == 0 else 3)
        # no GPU left unassigned, and none held by a component that has nothing to do for long
        assert it.unassigned_gpu_s == pytest.approx(0.0, abs=1e-6)


def test_a_collocated_placement_under_static_is_simulated_time_sliced() -> None:
    """``static`` on RLinf's ``actor,rollout,inference: all`` is the collocated mode (the ranks time-slice);
    offloading the actor adds its move to host memory and back to every later iteration."""
    shared = _config(cluster={"component_placement": {"actor,rollout,inference": "all"}})
    time_sliced = simulate(config_from_mapping(shared))
    assert time_sliced.policy == "collocated"
    assert time_sliced.mean_iteration_s == pytest.approx(
        simulate(config_from_mapping(_config()), policy="collocated").mean_iteration_s)
    offloaded = simulate(config_from_mapping({**shared, "actor": {"offload_weight": True}}))
    per_switch = CostModel.from_config(config_from_mapping(shared).emulated).offload_seconds()
    assert per_switch > 1.0  # 7B parameters of fp32 state and Adam moments at 20 GB/s
    for a, b in zip(offloaded.iterations[1:], time_sliced.iterations[1:]):  # offload after training, onload before
        # each move delays the phase after it (deterministic: iteration 2 by exactly two moves; iteration 1's
        # rollout ended 0.95 s later still, the decode instances having been rebuilt later)
        assert 2 * per_switch - 1e-6 <= a.time_s - b.time_s <= 2.2 * per_switch, (a.time_s, b.time_s, per_switch)


@pytest.mark.parametrize("gpus", [GPUS, 64])
def test_a_hybrid_placement_time_slices_only_its_shared_ranks(gpus: int) -> None:
    """RLinf's hybrid mode, as the live protocol runs it: with ``actor,rollout: 0-3`` and ``inference: 4-7``
    the shared half decodes, then waits while the inference half finishes scoring (the first mini-batch waits
    for every sample while an actor rank is shared), then trains; the inference half scores as samples arrive.
    With the actor alone (``actor: 0-3``, ``rollout,inference: 4-7``) the shared half scores only once the
    rollout has ended and the actor trains as mini-batches come. ``--gpus`` keeps the halves."""
    half = gpus // 2
    shared_actor = simulate(config_from_mapping(_config(cluster={"component_placement": {
        "actor,rollout": "0-3", "inference": "4-7"}})), gpus=gpus)
    assert shared_actor.policy == "hybrid"
    for it in shared_actor.iterations:
        ph = it.phases
        assert ph["rollout_end_s"] <= ph["inference_end_s"] <= ph["last_minibatch_start_s"] <= it.time_s
        shapes = [(d["t"], d["placement"]) for d in it.decisions]
        assert shapes[-2:] == [(pytest.approx(ph["inference_end_s"], abs=1e-3), {"actor": half, "rollout": 0, "inference": half}),
                               (pytest.approx(it.time_s, abs=1e-3), {"actor": 0, "rollout": half, "inference": half})]
        # the actor held no GPU before every sample was scored
        assert all(p["actor"] == 0 for t, p in shapes if t < ph["inference_end_s"] - 1e-3)
    alone = simulate(config_from_mapping(_config(cluster={"component_placement": {
        "actor": "0-3", "rollout,inference": "4-7"}})), gpus=gpus)
    assert alone.policy == "hybrid"
    for it in alone.iterations:
        first = it.decisions[-2]  # the shared half turns to scoring once the rollout has ended
        assert first["t"] == pytest.approx(it.phases["rollout_end_s"], abs=1e-3)
        assert first["placement"] == {"actor": half, "rollout": 0, "inference": half}
        assert it.phases["inference_end_s"] > it.phases["rollout_end_s"]
    # the actor's offload is charged on every move of the shared actor, not when only the inference half moves
    offloaded = simulate(config_from_mapping(_config(cluster={"component_placement": {
        "actor,rollout": "0-3", "inference": "4-7"}}, actor={"offload_weight": True})), gpus=gpus)
    assert all(a.time_s > b.time_s for a, b in zip(offloaded.iterations[1:], shared_actor.iterations[1:]))


def test_policies_that_move_ranks_refuse_a_shared_placement_they_cannot_move() -> None:
    """Asked on the command line (a config file saying so is refused by validate already): ``plan`` on shared
    ranks (it chooses co-location by itself), ``auto`` where the actor holds every rank (nothing to move)."""
    shared = _config(cluster={"component_placement": {"actor,rollout,inference": "all"}})
    with pytest.raises(SimulationSetupError, match="plan moves whole ranks.*ranks \\[0, 1"):
        simulate(config_from_mapping(shared), policy="plan")
    with pytest.raises(SimulationSetupError, match="the actor holds every rank already"):
        simulate(config_from_mapping(shared), policy="auto")


def test_auto_on_a_hybrid_placement_pins_its_shared_ranks_and_grows_the_actor() -> None:
    """``auto`` on ``actor,inference: 0-1`` beside ``rollout: 2-7``: the shared ranks keep scoring until every
    sample is scored (the actor, sharing them, trains only then), the rollout's ranks join the actor as its
    requests run out, and the actor trains on all 8 GPUs; every iteration starts from the hybrid placement.
    Against ``static`` on the same placement, which leaves the rollout's ranks idle while the actor trains on
    two, the simulated iteration is shorter (380.5 s against 244.0 s, seed 0)."""
    cfg = config_from_mapping(_config(cluster={"component_placement": {"actor,inference": "0-1", "rollout": "2-7"},
                                               "auto_scheduler": True}, scheduler={"policy": "auto"}))
    report = simulate(cfg)
    assert report.policy == "auto"
    for it in report.iterations:
        # (the decisions' placements are counts of ranks: the shared pair keeps inference until it finished)
        before = [d["placement"] for d in it.decisions if d["t"] < it.phases["inference_end_s"] - 1e-3]
        assert all(p["inference"] == 2 for p in before), it.decisions
        assert any(d["placement"] == {"actor": GPUS, "rollout": 0, "inference": 0} for d in it.decisions)
        assert it.phases["last_minibatch_start_s"] >= it.phases["inference_end_s"]
    static = simulate(cfg, policy="static")
    assert static.policy == "hybrid" and report.mean_iteration_s < 0.8 * static.mean_iteration_s


def test_simulate_cli_compares_a_config_with_co_location(tmp_path) -> None:
    """``simulate --compare-modes``: the configured run, then every disaggregated policy, plan choosing per
    iteration, and co-location on the same GPUs, each figure the simulator's own for that policy, and the fastest named; a hybrid config compares
    with co-location and auto (its shared ranks pinned) only, saying why; bad combinations exit 2."""
    path = tmp_path / "c.yaml"
    one = _config(train={"num_iterations": 1})
    path.write_text(yaml.safe_dump(one))
    proc = subprocess.run([*CLI, "simulate", str(path), "--compare-modes", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = yaml.safe_load(proc.stdout)
    out = {row["policy"]: row["mean_iteration_s"] for row in result["modes"]}
    assert list(out) == ["static", "auto", "plan+disaggregated", "plan", "collocated", "collocated+offload"]
    for policy, seconds in out.items():
        assert seconds == pytest.approx(simulate(config_from_mapping(one), policy=policy).mean_iteration_s, abs=1e-3)
    assert out["collocated"] < out["collocated+offload"] < out["static"], out  # math-RL: co-location beats 1:2:1
    assert result["fastest"]["mean_iteration_s"] == min(out.values())
    assert result["modes"][0]["config"] == "as configured" and result["not_compared"]["policies"] == []
    hybrid = {**one, "cluster": {**one["cluster"], "auto_scheduler": False,
                                 "component_placement": {"actor,rollout": "0-3", "inference": "4-7"}},
              "scheduler": {**one.get("scheduler", {}), "policy": "static"}}
    path.write_text(yaml.safe_dump(hybrid))
    proc = subprocess.run([*CLI, "simulate", str(path), "--compare-modes"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "hybrid" in proc.stdout and "not compared: static, plan+disaggregated, plan" in proc.stdout
    assert "(auto scheduler (the shared ranks pinned)): cluster.auto_scheduler=true scheduler.policy=auto" in proc.stdout, (
        proc.stdout)  # auto: shared ranks pinned
    for args, says in ((["--policy", "collocated+nothing"], "'nothing'"), (["--compare-modes", "--policy", "auto"], "--compare-modes"),
                       (["--policy", "auto+disaggregated"], "plan+disaggregated")):
        bad = subprocess.run([*CLI, "simulate", str(path), *args], capture_output=True, text=True)
        assert bad.returncode == 2 and says in bad.stderr, (args, bad.stderr)
