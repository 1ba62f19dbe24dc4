"""The simulator's collocated mode: every GPU serves rollout, then inference, then training, inside each
iteration (the phases a collocated run's shared ranks time-slice), the actor's offload charged per switch."""

from __future__ import annotations

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
    offloading the actor adds its move to host memory and back to every later iteration; a hybrid
    placement is refused, naming the key."""
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
    hybrid = _config(cluster={"component_placement": {"actor,rollout": f"0-{GPUS - 3}", "inference": f"{GPUS - 2}-{GPUS - 1}"}})
    with pytest.raises(SimulationSetupError, match="hybrid placement"):
        simulate(config_from_mapping(hybrid))


def test_simulate_cli_compares_a_config_with_co_location(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    one = _config(train={"num_iterations": 1})
    path.write_text(yaml.safe_dump(one))
    proc = subprocess.run([*CLI, "simulate", str(path), "--policy", "collocated+offload", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = {"collocated+offload": yaml.safe_load(proc.stdout)["mean_iteration_s"]}
    out.update({policy: simulate(config_from_mapping(one), policy=policy).mean_iteration_s
                for policy in ("static", "collocated")})
    assert out["collocated"] < out["collocated+offload"] < out["static"], out  # math-RL: co-location beats 1:2:1
    bad = subprocess.run([*CLI, "simulate", str(path), "--policy", "collocated+nothing"], capture_output=True, text=True)
    assert bad.returncode == 2 and "collocated" in bad.stderr
