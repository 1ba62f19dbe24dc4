"""The discrete-event simulator running the real policies."""

from __future__ import annotations

import io
import json
import random

import pytest

from slurm_rl.config import Config, ConfigError, config_from_mapping
from slurm_rl.placement import parse_placement
from slurm_rl.scheduler.cost_model import CostModel
from slurm_rl.scheduler.lengths import LengthModel
from slurm_rl.scheduler.policies import make_policy
from slurm_rl.scheduler.profiles import math_rl
from slurm_rl.scheduler.report import print_report
from slurm_rl.scheduler.simulate import (
    SimulationSetupError,
    build_setup,
    parse_policy,
    scale_placement,
    simulate,
)
from slurm_rl.scheduler.simulator import Simulation
from slurm_rl.scheduler.state import Decision, PolicyConfig


@pytest.fixture(scope="module")
def math8() -> Config:
    return config_from_mapping(math_rl(8, num_iterations=2))


@pytest.fixture(scope="module")
def static8(math8: Config):
    return simulate(math8, policy="static")


@pytest.fixture(scope="module")
def auto8(math8: Config):
    return simulate(math8, policy="auto")


def test_auto_beats_static_on_math_profile(static8, auto8) -> None:
    assert auto8.total_time_s < 0.85 * static8.total_time_s
    assert all(it.placement_changes == 0 for it in static8.iterations)
    assert all(it.placement_changes >= 2 for it in auto8.iterations)


def test_options_also_beat_static(math8: Config, static8) -> None:
    for policy in ("auto+pre_process", "auto+wait_before_last_iter"):
        assert simulate(math8, policy=policy).total_time_s < 0.85 * static8.total_time_s


def test_deterministic_given_seed(math8: Config, auto8) -> None:
    again = simulate(math8, policy="auto")
    assert again.to_json() == auto8.to_json()
    other = simulate(math8, policy="auto", seed=7)
    assert other.total_time_s != auto8.total_time_s


def test_gpu_seconds_add_up(auto8) -> None:
    for it in auto8.iterations:
        total = sum(it.busy_gpu_s.values()) + sum(it.idle_gpu_s.values()) + it.unassigned_gpu_s
        assert total == pytest.approx(auto8.gpus * it.time_s, rel=1e-6)
        assert it.bubble_gpu_s == pytest.approx(auto8.gpus * it.time_s
                                                - sum(it.busy_gpu_s.values()), rel=1e-6)
        assert all(v >= -1e-6 for v in it.idle_gpu_s.values())
        assert it.busy_gpu_s["actor"] > 0 and it.busy_gpu_s["rollout"] > 0


def test_report_json_and_table(auto8) -> None:
    data = json.loads(auto8.to_json())
    assert data["policy"] == "auto" and len(data["iterations"]) == 2
    assert data["iterations"][0]["decisions"][0]["reason"]
    from rich.console import Console
    console = Console(file=io.StringIO(), width=200, record=True)
    print_report(auto8, console)
    text = console.export_text()
    assert "simulated auto on 8 GPUs" in text and "bubble" in text


def _tiny(policy: str, **cluster) -> dict:
    """A small deterministic workload: fixed lengths, 4 GPUs."""
    cluster.setdefault("auto_scheduler", policy in ("auto", "plan"))
    return {
        "runtime": {"device": "emulated"},
        "cluster": {"num_nodes": 1, "gpus_per_node": 4,
                    "component_placement": {"actor": "0", "rollout": "1-2", "inference": 3},
                    **cluster},
        "train": {"num_iterations": 1, "rollout_batch_size": 8, "group_size": 4,
                  "global_batch_size": 8, "micro_batch_size": 1},
        "scheduler": {"policy": policy, "max_running_requests": 8},
        "emulated": {"rollout_s_per_token": 0.01, "inference_s_per_token": 0.001,
                     "actor_s_per_token": 0.01, "response_len_mean": 100,
                     "response_len_max": 100, "response_len_dist": "fixed", "prompt_len": 0,
                     "scaling": 1.0, "reshard_s_per_gb": 0.0, "model_params": 0},
    }


def test_fixed_workload_matches_hand_computation() -> None:
    # 32 requests of 100 tokens on 2 instances x 8 slots: two waves of 100 / (1/(0.01*8)) = 8 s.
    report = simulate(config_from_mapping(_tiny("static")))
    it = report.iterations[0]
    # The first wave ends at 8 s, its first 8 samples go through inference (8 x 100 x 0.001 =
    # 0.8 s), then the actor is the bottleneck: 4 mini-batches of 8 x 100 x 0.01 = 8 s on one GPU.
    assert it.time_s == pytest.approx(8 + 0.8 + 4 * 8, rel=1e-6)
    assert it.busy_gpu_s["rollout"] == pytest.approx(2 * 16)


def test_without_inference_the_rollouts_go_to_the_actor_as_they_are() -> None:
    # as above with no inference component (it is optional): the first wave's groups reach the actor at 8 s,
    # which trains 4 mini-batches of 8 s (the simulator stalled on such placements before)
    cfg = _tiny("static")
    cfg["cluster"]["component_placement"] = {"actor": "0", "rollout": "1-2"}
    it = simulate(config_from_mapping(cfg)).iterations[0]
    assert it.time_s == pytest.approx(8 + 4 * 8, rel=1e-6)
    assert it.phases["inference_end_s"] == it.phases["rollout_end_s"] == pytest.approx(16)


def test_a_critic_on_ranks_of_its_own_trains_each_stamped_minibatch_in_turn() -> None:
    # actor on 2 GPUs (8 x 100 x 0.01 / 2 = 4 s a mini-batch), stamped at 8.8, 12.8, 16.8 and 20.8 s (the first
    # wave's groups scored by 9.6 s, the second's from 16.8 s): the actor ends at 24.8 s. PPO's critic on one GPU
    # of its own takes 8 s a mini-batch from its stamp or when it is free: 16.8, 24.8, 32.8, 40.8 s, and the
    # iteration ends with it (live emulated runs wait for it too: their next weight sync needs its weights)
    cfg = _tiny("static", gpus_per_node=6, component_placement={"actor": "0-1", "rollout": "2-3", "inference": 4})
    plain = simulate(config_from_mapping(cfg)).iterations[0]
    cfg["cluster"]["component_placement"]["critic"] = "5"
    cfg["algorithm"] = {"adv_estimator": "gae"}
    critic = simulate(config_from_mapping(cfg)).iterations[0]
    assert plain.time_s == pytest.approx(24.8, rel=1e-6) and critic.time_s == pytest.approx(40.8, rel=1e-6)
    assert critic.phases["last_minibatch_start_s"] == pytest.approx(20.8, rel=1e-6)


def test_ppo_epochs_add_the_later_passes_after_the_first() -> None:
    # as above, then actor.ppo_epochs: 2 retrains the 4 mini-batches once the first pass is done
    report = simulate(config_from_mapping({**_tiny("static"), "actor": {"ppo_epochs": 2}}))
    it = report.iterations[0]
    assert it.time_s == pytest.approx(8 + 0.8 + 8 * 8, rel=1e-6)
    assert it.busy_gpu_s["actor"] == pytest.approx(8 * 8)


def test_migration_keeps_generated_tokens() -> None:
    setup, _ = build_setup(config_from_mapping(_tiny("static")))
    sim = Simulation(setup, make_policy("static", setup.policy_cfg))
    sim._start_iteration(0)
    sim._new_report(0)
    sim._dispatch()
    sim._advance(3.0)
    inst = next(i for i in sim.instances.values() if i.ranks == (1,))
    rids = sorted(inst.running)
    sim.placement = {**sim.placement, "rollout": (2,)}
    sim._rebuild_instances(ready_at=3.0)
    rate = 1 / (0.01 * 8)
    for rid in rids:
        assert sim.requests[rid].generated == pytest.approx(3.0 * rate)
    assert list(sim.pending)[:len(rids)] == rids
    assert sim.report.migrated_requests == len(rids)


def test_scripted_policy_in_simulator() -> None:
    cfg = _tiny("scripted")
    cfg["scheduler"]["script"] = [{"at_phase": "rollout", "at_iteration": 0,
                                   "placement": {"actor": 0, "rollout": 1, "inference": "2-3"}}]
    it = simulate(config_from_mapping(cfg)).iterations[0]
    assert it.placement_changes == 1
    assert it.migrated_requests > 0


def test_gpus_override_scales_placement() -> None:
    cfg = config_from_mapping(math_rl(8, num_iterations=1))
    setup, name = build_setup(cfg, gpus=16, policy="auto+pre_process")
    assert name == "auto" and setup.policy_cfg.use_pre_process_policy
    assert setup.initial == {"actor": tuple(range(4)), "rollout": tuple(range(4, 12)),
                             "inference": tuple(range(12, 16))}
    assert scale_placement(setup.initial, 16, 16, PolicyConfig()) == setup.initial


def test_config_errors_name_the_key() -> None:
    cfg = _tiny("static")
    cfg["cluster"]["component_placement"] = {"actor": "0-2", "rollout": "1-2", "inference": 3}
    with pytest.raises(ConfigError, match="cluster.component_placement"):
        simulate(config_from_mapping(cfg))
    with pytest.raises(SimulationSetupError, match="allowed"):
        parse_policy("auto+turbo")
    with pytest.raises(ConfigError, match="each component in one entry only"):
        parse_placement({"actor,rollout": "0-1", "actor": 2}, 4)
    assert parse_placement({"actor,inference": "0-1,3", "rollout": "2"}, 4).components["inference"].ranks == (
        0, 1, 3)
    with pytest.raises(TypeError, match="validated Config"):
        simulate(_tiny("static"))  # type: ignore[arg-type]


def test_setup_the_simulator_cannot_run_is_a_named_error() -> None:
    """An actor on 3 GPUs cannot split a mini-batch of 8 (bad input, exit 2 from the CLI)."""
    cfg = config_from_mapping(_tiny("static"))
    with pytest.raises(SimulationSetupError, match="cluster.component_placement"):
        simulate(cfg, placement={"actor": (0, 1, 2), "rollout": (3,), "inference": (3,)})


def test_gpus_per_node_and_placement_come_from_the_config() -> None:
    """Not 8 GPUs per node: the validated placement (node groups, slots) is the simulated one."""
    cfg = _tiny("static")
    cfg["cluster"].update(num_nodes=2, gpus_per_node=2,
                          component_placement={"actor": "0", "rollout": "1-2", "inference": 3})
    setup, _ = build_setup(config_from_mapping(cfg))
    assert setup.gpus == 4
    assert setup.initial == {"actor": (0,), "rollout": (1, 2), "inference": (3,)}


def test_length_model_is_long_tailed() -> None:
    lens = LengthModel(mean=1649, max_len=16384).sample(random.Random(0), 20000)
    lens.sort()
    assert 900 < lens[len(lens) // 2] < 1100          # median ~1k
    assert lens[-1] == 16384                          # clipped tail
    assert sum(lens) / len(lens) == pytest.approx(1649, rel=0.05)


def test_cost_model_share_matches_whole_component() -> None:
    """One model, two uses: a rank's share (emulated runtime) adds up to the component law (simulator)."""
    params = dict(rollout_s_per_token=1e-3, inference_s_per_token=2e-4, actor_s_per_token=5e-4,
                  scaling=0.9, reshard_s_per_gb=0.1, model_params=10**9)
    ours = CostModel(**params)
    theirs = CostModel.from_config(params)
    assert theirs == ours
    for comp in ("rollout", "inference", "actor"):
        for gpus in (1, 3, 8):
            tokens = 12000
            assert ours.seconds(comp, tokens, gpus) == pytest.approx(
                theirs.share_seconds(comp, tokens / gpus, gpus))
    for old, new in ((1, 4), (0, 2), (4, 2)):
        assert ours.reshard_bytes(old, new) == theirs.reshard_bytes(old, new)
    # A full instance decodes at the component law.
    full = ours.decode_tokens_per_s(2, 64, 64) * 64
    assert 1 / full == pytest.approx(ours.seconds("rollout", 1, 2))


def test_cli_exit_2_only_for_bad_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``slurm-rl simulate``: a setup the simulator cannot run exits 2; a bug is not disguised as bad input."""
    from slurm_rl.scheduler import cli_bridge

    cfg = config_from_mapping(_tiny("static"))
    assert cli_bridge.run_simulation(cfg, gpus=None, policy="auto+turbo", as_json=True) == 2
    assert "cannot simulate 4 GPUs: policy option" in capsys.readouterr().err
    assert cli_bridge.run_simulation(cfg, gpus=3, policy=None, as_json=True) == 2
    assert "inference would get 0" in capsys.readouterr().err

    assert cli_bridge.run_simulation(cfg, gpus=None, policy=None, as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "static"

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("an internal bug")

    monkeypatch.setattr(cli_bridge, "simulate", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        cli_bridge.run_simulation(cfg, gpus=None, policy=None, as_json=True)


def test_held_back_actor_keeps_its_state_where_it_was() -> None:
    # The runtime leaves the actor's state on the ranks that last held it while the actor holds
    # none (pre-process), so coming back onto fewer ranks moves nothing and growing moves the
    # fraction the joiners lack; the simulator charges the same.
    cfg = _tiny("static")
    cfg["emulated"].update(reshard_s_per_gb=1.0, model_params=10**9)  # 16 s for the whole state
    setup, _ = build_setup(config_from_mapping(cfg))
    sim = Simulation(setup, make_policy("static", setup.policy_cfg))
    sim._start_iteration(0)
    sim._new_report(0)
    assert sim.state_dp == 1
    sim.placement = {"actor": (), "rollout": (1, 2), "inference": (3,)}
    sim._apply(Decision({"actor": (0, 1), "rollout": (2,), "inference": (3,)}, "grow from held"))
    assert sim.ready_at["actor"] == pytest.approx(setup.switch_latency_s + 16 * 0.5)  # 1 -> 2 moves half
    assert sim.seen_growth == pytest.approx(0.5) and sim.state_dp == 2
    sim._apply(Decision({"actor": (), "rollout": (1, 2), "inference": (3,)}, "hold back"))
    assert sim.state_dp == 2  # the state stays on the two ranks
    sim._apply(Decision({"actor": (1,), "rollout": (2,), "inference": (3,)}, "come back on one"))
    assert sim.ready_at["actor"] == pytest.approx(setup.switch_latency_s)  # shrinking moves nothing
    assert sim.state().actor.state_dp == 1 and sim.seen_growth == 0.0
    sim._apply(Decision({"actor": (0, 1), "rollout": (2,), "inference": (3,)}, "grow again"))
    assert sim.seen_growth == pytest.approx(0.5)
    sim._apply(Decision({"actor": (0, 1), "rollout": (), "inference": (2, 3)}, "rollout only"))
    assert sim.seen_growth == 0.0  # a switch that leaves the actor alone grew nothing
