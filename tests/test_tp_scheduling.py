"""The actor's tensor-parallel size in the scheduler: placement checks with the size in force,
growth that never splits a TP group over nodes, a TP choice picked (or the size kept), scripted
size changes, and the size each published epoch carries."""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_profiles import examples

from slurm_rl.config import load_config, straddling_tp_groups
from slurm_rl.control.acks import write_ack
from slurm_rl.control.epochs import Epoch, EpochStore
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.progress import RankProgress
from slurm_rl.scheduler.live_state import placement_json, policy_config, restart_decision
from slurm_rl.scheduler.placement_ops import choose_actor_tp, grow_actor, placement_problems
from slurm_rl.scheduler.policies import decide_auto, decide_scripted
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
)

WORLD = tuple(range(8))  # two nodes of four ranks
GBS, MBS, TOTAL = 12, 1, 48  # valid DP sizes: 1, 2, 3, 4, 6


def cfg(tp: int = 2, choices: tuple[int, ...] = (), per_node: int | None = 4, **kw) -> PolicyConfig:
    return PolicyConfig(actor_ranks_per_instance=tp, actor_tp_choices=choices, ranks_per_node=per_node,
                        rollout_ranks_per_instance=1, max_running_requests=8, **kw)


def state(current: dict, pc: PolicyConfig, actor_tp: int | None = None, finished: int = 8,
          running: int = 40, mb_done: int = 0, initial: dict | None = None) -> SchedState:
    rollout = RolloutProgress(running, TOTAL - finished - running, finished, TOTAL)
    actor = ActorProgress(mb_done * GBS, TOTAL, mb_done, TOTAL // GBS)
    return SchedState(iteration=0, num_iterations=2, phase=derive_phase(rollout, actor), world_ranks=WORLD,
                      initial=initial or current, current=current, rollout=rollout,
                      inference=InferenceProgress(0, TOTAL), actor=actor, batch=BatchSpec(GBS, MBS, TOTAL),
                      cfg=pc, actor_tp=actor_tp)


def test_placement_problems_with_tp() -> None:
    pc = cfg(choices=(1, 2))
    ok = {"actor": (0, 1, 2, 3), "rollout": (4, 5, 6, 7)}
    assert placement_problems(ok, WORLD, pc, GBS, MBS) == []  # tp 2: DP 2
    odd = {"actor": (0, 1, 2), "rollout": (4, 5, 6, 7)}
    assert any("3 ranks give DP 1.5, not a valid DP size" in p for p in placement_problems(odd, WORLD, pc, GBS, MBS))
    assert placement_problems(odd, WORLD, pc, GBS, MBS, actor_tp=1) == []  # tp 1: DP 3
    across = {"actor": (3, 4), "rollout": (0, 1, 2, 5, 6, 7)}
    (problem,) = placement_problems(across, WORLD, pc, GBS, MBS)
    assert "TP group [3, 4]" in problem and "spans nodes [0, 1]" in problem
    assert placement_problems(across, WORLD, pc, GBS, MBS, actor_tp=1) == []
    assert placement_problems(across, WORLD, cfg(per_node=None), GBS, MBS) == []  # nodes not known: no check
    assert placement_problems(across, WORLD, cfg(per_node=None, rank_nodes=(0, 0, 0, 0, 0, 1, 1, 1)), GBS, MBS) == []
    assert placement_problems(across, WORLD, cfg(per_node=None, rank_nodes=(0,) * 4 + (1,) * 4), GBS, MBS) != []
    (problem,) = placement_problems(ok, WORLD, pc, GBS, MBS, actor_tp=4)
    assert "tensor-parallel size 4 is not one of [1, 2]" in problem


def test_choose_actor_tp_prefers_the_configured_size_then_the_size_in_force() -> None:
    pc = cfg(tp=1, choices=(1, 2, 4))
    assert choose_actor_tp((0, 1, 2, 3), 2, 8, pc, GBS, MBS) == 1  # the configured size fits: back to it
    pc = cfg(tp=4, choices=(1, 2, 4))
    assert choose_actor_tp((0, 1, 2, 3), 2, 8, pc, GBS, MBS) == 4
    assert choose_actor_tp((0, 1), 2, 8, pc, GBS, MBS) == 2  # tp 4 does not fit 2 ranks: the size in force
    assert choose_actor_tp((0, 1, 2), 2, 8, pc, GBS, MBS) == 1  # neither fits: the smallest valid choice
    assert choose_actor_tp((2, 3, 4, 5), 4, 8, pc, GBS, MBS) == 1  # tp 4 spans nodes, tp 1 is the smallest
    assert choose_actor_tp((0, 1, 2, 3, 4), 1, 8, pc, GBS, MBS) is None  # DP 5 is not valid, nor 2.5 or 1.25
    assert choose_actor_tp((), 4, 8, pc, GBS, MBS) == 4


def test_grow_actor_never_splits_a_tp_group_over_nodes() -> None:
    pc = cfg()
    s = state({"actor": (0, 1), "rollout": (2, 5, 6, 7), "inference": ()}, pc)
    # ranks 3 and 4 are free first: (0, 1, 3, 4) would put the TP group (3, 4) on two nodes
    assert grow_actor((0, 1), [(3,), (4,), (2,)], s) == ((0, 1), 0)
    assert grow_actor((0, 1), [(2,), (3,), (4,), (5,)], s) == ((0, 1, 2, 3, 4, 5), 4)  # (0,1) (2,3) (4,5)
    # without node knowledge the old behaviour: the largest valid DP
    flat = state({"actor": (0, 1), "rollout": (2, 5, 6, 7), "inference": ()}, cfg(per_node=None))
    assert grow_actor((0, 1), [(3,), (4,), (2,)], flat) == ((0, 1, 3, 4), 2)


@settings(max_examples=examples(300), deadline=None)
@given(data=st.data())
def test_grown_actor_is_always_usable(data: st.DataObject) -> None:
    """Whatever the free ranks and their order, a grown actor has a TP size that suits it: a
    valid DP size and every TP group inside one node."""
    per_node = data.draw(st.sampled_from([2, 4]))
    choices = data.draw(st.sampled_from([(1,), (2,), (4,), (1, 2), (2, 4), (1, 2, 4)]))
    tp = data.draw(st.sampled_from(choices))
    pc = PolicyConfig(actor_ranks_per_instance=tp, actor_tp_choices=choices, ranks_per_node=per_node)
    node_start = data.draw(st.integers(0, 8 // per_node - 1)) * per_node
    actor = tuple(range(node_start, node_start + min(tp, per_node))) if tp <= per_node else ()
    rest = data.draw(st.permutations([r for r in WORLD if r not in actor]))
    s = state({"actor": actor, "rollout": (), "inference": ()}, pc)
    grown, used = grow_actor(actor, [(r,) for r in rest], s)
    if grown == actor:
        return
    chosen = choose_actor_tp(grown, tp, len(WORLD), pc, GBS, MBS)
    assert chosen is not None and chosen in choices
    assert straddling_tp_groups(grown, chosen, pc.node_of) == []
    assert set(grown) == set(actor) | set(rest[:used])


def test_auto_picks_a_tp_choice_when_the_size_in_force_does_not_fit() -> None:
    current = {"actor": (0, 1), "rollout": (3, 4, 5, 6, 7), "inference": ()}  # rank 2 idle
    d = decide_auto(state(current, cfg(choices=(1, 2))))
    assert d is not None and d.placement["actor"] == (0, 1, 2) and d.actor_tp == 1, d
    assert "actor tensor parallel 2 -> 1" in d.reason
    assert placement_problems(d.placement, WORLD, cfg(choices=(1, 2)), GBS, MBS, actor_tp=d.actor_tp) == []
    # one choice: as before, the actor does not grow onto a rank count tp 2 cannot use
    d = decide_auto(state(current, cfg()))
    assert d is None or d.placement["actor"] == (0, 1)


def test_auto_keeps_or_restores_the_configured_size_when_it_fits() -> None:
    current = {"actor": (0, 1), "rollout": (4, 5, 6, 7), "inference": ()}  # ranks 2-3 idle
    d = decide_auto(state(current, cfg(choices=(1, 2))))
    assert d is not None and d.placement["actor"] == (0, 1, 2, 3) and d.actor_tp is None, d
    # size 1 in force after an earlier switch: the grown actor fits the configured 2 again
    d = decide_auto(state(current, cfg(choices=(1, 2)), actor_tp=1))
    assert d is not None and d.placement["actor"] == (0, 1, 2, 3) and d.actor_tp == 2, d


def test_auto_returns_to_the_initial_ranks_at_the_configured_size() -> None:
    initial = {"actor": (0, 1), "rollout": (2, 3, 4, 5, 6, 7), "inference": ()}
    grown = {"actor": (0, 1, 2), "rollout": (3, 4, 5, 6, 7), "inference": ()}
    s = state(grown, cfg(tp=2, choices=(1, 2)), actor_tp=1, finished=0, running=0, initial=initial)
    assert s.phase == "start"
    d = decide_auto(s)
    assert d is not None and d.placement == initial and d.actor_tp == 2  # back to the configured size


def test_scripted_step_with_actor_tp() -> None:
    current = {"actor": (0, 1, 2, 3), "rollout": (4, 5, 6, 7), "inference": ()}
    step = ScriptedSwitch(at_phase="rollout", placement=current, at_iteration=0, actor_tp=1)
    s = state(current, cfg(choices=(1, 2)))
    d = decide_scripted(s, [step])  # the same ranks, only the TP size changes
    assert d is not None and d.actor_tp == 1 and d.placement["actor"] == (0, 1, 2, 3)
    assert d.boundary == "minibatch" and "actor tensor parallel 2 -> 1" in d.reason
    assert decide_scripted(state(current, cfg(choices=(1, 2)), actor_tp=1), [step]) is None  # level-triggered
    moved = ScriptedSwitch(at_phase="rollout", placement={"actor": (0, 1), "rollout": (2, 3, 4, 5, 6, 7)},
                           at_iteration=0)
    d = decide_scripted(s, [moved])
    assert d is not None and d.actor_tp is None  # tp 2 suits ranks 0-1: kept
    assert ScriptedSwitch.from_dict({"at_phase": "start", "placement": current, "actor_tp": 2}).actor_tp == 2


def test_epoch_tp_of() -> None:
    epoch = Epoch(epoch=0, generation=0, created_at=0.0, reason="", iteration=0, boundary="iteration",
                  placement={"actor": {"ranks": [0, 1, 2, 3], "dp": 2, "tp": 2, "pp": 1},
                             "rollout": {"ranks": [4, 5]}})
    assert epoch.tp_of("actor") == 2 and epoch.tp_of("rollout") == 1 and epoch.tp_of("inference") == 1
    written = Epoch(epoch=0, generation=0, created_at=0.0, reason="", iteration=0, boundary="iteration",
                    placement=placement_json(Decision({"actor": (0, 1, 2, 3)}, ""), actor_tp=4))
    assert Epoch.from_json(written.to_json()).tp_of("actor") == 4


def test_placement_json_writes_the_actor_tp() -> None:
    d = Decision({"actor": (0, 1, 2, 3), "rollout": (4, 5)}, "x")
    doc = placement_json(d, actor_tp=2)
    assert doc["actor"] == {"ranks": [0, 1, 2, 3], "dp": 2, "tp": 2, "pp": 1}
    assert doc["rollout"] == {"ranks": [4, 5], "dp": 2, "tp": 1, "pp": 1}
    assert "inference" not in doc


def _config(tmp_path: Path) -> Path:
    doc = {
        "cluster": {"num_nodes": 2, "gpus_per_node": 4, "auto_scheduler": True,
                    "component_placement": {"actor": "0-1", "rollout": "2-5", "inference": "6-7"}},
        "runtime": {"device": "emulated", "run_dir": str(tmp_path / "run"), "ack_timeout_s": 5.0,
                    "heartbeat_timeout_s": 60.0},
        "train": {"num_iterations": 2, "rollout_batch_size": 16, "group_size": 16, "global_batch_size": 64,
                  "micro_batch_size": 4},
        "scheduler": {"policy": "auto", "max_running_requests": 16},
        "actor": {"tensor_parallel": 2, "tensor_parallel_choices": [1, 2]},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_policy_config_of_a_tp_config(tmp_path: Path) -> None:
    pc = policy_config(load_config(_config(tmp_path)))
    assert (pc.actor_ranks_per_instance, pc.actor_tp_choices, pc.ranks_per_node, pc.rank_nodes) == (2, (1, 2), 4, ())


def test_coordinator_epochs_carry_the_actor_tp(tmp_path: Path) -> None:
    """Epoch 0 carries actor.tensor_parallel; a decision with the same ranks and another size is
    a new epoch; a restarted coordinator goes on with the size in force, a resumed run starts at the
    configured size."""
    from slurm_rl.scheduler.coordinator import CoordinatorLoop
    from slurm_rl.scheduler.live_state import initial_decision

    cfg = load_config(_config(tmp_path))
    paths = RunPaths(tmp_path / "run").ensure()
    for epoch in (0, 1, 2):
        for rank in range(8):
            write_ack(paths, epoch, rank, "n0", 0.0, 0.0, {})
    same_ranks = Decision({"actor": (0, 1), "rollout": (2, 3, 4, 5), "inference": (6, 7)}, "tp 1",
                          boundary="minibatch", actor_tp=1)
    loop = CoordinatorLoop(cfg, paths, generation=0, policy=lambda s: same_ranks, log=lambda m: None)
    assert loop.actor_tp == 2
    loop.publish(initial_decision(cfg), iteration=0, state_read_at=0.0)
    loop.released = 0
    first = EpochStore(paths).read(0)
    assert first.tp_of("actor") == 2 and first.placement["actor"]["dp"] == 1 and first.extra["actor_tp"] == 2
    assert first.tp_of("rollout") == 1
    progress = {r: RankProgress.from_json({"rank": r, "time": 0.0, "iteration": 0, "state": "working",
                                           "rollout_finished": 60, "rollout_running": 2}, f"rank-{r}.json", rank=r)
                for r in (2, 3, 4, 5)}
    published = loop.decide_mid_iteration(0, progress, 0.0)
    assert published is not None and published.epoch == 1
    second = EpochStore(paths).read(1)
    assert second.tp_of("actor") == 1 and second.placement["actor"]["dp"] == 2
    assert second.ranks_of("actor") == first.ranks_of("actor") and loop.actor_tp == 1
    assert loop.decide_mid_iteration(0, progress, 0.0) is None  # nothing changes any more
    restarted = CoordinatorLoop(cfg, paths, generation=1, policy=lambda s: None, log=lambda m: None)
    assert restarted.actor_tp == 1 and restart_decision(second, "restart").actor_tp == 1
    assert restarted._resume_tp() == 2  # a resumed run starts at its config's actor.tensor_parallel


def test_simulator_follows_the_tp_choices() -> None:
    """The simulator carries out the size each decision carries: auto grows the actor to 3 ranks
    at tp 1 (DP 3), later to 8 at tp 2 (DP 8 is not valid for 48 samples of 4 per micro-batch)."""
    from slurm_rl.config import config_from_mapping
    from slurm_rl.scheduler.simulate import simulate

    cfg = config_from_mapping({
        "runtime": {"device": "emulated"},
        "cluster": {"num_nodes": 2, "gpus_per_node": 4, "auto_scheduler": True,
                    "component_placement": {"actor": "0-1", "rollout": "2-6", "inference": "7"}},
        "train": {"num_iterations": 2, "rollout_batch_size": 12, "group_size": 16, "global_batch_size": 48,
                  "micro_batch_size": 4},
        "scheduler": {"policy": "auto", "max_running_requests": 16},
        "actor": {"tensor_parallel": 2, "tensor_parallel_choices": [1, 2]},
    })
    for policy in ("static", "auto", "plan"):
        report = simulate(cfg, policy=policy)
        assert len(report.iterations) == 2 and report.total_time_s > 0
        reasons = [d["reason"] for it in report.iterations for d in it.decisions]
        if policy == "auto":
            assert any("actor tensor parallel 2 -> 1" in r for r in reasons), reasons
            assert any("actor tensor parallel 1 -> 2" in r for r in reasons), reasons
