"""Scheduling policies on hand-built states."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slurm_rl.scheduler.placement_ops import iteration_start_placement, placement_problems
from slurm_rl.scheduler.policies import decide_auto, decide_static, make_policy
from slurm_rl.scheduler.state import (
    ActorProgress,
    BatchSpec,
    Decision,
    InferenceProgress,
    PolicyConfig,
    RolloutProgress,
    SchedState,
    ScriptedSwitch,
    derive_phase,
    valid_dp_sizes,
)

INITIAL = {"actor": (0, 1), "rollout": (2, 3, 4, 5), "inference": (6, 7)}
TOTAL = 1024
GBS = 256


def state(*, running: int = 0, pending: int = 0, finished: int | None = None,
          inference_done: int = 0, mb_done: int = 0, busy: bool = False,
          current: dict | None = None, iteration: int = 0, num_iterations: int = 3,
          cfg: PolicyConfig | None = None, gbs: int = GBS, mbs: int = 4,
          phase: str | None = None, total: int = TOTAL) -> SchedState:
    """A state on 8 GPUs with the RLinf layout actor 0-1, rollout 2-5, inference 6-7."""
    finished = total - running - pending if finished is None else finished
    rollout = RolloutProgress(running, pending, finished, total)
    actor = ActorProgress(mb_done * gbs, total, mb_done, total // gbs, busy)
    return SchedState(
        iteration=iteration, num_iterations=num_iterations,
        phase=phase or derive_phase(rollout, actor), world_ranks=tuple(range(8)),
        initial=INITIAL, current=current or INITIAL, rollout=rollout,
        inference=InferenceProgress(inference_done, total), actor=actor,
        batch=BatchSpec(gbs, mbs, total), cfg=cfg or PolicyConfig())


def test_valid_dp_sizes_rule() -> None:
    assert valid_dp_sizes(256, 4, 8) == [1, 2, 4, 8]
    assert valid_dp_sizes(12, 2, 8) == [1, 2, 3, 6]
    assert valid_dp_sizes(8, 8, 4) == [1]
    with pytest.raises(ValueError, match="micro_batch_size"):
        valid_dp_sizes(8, 0, 4)


def test_auto_releases_surplus_rollout_and_grows_actor() -> None:
    # 100 outstanding requests need ceil(100 / 64) = 2 of the 4 instances.
    d = decide_auto(state(running=100, finished=700, inference_done=600, mb_done=1))
    assert d is not None
    assert d.placement == {"actor": (0, 1, 2, 3), "rollout": (4, 5), "inference": (6, 7)}
    assert d.migrate_from == (2, 3)
    assert d.boundary == "minibatch"
    assert "rollout releases 2 ranks" in d.reason


def test_auto_releases_only_what_the_actor_can_use() -> None:
    # 10 requests need 1 instance; 3 are surplus but DP 2 -> 4 only needs 2 ranks (DP 5 invalid).
    d = decide_auto(state(running=10, finished=900, inference_done=700, mb_done=1))
    assert d is not None
    assert d.placement["actor"] == (0, 1, 2, 3)
    assert d.placement["rollout"] == (4, 5)


def test_auto_grows_to_largest_valid_dp_that_fits() -> None:
    # gbs=12, mbs=2: valid DPs 1, 2, 3, 6. Three surplus ranks: 2 -> 3 fits, 2 -> 6 does not.
    d = decide_auto(state(running=10, inference_done=12, mb_done=1, gbs=12, mbs=2, total=1020))
    assert d is not None
    assert len(d.placement["actor"]) == 3
    assert d.placement["rollout"] == (3, 4, 5)
    assert d.migrate_from == (2,)


def test_auto_keeps_rollout_while_it_needs_every_instance() -> None:
    assert decide_auto(state(running=256, pending=100, finished=668, inference_done=500,
                             mb_done=1)) is None


def test_auto_gives_finished_inference_to_actor() -> None:
    current = {"actor": (0, 1, 2, 3), "rollout": (), "inference": (6, 7)}
    d = decide_auto(state(inference_done=TOTAL, mb_done=2, current=current))
    assert d is not None
    # 4 + 2 inference + 2 idle (released rollout) = DP 8.
    assert d.placement == {"actor": tuple(range(8)), "rollout": (), "inference": ()}
    assert d.migrate_from == ()
    assert "inference finished" in d.reason


def test_auto_pins_the_shared_ranks_of_a_hybrid_placement() -> None:
    """Ranks 2-3 serve rollout and inference (time-sliced): while requests are outstanding auto releases only
    the rollout's own ranks (4-5), not the shared ones it would release first otherwise; once every sample
    is scored the shared ranks, all of whose components finished, join the actor with the rest."""
    hybrid = {"actor": (0, 1), "rollout": (2, 3, 4, 5), "inference": (2, 3, 6, 7)}
    st = state(running=10, finished=900, inference_done=700, mb_done=1, current=hybrid)
    d = decide_auto(dataclasses.replace(st, initial=hybrid))
    assert d is not None
    assert d.placement == {"actor": (0, 1, 4, 5), "rollout": (2, 3), "inference": (2, 3, 6, 7)}
    assert d.migrate_from == (4, 5)
    # the same progress on the disaggregated layout releases the lowest instances, 2-3
    assert decide_auto(state(running=10, finished=900, inference_done=700, mb_done=1)).migrate_from == (2, 3)
    done = {"actor": (0, 1, 4, 5), "rollout": (2, 3), "inference": (2, 3, 6, 7)}
    st = state(inference_done=TOTAL, mb_done=2, current=done)
    d = decide_auto(dataclasses.replace(st, initial=hybrid))
    assert d is not None and d.placement == {"actor": tuple(range(8)), "rollout": (), "inference": ()}


def test_auto_waits_while_actor_is_inside_a_minibatch() -> None:
    assert decide_auto(state(running=10, finished=900, inference_done=700, mb_done=1,
                             busy=True)) is None


def test_auto_returns_to_initial_placement_for_next_iteration() -> None:
    grown = {"actor": tuple(range(8)), "rollout": (), "inference": ()}
    d = decide_auto(state(inference_done=TOTAL, mb_done=4, current=grown))
    assert d is not None
    assert d.placement == INITIAL
    assert d.boundary == "iteration"
    assert "iteration 1" in d.reason
    # Also when the next iteration already started from a stale placement.
    d = decide_auto(state(running=0, pending=TOTAL, finished=0, current=grown, iteration=1))
    assert d is not None and d.placement == INITIAL
    # Not after the last iteration.
    assert decide_auto(state(inference_done=TOTAL, mb_done=4, current=grown, iteration=2)) is None


def test_pre_process_rollout_spans_actor_gpus_then_hands_them_back() -> None:
    cfg = PolicyConfig(use_pre_process_policy=True)
    start = iteration_start_placement(INITIAL, cfg)
    assert start == {"actor": (), "rollout": (0, 1, 2, 3, 4, 5), "inference": (6, 7)}
    d = decide_auto(state(running=0, pending=TOTAL, finished=0, cfg=cfg))
    assert d is not None and d.placement == start
    # More than half outstanding: keep the actor's GPUs.
    assert decide_auto(state(running=384, pending=200, cfg=cfg, current=start)) is None
    # Half or less outstanding: the instances on the actor's GPUs migrate out.
    d = decide_auto(state(running=384, pending=100, inference_done=300, cfg=cfg, current=start))
    assert d is not None
    assert d.placement == INITIAL
    assert d.migrate_from == (0, 1)
    assert "pre-process" in d.reason


def test_pre_process_threshold_is_configurable() -> None:
    cfg = PolicyConfig(use_pre_process_policy=True, pre_process_threshold=0.25)
    start = iteration_start_placement(INITIAL, cfg)
    assert decide_auto(state(running=384, pending=100, cfg=cfg, current=start)) is None
    assert decide_auto(state(running=250, cfg=cfg, current=start)) is not None


def test_wait_before_last_iter_holds_then_gives_actor_everything() -> None:
    cfg = PolicyConfig(use_wait_before_last_iter_policy=True)
    # Only the last mini-batch is left and rollout still runs: nothing moves (no migration).
    assert decide_auto(state(running=5, inference_done=900, mb_done=3, cfg=cfg)) is None
    # Without the option the same state releases rollout ranks.
    assert decide_auto(state(running=5, inference_done=900, mb_done=3)) is not None
    # Rollout and inference finished: every GPU to the actor.
    d = decide_auto(state(inference_done=TOTAL, mb_done=3, cfg=cfg))
    assert d is not None
    assert d.placement == {"actor": tuple(range(8)), "rollout": (), "inference": ()}
    # Before the last mini-batch the ordinary rules apply.
    d = decide_auto(state(running=5, inference_done=600, mb_done=2, cfg=cfg))
    assert d is not None and len(d.placement["actor"]) == 4


def test_auto_repairs_a_starved_component() -> None:
    broken = {"actor": (0, 1, 2, 3), "rollout": (), "inference": (6, 7)}
    d = decide_auto(state(running=50, inference_done=500, mb_done=1, current=broken, busy=True))
    assert d is not None and d.placement == INITIAL
    assert "repair" in d.reason


def test_static_never_moves() -> None:
    assert decide_static(state(running=10, finished=900, inference_done=700, mb_done=1)) is None
    assert make_policy("static", PolicyConfig()) is decide_static


def test_scripted_follows_its_steps() -> None:
    grown = {"actor": (0, 1, 2, 3), "rollout": (4, 5), "inference": (6, 7)}
    cfg = PolicyConfig(script=({"at_iteration": 1, "at_phase": "train", "placement": grown},))
    policy = make_policy("scripted", cfg)
    assert policy(state(running=10, inference_done=700, mb_done=1, cfg=cfg)) is None
    d = policy(state(running=10, inference_done=700, mb_done=1, cfg=cfg, iteration=1))
    assert d is not None and d.placement == grown
    assert d.migrate_from == (2, 3) and d.boundary == "minibatch"
    # Level-triggered: once there, nothing more.
    assert policy(state(running=10, inference_done=700, mb_done=1, cfg=cfg, iteration=1,
                        current=grown)) is None


def test_scripted_rollout_step_waits_for_its_fraction() -> None:
    half = {"actor": (0, 1), "rollout": (2, 3), "inference": (6, 7)}
    quarter = {"actor": (0, 1), "rollout": (2,), "inference": (6, 7)}
    cfg = PolicyConfig(script=(
        {"at_iteration": 0, "at_phase": "rollout", "at_rollout_fraction": 0.75, "placement": quarter},
        {"at_iteration": 0, "at_phase": "rollout", "at_rollout_fraction": 0.5, "placement": half},
    ))
    policy = make_policy("scripted", cfg)
    assert policy(state(running=400, finished=500, cfg=cfg)) is None  # 49% finished
    d = policy(state(running=400, finished=600, cfg=cfg))
    assert d is not None and d.placement == half and d.migrate_from == (4, 5) and d.boundary == "now"
    d = policy(state(running=200, finished=800, cfg=cfg, current=half))  # the highest fraction reached wins
    assert d is not None and d.placement == quarter and d.migrate_from == (3,)
    with pytest.raises(ValueError, match="at_rollout_fraction"):
        ScriptedSwitch(at_phase="train", placement=INITIAL, at_rollout_fraction=0.5)


def test_make_policy_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="allowed"):
        make_policy("greedy", PolicyConfig())
    with pytest.raises(ValueError, match="at least one step"):
        make_policy("scripted", PolicyConfig())
    with pytest.raises(ValueError, match="at_phase"):
        ScriptedSwitch(at_phase="later", placement=INITIAL)
    with pytest.raises(ValueError, match="max_running_requests"):
        PolicyConfig(max_running_requests=0)
    with pytest.raises(ValueError, match="global_batch_size"):
        BatchSpec(300, 4, 1024)


def test_placement_problems_name_the_fault() -> None:
    cfg = PolicyConfig(rollout_ranks_per_instance=2)
    world = range(8)
    assert placement_problems(INITIAL, world, cfg, 256, 4) == []
    twice = {"actor": (0, 1), "rollout": (1, 2), "inference": ()}
    assert any("both actor and rollout" in p for p in placement_problems(twice, world, cfg, 256, 4))
    outside = {"actor": (0, 9), "rollout": (), "inference": ()}
    assert any("outside" in p for p in placement_problems(outside, world, cfg, 256, 4))
    odd = {"actor": (0, 1, 2), "rollout": (3,), "inference": ()}
    problems = placement_problems(odd, world, cfg, 256, 4)
    assert any("not a valid DP size" in p for p in problems)
    assert any("instances of 2" in p for p in problems)


def test_decision_is_plain_json() -> None:
    d = Decision({"actor": [1, 0]}, "why", migrate_from=(3, 2), boundary="minibatch")
    assert json.loads(json.dumps(d.to_json())) == {
        "placement": {"actor": [0, 1], "rollout": [], "inference": []},
        "reason": "why", "migrate_from": [2, 3], "boundary": "minibatch"}
