"""Tests for slurm_rl.config and slurm_rl.placement: RLinf placement forms, errors, loading."""

from __future__ import annotations

import copy
import os
import pickle
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_profiles import examples

from omegaconf import DictConfig, OmegaConf

from slurm_rl.config import (
    _merge_into,
    _merge_layer,
    _schema,
    COMPONENTS,
    AlgorithmSection,
    Config,
    ConfigError,
    ConfigIssue,
    ModelSection,
    Placement,
    config_from_yaml_text,
    load_config,
    parse_placement,
    placement_from_ranks,
    resolve_gpus_per_node,
)
from slurm_rl.placement import PLACEMENT_FORMS
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]
CONFIG_FILES = sorted(p for p in (REPO / "configs").rglob("*.yaml") if not p.name.startswith("group"))  # run configs
SLURM_ENV = {"SLURM_TASKS_PER_NODE": "4(x2)"}

CLUSTER_YAML = """
cluster:
  num_nodes: 1
  gpus_per_node: 8
  component_placement:
    actor: 0-1
    rollout: 2-5
    inference: 6-7
"""
BASE_YAML = "runtime:\n  device: emulated\n" + CLUSTER_YAML  # the cost model: no data or reward needed


def ranks(p: Placement) -> dict[str, tuple[int, ...]]:
    return {name: comp.ranks for name, comp in p.components.items()}


def issues_of(exc: pytest.ExceptionInfo[ConfigError]) -> dict[str, ConfigIssue]:
    return {issue.key: issue for issue in exc.value.issues}


def assert_issue(err: ConfigError, key: str, value: Any, allowed: str) -> None:
    """The message has a line naming the key, the value and the allowed text."""
    lines = [line for line in str(err).splitlines() if line.startswith(f"{key}: got {value!r}; allowed: ")]
    assert lines, f"no line for {key} / {value!r} in:\n{err}"
    assert any(allowed in line for line in lines), f"{allowed!r} not in {lines}"


# --------------------------------------------------------------------------- placement forms


def test_plain_ranges_rank_equals_slot_and_unused_slot_is_idle() -> None:
    p = parse_placement({"actor": "0-1", "rollout": "2-4", "inference": 6}, 8)
    assert p.world_size == 8 and p.slot_of_rank == tuple(range(8))
    assert ranks(p) == {"actor": (0, 1), "rollout": (2, 3, 4), "inference": (6,)}
    assert p.roles_of(0) == ("actor",) and p.roles_of(6) == ("inference",)
    assert p.roles_of(5) == () and p.roles_of(7) == ()
    assert tuple(p.components) == COMPONENTS
    with pytest.raises(IndexError):
        p.roles_of(8)


@pytest.mark.parametrize("spec", [3, "3", " 3 "])
def test_single_slot_int_or_string(spec: Any) -> None:
    p = parse_placement({"actor": spec, "rollout": "0-1"}, 4)
    assert p.components["actor"].ranks == (3,) and p.components["actor"].slots == (3,)


def test_comma_list_and_all() -> None:
    p = parse_placement({"actor": "0-1,6-7", "rollout": "2-3,5"}, 8)
    assert ranks(p) == {"actor": (0, 1, 6, 7), "rollout": (2, 3, 5)}
    q = parse_placement({"actor,rollout,inference": "all"}, 4)
    assert all(c.ranks == (0, 1, 2, 3) for c in q.components.values())
    assert q.components["rollout"].shared_with == ("actor", "inference")
    assert q.roles_of(2) == COMPONENTS


def test_resources_processes_two_per_gpu() -> None:
    p = parse_placement({"actor": "0-3:0-7", "rollout": "4-7"}, 8)
    assert p.world_size == 12
    assert p.slot_of_rank == (0, 0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7)
    assert p.components["actor"].ranks == tuple(range(8))
    assert p.components["actor"].slots == (0, 1, 2, 3)
    assert p.components["rollout"].ranks == (8, 9, 10, 11)
    assert p.ranks_on_slot(1) == (2, 3)


def test_mixed_rlinf_example_across_two_nodes() -> None:
    p = parse_placement({"actor": "0-1:0-3,3-5,7-10:7-14", "rollout": "11-15"}, 16, num_nodes=2)
    # slots 0,1 host 2 processes; 3,4,5 one; 7-10 two; 2, 6 idle; 11-15 one.
    per_slot = [len(p.ranks_on_slot(s)) for s in range(16)]
    assert per_slot == [2, 2, 1, 1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 1]
    assert p.world_size == 22
    actor = p.components["actor"]
    assert len(actor.ranks) == 15
    assert actor.ranks == (0, 1, 2, 3, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16)
    assert [p.slot_of_rank[r] for r in actor.ranks] == [0, 0, 1, 1, 3, 4, 5, 7, 7, 8, 8, 9, 9, 10, 10]
    assert p.roles_of(4) == () and p.slot_of_rank[4] == 2  # slot 2 idle
    assert p.components["rollout"].ranks == (17, 18, 19, 20, 21)
    assert p.node_of_rank(16) == 1 and p.node_of_rank(5) == 0 and p.node_of_slot(8) == 1


def test_collocated_components_share_ranks() -> None:
    p = parse_placement({"actor,inference": "0-3", "rollout": "4-7"}, 8)
    assert p.components["actor"].ranks == p.components["inference"].ranks == (0, 1, 2, 3)
    assert p.components["actor"].shared_with == ("inference",)
    assert p.components["rollout"].shared_with == ()
    assert p.roles_of(1) == ("actor", "inference")


def test_dict_form_records_node_group() -> None:
    p = parse_placement({"actor": {"node_group": "a800", "placement": "0-3"},
                         "rollout": {"placement": 4}}, 8)
    assert p.components["actor"].node_group == "a800"
    assert p.components["actor"].ranks == (0, 1, 2, 3)
    assert p.components["rollout"].node_group is None and p.components["rollout"].ranks == (4,)


def test_to_json_from_json_round_trip() -> None:
    p = parse_placement({"actor,inference": {"node_group": "g", "placement": "0-1:0-3"},
                         "rollout": "2-3"}, 4)
    data = p.to_json()
    assert data["world_size"] == 6
    assert data["components"]["actor"] == {"ranks": [0, 1, 2, 3], "slots": [0, 1], "node_group": "g",
                                           "shared_with": ["inference"]}
    assert Placement.from_json(data) == p
    assert Placement.from_json({"world_size": 2, "components": {"actor": {"ranks": [0]},
                                                                "rollout": {"ranks": [1]}}}).num_slots == 2


@pytest.mark.parametrize("data, key", [
    ({"world_size": 0, "components": {}}, "placement.world_size"),
    ({"world_size": 2, "slot_of_rank": [1, 0], "components": {}}, "placement.slot_of_rank"),
    ({"world_size": 2, "components": {"actor": {"ranks": [0, 5]}}}, "placement.actor"),
    ({"world_size": 2, "components": "x"}, "placement.components"),
])
def test_from_json_rejects_bad_data(data: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        Placement.from_json(data)
    assert key in issues_of(exc)


def test_placement_from_ranks() -> None:
    base = parse_placement({"actor,inference": "0-3", "rollout": "4-7"}, 8)
    new = placement_from_ranks({"actor": [0, 1, 2, 3, 4, 5], "rollout": [6, 7], "inference": [0, 1]}, base)
    assert new.world_size == base.world_size and new.slot_of_rank == base.slot_of_rank
    assert new.components["actor"].shared_with == ("inference",)
    assert new.roles_of(5) == ("actor",) and new.roles_of(7) == ("rollout",)
    with pytest.raises(ConfigError) as exc:
        placement_from_ranks({"actor": [0, 1], "rollout": [1, 2, 8], "inference": [], "critic": [3]}, base)
    found = issues_of(exc)
    assert set(found) == {"placement.rollout", "placement.inference", "placement.critic"}
    assert "0-7" in found["placement.rollout"].allowed
    with pytest.raises(ConfigError) as exc:
        placement_from_ranks({"actor": [0, 1], "rollout": [1, 2]}, base)
    assert "only collocated components may share ranks" in str(exc.value)


# --------------------------------------------------------------------------- placement errors

BAD_PLACEMENTS = [
    pytest.param({"actor": "0-8", "rollout": "0"}, "cluster.component_placement.actor", "0-8",
                 "slot 8 is outside the allocation", id="out-of-allocation"),
    pytest.param({"actor": "3-1", "rollout": "4"}, "cluster.component_placement.actor", "3-1",
                 PLACEMENT_FORMS, id="reversed-range"),
    pytest.param({"actor": "a-b", "rollout": "4"}, "cluster.component_placement.actor", "a-b",
                 PLACEMENT_FORMS, id="letters"),
    pytest.param({"actor": "", "rollout": "4"}, "cluster.component_placement.actor", "",
                 PLACEMENT_FORMS, id="empty"),
    pytest.param({"actor": None, "rollout": "4"}, "cluster.component_placement.actor", None,
                 PLACEMENT_FORMS, id="none"),
    pytest.param({"actor": "0-1:1-2", "rollout": "4"}, "cluster.component_placement.actor", "0-1:1-2",
                 "process ranks contiguous from 0", id="non-contiguous-from-0"),
    pytest.param({"actor": "0-1:0-3,2-3:5-6", "rollout": "4"}, "cluster.component_placement.actor",
                 "0-1:0-3,2-3:5-6", "expected 4", id="non-contiguous-gap"),
    pytest.param({"actor": "0-1", "actor,inference": "2-3", "rollout": "4"},
                 "cluster.component_placement.actor,inference", "actor",
                 "each component in one entry only", id="listed-twice"),
    pytest.param({"actor": "0-1", "judge": "2-3", "rollout": "4"}, "cluster.component_placement.judge",
                 "judge", "component names among actor, rollout, inference, critic, reward", id="unknown-component"),
    pytest.param({"actor": "0-1", "critic,inference": "2-3", "rollout": "4"},
                 "cluster.component_placement.critic,inference", "critic", "'critic' in the actor's entry",
                 id="critic-sharing-its-own-ranks"),
    pytest.param({"actor": "0-2", "critic": "2-3", "rollout": "4"}, "cluster.component_placement.critic",
                 "2-3", "slots no other component uses", id="critic-on-the-actors-ranks-in-its-own-entry"),
    pytest.param({"actor": "0-1", "reward": "2-3", "rollout": "3-4"}, "cluster.component_placement.reward",
                 "2-3", "slots of ranks that serve a component (the reward's worker processes run beside a rank: "
                 "slots [2] serve none)", id="reward-apart-on-a-slot-of-no-rank"),
    pytest.param({"actor": "0-3", "rollout": "3-5"}, "cluster.component_placement.rollout", "3-5",
                 "slot 3 is also used by 'actor'", id="overlap"),
    pytest.param({"actor": "0-2:0-3", "rollout": "4"}, "cluster.component_placement.actor", "0-2:0-3",
                 "processes spread evenly", id="uneven"),
    pytest.param({"actor": "0-1,1-2", "rollout": "4"}, "cluster.component_placement.actor", "0-1,1-2",
                 "resource ranks in ascending order", id="slot-twice-in-entry"),
    pytest.param({"actor": "0-1"}, "cluster.component_placement.rollout", None, "actor, rollout",
                 id="missing-rollout"),
    pytest.param({"actor": {"placement": "0-1", "gpus": 2}, "rollout": "4"},
                 "cluster.component_placement.actor.gpus", 2, "node_group and placement",
                 id="dict-unknown-key"),
]


@pytest.mark.parametrize("raw, key, value, allowed", BAD_PLACEMENTS)
def test_bad_placement(raw: dict[str, Any], key: str, value: Any, allowed: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_placement(raw, 8)
    if value is None and key.endswith("rollout"):
        assert f"{key}: got <missing>; allowed: " in str(exc.value)
        assert allowed in str(exc.value)
    else:
        assert_issue(exc.value, key, value, allowed)


def test_example_message_text() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_placement({"actor": "3-1", "rollout": "4"}, 8)
    assert str(exc.value) == (
        "cluster.component_placement.actor: got '3-1'; allowed: a range 'a-b' with a <= b, a comma "
        "list of ranges, 'all', or 'resources:processes'")


def test_all_placement_errors_reported_at_once() -> None:
    raw = {"actor": "3-1", "rollout": "0-9", "critic,reward": "1", "inference": "0-2:0-4"}
    with pytest.raises(ConfigError) as exc:
        parse_placement(raw, 8)
    lines = str(exc.value).splitlines()
    assert len(lines) == len(exc.value.issues) == 4
    assert set(issues_of(exc)) == {f"cluster.component_placement.{k}" for k in raw}


@pytest.mark.parametrize("raw, bad", [
    ({"actor": "4-5", "rollout": "0-3", "inference": "6-7"}, "rollout"),    # rollout before actor
    ({"actor": "1-2", "rollout": "3-5", "inference": "0"}, "inference"),     # inference first
    ({"actor": "0-1,4", "rollout": "2-3", "inference": "5-7"}, "actor"),    # actor not one block
])
def test_auto_scheduler_requires_contiguous_ordered_blocks(raw: dict[str, Any], bad: str) -> None:
    parse_placement(raw, 8)  # fine without the auto scheduler
    with pytest.raises(ConfigError) as exc:
        parse_placement(raw, 8, auto_scheduler=True)
    key = f"cluster.component_placement.{bad}"
    assert key in issues_of(exc)
    assert "actor -> rollout -> inference" in issues_of(exc)[key].allowed
    # a block may be written as a comma list (ascending, as RLinf requires)
    parse_placement({"actor": "0-1", "rollout": "2-5", "inference": "6,7"}, 8, auto_scheduler=True)


def test_auto_scheduler_collocated_entry_is_one_block() -> None:
    p = parse_placement({"actor,inference": "0-3", "rollout": "4-7"}, 8, auto_scheduler=True)
    assert p.components["inference"].ranks == (0, 1, 2, 3)


def test_world_is_fixed_for_later_placements() -> None:
    base = parse_placement({"actor": "0-1:0-3", "rollout": "2-3"}, 4)
    assert base.world_size == 6
    later = parse_placement({"actor": "0-2", "rollout": "3"}, 4, world=base)
    assert later.world_size == 6 and later.slot_of_rank == base.slot_of_rank
    assert later.components["actor"].ranks == (0, 2, 4) and later.components["rollout"].ranks == (5,)
    with pytest.raises(ConfigError) as exc:
        parse_placement({"actor": "0-1", "rollout": "2-3:0-3"}, 4, world=base)
    assert "at most 1 process(es) on slot 2" in str(exc.value)


# --------------------------------------------------------------------------- gpus_per_node


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_GPUS_ON_NODE": "8", "SLURM_NTASKS_PER_NODE": "4"}, 8),
    ({"SLURM_NTASKS_PER_NODE": "4"}, 4),
    ({"SLURM_TASKS_PER_NODE": "4(x2)"}, 4),
    ({"SLURM_TASKS_PER_NODE": "2"}, 2),
    ({"SLURM_TASKS_PER_NODE": "3,3(x3)"}, 3),
])
def test_gpus_per_node_from_slurm_env(env: dict[str, str], expected: int) -> None:
    assert resolve_gpus_per_node(None, env) == expected
    assert resolve_gpus_per_node(6, env) == 6  # explicit value wins


@pytest.mark.parametrize("env, value", [
    ({}, None),
    ({"SLURM_TASKS_PER_NODE": "4(x2),3"}, "SLURM_TASKS_PER_NODE='4(x2),3'"),
    ({"SLURM_GPUS_ON_NODE": "eight"}, "SLURM_GPUS_ON_NODE='eight'"),
    ({"SLURM_NTASKS_PER_NODE": "0"}, "SLURM_NTASKS_PER_NODE='0'"),
])
def test_gpus_per_node_errors(env: dict[str, str], value: Any) -> None:
    with pytest.raises(ConfigError) as exc:
        resolve_gpus_per_node(None, env)
    assert_issue(exc.value, "cluster.gpus_per_node", value, "a positive int")


def test_load_config_takes_gpus_per_node_from_env_and_writes_it_back() -> None:
    cfg = load_config(REPO / "configs/examples/slurm_2x4.yaml", env=SLURM_ENV)
    assert cfg.cluster.gpus_per_node == 4 and cfg.num_slots == 8
    assert cfg.raw.cluster.gpus_per_node == 4
    with pytest.raises(ConfigError) as exc:
        load_config(REPO / "configs/examples/slurm_2x4.yaml", env={})
    assert "cluster.gpus_per_node" in issues_of(exc)


# --------------------------------------------------------------------------- loading


def test_quickstart_sections_and_defaults() -> None:
    cfg = load_config(REPO / "configs/quickstart.yaml", env={})
    assert isinstance(cfg, Config)
    assert cfg.runtime.device == "cpu" and cfg.cluster.gpus_per_node == 4
    assert cfg.runtime.seed == 1234 and cfg.runtime.keep_iterations == 2  # defaults
    assert cfg.scheduler.policy == "auto" and cfg.cluster.auto_scheduler and cfg.scheduler.script == []
    assert cfg.train.minibatch_order == "arrival"  # default: stream whole groups as they complete
    assert ranks(cfg.placement) == {"actor": (0,), "rollout": (1, 2), "inference": (3,)}
    assert cfg.model.path == "runs/toy/model" and cfg.model.num_attention_heads is None  # sizes: its config.json
    assert cfg.data.train_files == ["runs/toy/train.jsonl"] and cfg.reward.name == "gsm8k"
    assert cfg.algorithm.kl_coef == 0.05 and cfg.actor.beta2 == 0.99 and cfg.rollout.backend == "hf"
    with pytest.raises(Exception):
        cfg.raw.train.num_iterations = 9  # read-only


def test_emulated_example_sections() -> None:
    cfg = load_config(REPO / "configs/examples/emulated_8.yaml", env={})
    assert cfg.runtime.device == "emulated" and cfg.cluster.gpus_per_node == 8
    assert cfg.train.num_iterations == 4 and cfg.train.global_batch_size == 32
    assert cfg.scheduler.policy == "scripted" and 2 <= len(cfg.scheduler.script) <= 3
    assert len(cfg.script_placements) == len(cfg.scheduler.script)
    assert ranks(cfg.placement) == {"actor": (0, 1), "rollout": (2, 3, 4, 5), "inference": (6, 7)}
    # defaults; old log-probs resolved: the actor's, scored on the inference ranks
    assert cfg.model == ModelSection() and cfg.algorithm == AlgorithmSection(old_logprobs="actor")


def test_engine_sections_typed() -> None:
    cfg = config_from_yaml_text(BASE_YAML + "model: {hidden_size: 64, num_attention_heads: 2}\nalgorithm: {kl_coef: 0.1}\n")
    assert cfg.model.hidden_size == 64 and cfg.model.num_layers is None and cfg.algorithm.kl_coef == 0.1
    assert cfg.raw.model.hidden_size == 64


def test_overrides() -> None:
    cfg = config_from_yaml_text(BASE_YAML, [
        "train.num_iterations=6",
        "emulated.rollout_s_per_token=1e-5",
        "runtime.heartbeat_timeout_s=5",
        "cluster.component_placement.rollout=2-4",
        "runtime.device=cpu",
        "data.train_files=[prompts.jsonl]",
        "reward.name=exact",
        "model.hidden_size=256",
    ])
    assert cfg.train.num_iterations == 6
    assert cfg.emulated.rollout_s_per_token == 1e-5
    assert cfg.runtime.heartbeat_timeout_s == 5.0 and isinstance(cfg.runtime.heartbeat_timeout_s, float)
    assert cfg.placement.components["rollout"].ranks == (2, 3, 4)
    assert cfg.placement.components["inference"].ranks == (6, 7)
    assert cfg.runtime.device == "cpu" and cfg.model.hidden_size == 256


def test_override_replaces_whole_placement_mapping() -> None:
    cfg = config_from_yaml_text(BASE_YAML, ["cluster.component_placement={actor: 0-3, rollout: 4-7}"])
    assert ranks(cfg.placement) == {"actor": (0, 1, 2, 3), "rollout": (4, 5, 6, 7)}


def test_override_script_item() -> None:
    cfg = load_config(REPO / "configs/examples/emulated_8.yaml", ["scheduler.script.0.at_iteration=2",
                                                         "scheduler.script.1.at_iteration=1"])
    assert [s.at_iteration for s in cfg.scheduler.script[:2]] == [2, 1]


def test_bad_overrides_all_reported() -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML, ["train.foo=1", "nokey", "train.group_size=abc",
                                          "train.num_iterations.x=1"])
    found = issues_of(exc)
    assert_issue(exc.value, "train.foo", 1, "one of the keys num_iterations")
    assert_issue(exc.value, "override 'nokey'", "nokey", "key.path=value")
    assert_issue(exc.value, "train.group_size", "abc", "int")
    assert "train.num_iterations" in found
    assert len(str(exc.value).splitlines()) == 4


def test_minibatch_order_errors() -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML, ["train.minibatch_order=random"])
    assert_issue(exc.value, "train.minibatch_order", "random", "one of arrival, index")
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML, ["train.minibatch_order=index", "train.group_size=3",
                                          "train.global_batch_size=8", "train.rollout_batch_size=8",
                                          "train.micro_batch_size=4"])
    assert_issue(exc.value, "train.minibatch_order", "index", "multiple of train.group_size (3)")
    assert config_from_yaml_text(BASE_YAML, ["train.minibatch_order=index"]).train.minibatch_order == "index"


def test_now_resolver_in_run_dir() -> None:
    year = datetime.now().strftime("%Y")
    cfg = config_from_yaml_text(BASE_YAML)
    assert re.fullmatch(r"runs/\d{8}-\d{6}", cfg.runtime.run_dir)
    cfg = config_from_yaml_text(BASE_YAML, ["runtime.run_dir=out/${now:%Y}/x"])
    assert cfg.runtime.run_dir == f"out/{year}/x" and cfg.raw.runtime.run_dir == f"out/{year}/x"


def test_round_trip_via_yaml(tmp_path: Path) -> None:
    cfg = load_config(REPO / "configs/examples/placement_forms.yaml", ["model.hidden_size=256"])
    text = cfg.to_yaml()
    assert "${now" not in text
    (tmp_path / "config.yaml").write_text(text)
    again = load_config(tmp_path / "config.yaml", env={})
    assert again == cfg and again.to_yaml() == text
    assert config_from_yaml_text(text, env={}) == cfg
    slurm = load_config(REPO / "configs/examples/slurm_2x4.yaml", env=SLURM_ENV)
    assert config_from_yaml_text(slurm.to_yaml(), env={}).placement == slurm.placement


def test_validation_errors_all_at_once() -> None:
    text = """
cluster:
  gpus_per_node: 4
  bogus: 1
  component_placement: {actor: 0-1, rollout: 2-3}
runtime: {device: gpu, heartbeat_timeout_s: 0.5}
train: {micro_batch_size: 5, rollout_batch_size: 3}
scheduler:
  policy: magic
  script:
    - {at_iteration: 1, placement: {actor: 0-3, rollout: 0}}
    - {at_iteration: 2, placement: {actor: 0-9, rollout: 2-3}, at_phase: middle}
    - {at_iteration: 0, placement: {actor: 0-1, rollout: 2}, at_phase: train, at_rollout_fraction: 0.5}
    - {at_iteration: 0, placement: {actor: 0-1, rollout: 2}, at_phase: rollout, at_rollout_fraction: 1.0}
emulated: {scaling: 1.5}
extra_section: {a: 1}
"""
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(text)
    err = exc.value
    assert_issue(err, "cluster.bogus", 1, "one of the keys num_nodes")
    assert_issue(err, "runtime.device", "gpu", "one of auto, cpu, cuda, emulated")
    assert_issue(err, "runtime.heartbeat_timeout_s", 0.5, "more than runtime.heartbeat_interval_s")
    assert_issue(err, "train.global_batch_size", 32, "a multiple of train.micro_batch_size (5)")
    assert_issue(err, "train.global_batch_size", 32, "a divisor of train.rollout_batch_size")
    assert_issue(err, "scheduler.policy", "magic", "one of static, scripted, auto")
    assert_issue(err, "scheduler.script[0].placement.rollout", 0, "slot 0 is also used by 'actor'")
    assert_issue(err, "scheduler.script[1].placement.actor", "0-9", "slots 0-3")
    assert_issue(err, "scheduler.script[1].at_phase", "middle", "one of start")
    assert_issue(err, "scheduler.script[2].at_rollout_fraction", 0.5, "0 unless at_phase is rollout")
    assert_issue(err, "scheduler.script[3].at_rollout_fraction", 1.0, "a number in [0, 1)")
    assert_issue(err, "emulated.scaling", 1.5, "(0, 1]")
    assert_issue(err, "extra_section", {"a": 1}, "one of the keys cluster")
    assert len(err.issues) == 13 == len(str(err).splitlines())


def test_type_errors_in_script_items_keep_indices() -> None:
    text = BASE_YAML + """
scheduler:
  script:
    - 3
    - {at_iteration: x, placement: {actor: 0, rollout: 1}}
    - {at_iteration: 1}
"""
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(text)
    assert_issue(exc.value, "scheduler.script[0]", 3, "a mapping with keys at_iteration")
    assert_issue(exc.value, "scheduler.script[1].at_iteration", "x", "int")
    assert "scheduler.script[2].placement: got <missing>" in str(exc.value)
    assert len(exc.value.issues) == 3


def test_missing_placement_and_no_file() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(None, ["cluster.gpus_per_node=8", "runtime.device=emulated"])
    assert str(exc.value).startswith("cluster.component_placement: got <missing>; allowed: a mapping")
    cfg = load_config(None, ["cluster.gpus_per_node=8", "cluster.component_placement={actor: 0, rollout: 1}",
                             "runtime.device=emulated"])
    assert cfg.placement.world_size == 8


def test_unresolvable_interpolation_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(CLUSTER_YAML + "runtime: {run_dir: '${nope:x}', device: '${oc.env:SLURM_RL_NOPE}'}\n")
    assert_issue(exc.value, "runtime.run_dir", "${nope:x}", "a resolvable interpolation")
    assert_issue(exc.value, "runtime.device", "${oc.env:SLURM_RL_NOPE}", "a resolvable interpolation")
    assert len(exc.value.issues) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: [\n")
    with pytest.raises(ConfigError) as exc:
        load_config(bad)
    assert exc.value.issues[0].key.startswith(str(bad))
    with pytest.raises(ConfigError) as exc:
        load_config(tmp_path / "absent.yaml")
    assert "a readable YAML file" in str(exc.value)


def test_config_error_pickles() -> None:
    err = ConfigError([ConfigIssue("a.b", 1, "int"), ConfigIssue("c", "x", "str")])
    again = pickle.loads(pickle.dumps(err))
    assert again.issues == err.issues and str(again) == str(err) == "a.b: got 1; allowed: int\nc: got 'x'; allowed: str"
    assert isinstance(again, ValueError)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_example_configs_load(path: Path) -> None:
    cfg = load_config(path, env=SLURM_ENV)
    assert cfg.placement.num_slots == cfg.cluster.num_nodes * cfg.cluster.gpus_per_node
    assert {"actor", "rollout"} <= set(cfg.placement.components)
    assert config_from_yaml_text(cfg.to_yaml(), env={}) == cfg


def test_expected_config_files_exist() -> None:
    names = {str(p.relative_to(REPO)) for p in CONFIG_FILES}
    assert {"configs/quickstart.yaml", "configs/examples/emulated_8.yaml", "configs/examples/emulated_64.yaml",
            "configs/examples/slurm_2x4.yaml", "configs/examples/placement_forms.yaml"} <= names
    assert load_config(REPO / "configs/examples/emulated_64.yaml").placement.world_size == 64


def test_simulator_knobs_validated() -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML, ["emulated.response_len_dist=zipf", "emulated.response_len_alpha=1",
                                          "emulated.decode_fixed_fraction=0", "scheduler.tick_s=0",
                                          "scheduler.rollout_ranks_per_instance=0", "runtime.run_timeout_s=-1"])
    assert_issue(exc.value, "emulated.response_len_dist", "zipf", "one of lognormal, pareto, fixed")
    assert_issue(exc.value, "emulated.response_len_alpha", 1.0, "a number > 1")
    assert_issue(exc.value, "emulated.decode_fixed_fraction", 0.0, "(0, 1]")
    assert_issue(exc.value, "scheduler.tick_s", 0.0, "a positive number")
    assert_issue(exc.value, "scheduler.rollout_ranks_per_instance", 0, "a positive int")
    assert_issue(exc.value, "runtime.run_timeout_s", -1.0, "a positive number")
    assert len(exc.value.issues) == 6


def test_defaults_agree_with_scheduler_defaults() -> None:
    """The schema takes the scheduler's documented defaults (scheduler.defaults), not copies."""
    defaults = pytest.importorskip("slurm_rl.scheduler.defaults")
    cfg = config_from_yaml_text(BASE_YAML)
    assert cfg.scheduler.max_running_requests == defaults.MAX_RUNNING_REQUESTS
    assert cfg.scheduler.pre_process_threshold == defaults.PRE_PROCESS_THRESHOLD
    assert cfg.scheduler.rollout_ranks_per_instance == defaults.RANKS_PER_INSTANCE
    assert cfg.scheduler.actor_ranks_per_instance == defaults.RANKS_PER_INSTANCE
    assert cfg.scheduler.switch_latency_s == defaults.SWITCH_LATENCY_S
    assert cfg.scheduler.tick_s == defaults.TICK_S and cfg.scheduler.seed == defaults.SEED
    assert cfg.emulated.response_len_dist == defaults.RESPONSE_LEN_DIST
    assert cfg.emulated.response_len_sigma == defaults.RESPONSE_LEN_SIGMA
    assert cfg.emulated.response_len_alpha == defaults.PARETO_ALPHA
    assert cfg.emulated.decode_fixed_fraction == defaults.DECODE_FIXED_FRACTION
    assert cfg.cluster.use_pre_process_policy == defaults.USE_PRE_PROCESS_POLICY
    assert cfg.cluster.use_wait_before_last_iter_policy == defaults.USE_WAIT_BEFORE_LAST_ITER_POLICY
    assert cfg.scheduler.policy == defaults.POLICY


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SLURM_GPUS_ON_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    assert load_config(REPO / "configs/examples/slurm_2x4.yaml").placement.world_size == 8


def test_config_copies_pickles_and_is_read_only() -> None:
    import copy
    import dataclasses

    cfg = load_config(REPO / "configs/examples/placement_forms.yaml")
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert copy.deepcopy(cfg.placement) == cfg.placement and hash(cfg.placement) == hash(copy.copy(cfg.placement))
    as_dict = dataclasses.asdict(cfg)
    assert as_dict["placement"]["components"]["rollout"]["node_group"] == "default"
    with pytest.raises(TypeError):
        cfg.placement.components["actor"] = cfg.placement.components["rollout"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.placement = cfg.placement  # type: ignore[misc]


@st.composite
def disjoint_layouts(draw: Any) -> tuple[int, dict[str, str], list[int]]:
    """Slots cut into contiguous blocks (actor, rollout, [inference, idle]), each with a
    processes-per-slot multiplicity; returns (num_slots, raw placement, processes per slot)."""
    num_slots = draw(st.integers(min_value=2, max_value=24))
    cuts = sorted(draw(st.lists(st.integers(1, num_slots - 1), min_size=1, max_size=3, unique=True)))
    bounds = [0, *cuts, num_slots]
    raw: dict[str, str] = {}
    per_slot = [1] * num_slots
    for name, lo, hi in zip(COMPONENTS, bounds, bounds[1:]):
        k = draw(st.integers(1, 3))
        n = hi - lo
        raw[name] = f"{lo}-{hi - 1}:0-{n * k - 1}" if k > 1 else f"{lo}-{hi - 1}"
        per_slot[lo:hi] = [k] * n
    return num_slots, raw, per_slot  # at least two blocks: actor and rollout are placed


@settings(max_examples=examples(60), deadline=None)
@given(disjoint_layouts())
def test_rank_numbering_properties(layout: tuple[int, dict[str, str], list[int]]) -> None:
    num_slots, raw, per_slot = layout
    last = max(int(v.split(":")[0].split("-")[1]) for v in raw.values())
    p = parse_placement(raw, num_slots, auto_scheduler=last == num_slots - 1)  # RLinf: no idle tail
    assert p.world_size == sum(per_slot)
    assert list(p.slot_of_rank) == sorted(p.slot_of_rank)  # slot-major numbering
    assert [len(p.ranks_on_slot(s)) for s in range(num_slots)] == per_slot
    for comp in p.components.values():
        assert list(comp.ranks) == sorted(comp.ranks)
        assert {p.slot_of_rank[r] for r in comp.ranks} == set(comp.slots)
        assert all(comp.name in p.roles_of(r) for r in comp.ranks)
    used = [r for comp in p.components.values() for r in comp.ranks]
    assert len(used) == len(set(used))  # disjoint components never share a rank
    assert Placement.from_json(p.to_json()) == p


# --------------------------------------------------------------------------- RLinf semantics (issue 13)


def test_one_process_over_several_accelerators() -> None:
    p = parse_placement({"actor": "0-3:0-1", "rollout": "4-7"}, 8)
    assert p.world_size == 6 and p.components["actor"].ranks == (0, 1)
    assert p.slots_of_rank[:2] == ((0, 1), (2, 3)) and p.slot_of_rank == (0, 2, 4, 5, 6, 7)
    assert p.components["actor"].slots == (0, 1, 2, 3) and p.ranks_on_slot(1) == (0,)
    assert p.to_json()["slots_of_rank"][:3] == [[0, 1], [2, 3], [4]]
    assert Placement.from_json(p.to_json()) == p
    # a mixed entry: 2 processes of 2 GPUs, then one process per slot; 3 GPUs per process
    q = parse_placement({"actor": "0-3:0-1,4-5", "rollout": "6-11:0-1"}, 12)
    assert q.components["actor"].ranks == (0, 1, 2, 3) and q.slots_of_rank[4:] == ((6, 7, 8), (9, 10, 11))
    # processes per GPU still works beside it
    assert parse_placement({"actor": "0-1:0-3", "rollout": "2-3:0"}, 4).slots_of_rank == ((0,), (0,), (1,), (1,), (2, 3))


@pytest.mark.parametrize("raw, key, value, allowed", [
    ({"actor": "0-2:0-1", "rollout": "4-7"}, "actor", "0-2:0-1", "one of the resource and process counts divides the other"),
    ({"actor": "0-3:0-2", "rollout": "4-7"}, "actor", "0-3:0-2", "one of the resource and process counts divides the other"),
    ({"actor": "0-1", "rollout": "3-4:0"}, "rollout", "3-4:0", "each process's slots on one node"),
])
def test_several_accelerators_refused(raw: dict[str, Any], key: str, value: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_placement(raw, 8, num_nodes=2)
    assert_issue(exc.value, f"cluster.component_placement.{key}", value, allowed)


def test_multi_accelerator_ranks_fix_the_world() -> None:
    base = parse_placement({"actor": "0-3:0-1", "rollout": "4-7"}, 8)
    again = parse_placement({"actor": "4-7", "rollout": "0-3:0-1"}, 8, world=base)
    assert again.components["rollout"].ranks == (0, 1) and again.components["actor"].ranks == (2, 3, 4, 5)
    assert parse_placement({"actor": "0-1:0", "rollout": "2-3:0,4-7"}, 8, world=base).components["actor"].ranks == (0,)
    with pytest.raises(ConfigError) as exc:
        parse_placement({"actor": "0-3", "rollout": "4-7"}, 8, world=base)
    assert "the world is fixed by the initial placement" in issues_of(exc)["cluster.component_placement.actor"].allowed


def test_validate_json_shows_several_slots_of_a_rank(tmp_path: Path) -> None:
    import json
    import subprocess

    path = tmp_path / "c.yaml"
    path.write_text("cluster: {num_nodes: 1, gpus_per_node: 4, component_placement: {actor: '0-1', rollout: '2-3:0'}}\n"
                    f"runtime: {{run_dir: {tmp_path / 'run'}, device: emulated}}\n")
    out = subprocess.run([*CLI, "validate", str(path), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["slots_of_rank"] == [[0], [1], [2, 3]] and doc["components"]["rollout"] == {"ranks": [2], "slots": [2, 3]}


def test_resource_ranks_must_ascend() -> None:
    p = parse_placement({"actor": "0-1,4-5", "rollout": "2-3,6-7"}, 8)
    assert p.components["actor"].ranks == (0, 1, 4, 5)
    for spec in ("4-5,0-1", "2,1", "0-3:0-1,2-3:2-3"):
        with pytest.raises(ConfigError) as exc:
            parse_placement({"actor": spec, "rollout": "6-7"}, 8)
        assert_issue(exc.value, "cluster.component_placement.actor", spec, "resource ranks in ascending order")


NODE_GROUPS = """
runtime: {device: emulated}
cluster:
  num_nodes: 3
  node_groups:
    big: {nodes: "0", gpus_per_node: 8}
    small: {nodes: "1-2", gpus_per_node: 2}
    pool: {nodes: "0-1"}
  component_placement:
    actor: {node_group: big, placement: "0-7:0-3"}
    rollout: {node_group: small, placement: "2-3:0"}
    inference: {node_group: pool, placement: "8-9"}
"""


def test_node_groups_number_their_own_accelerators() -> None:
    cfg = config_from_yaml_text(NODE_GROUPS, env={})  # no gpus_per_node needed: the groups give every node's
    p = cfg.placement
    assert p.num_slots == 12 and p.slots_per_node == (8, 2, 2)
    # rollout: slots 2-3 of group small = node 2's two GPUs = global 10-11, one process
    assert p.components["rollout"].slots == (10, 11) and p.slots_of_rank[p.components["rollout"].ranks[0]] == (10, 11)
    # inference: slots 8-9 of group pool (node 0: 8 GPUs, node 1: 2) = node 1 = global 8-9
    assert p.components["inference"].slots == (8, 9)
    assert [p.node_of_slot(s) for s in (7, 8, 9, 10, 11)] == [0, 1, 1, 2, 2]
    assert p.ranks_per_node() == (4, 2, 1) and p.node_of_rank(p.components["rollout"].ranks[0]) == 2
    assert Placement.from_json(p.to_json()) == p
    # "0" of group infer is the first accelerator of its node, not global slot 0 (no overlap with actor)
    two = config_from_yaml_text(
        "cluster: {num_nodes: 2, gpus_per_node: 4, node_groups: {train: {nodes: '0'}, infer: {nodes: '1'}},"
        " component_placement: {actor: '0-3', rollout: {node_group: infer, placement: '0'}}}\n"
        "runtime: {device: emulated}", env={})
    assert two.placement.components["rollout"].slots == (4,)
    # without cluster.node_groups a label is only recorded (the group of all nodes), as before
    assert parse_placement({"actor": {"node_group": "x", "placement": "0"}, "rollout": "1"}, 2).components["actor"].slots == (0,)


@pytest.mark.parametrize("override, key, value, allowed", [
    ("cluster.component_placement.rollout.node_group=nope", "cluster.component_placement.rollout.node_group", "nope",
     "a node group defined in cluster.node_groups (big, pool, small)"),
    ("cluster.component_placement.rollout.placement=0-4", "cluster.component_placement.rollout", "0-4",
     "slots 0-3 (the 4 slots of node group 'small'); slot 4 is outside the group"),
    ("cluster.node_groups.small.nodes=2-5", "cluster.node_groups.small.nodes", "2-5", "node indices of the allocation"),
    ("cluster.node_groups.pool.gpus_per_node=4", "cluster.node_groups.pool.gpus_per_node", 4,
     "8, as node group 'big' gives node 0"),
])
def test_node_groups_refused(override: str, key: str, value: Any, allowed: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(NODE_GROUPS, [override], env={})
    assert_issue(exc.value, key, value, allowed)


def test_auto_scheduler_layout_rules() -> None:
    ok = parse_placement({"actor": "0-1", "rollout": "2-5", "inference": "6-7"}, 8, auto_scheduler=True)
    assert ok.components["inference"].ranks == (6, 7)
    parse_placement({"actor,inference": "0-3", "rollout": "4-7"}, 8, auto_scheduler=True)
    for raw, bad, why in [
        ({"actor": "1-2", "rollout": "3-7"}, "actor", "starts at slot 1; the actor starts at slot 0"),
        ({"actor": "0-1", "rollout": "3-7"}, "rollout", "starts at slot 3; the previous block ends at slot 1"),
        ({"actor": "0-1", "rollout": "2-5", "inference": "6"}, "inference", "ends at slot 6, not at the last slot 7"),
        ({"actor": "0-1", "rollout": "2-3", "inference": "5-7"}, "inference", "starts at slot 5"),
    ]:
        parse_placement(raw, 8)  # fine without the auto scheduler
        with pytest.raises(ConfigError) as exc:
            parse_placement(raw, 8, auto_scheduler=True)
        assert list(issues_of(exc)) == [f"cluster.component_placement.{bad}"]
        assert why in issues_of(exc)[f"cluster.component_placement.{bad}"].allowed


def test_collocated_components_in_separate_keys() -> None:
    together = parse_placement({"actor,rollout": "0-3", "inference": "4-7"}, 8)
    apart = parse_placement({"actor": "0-3", "rollout": "0-3", "inference": "4-7"}, 8)
    assert apart == together and apart.components["rollout"].shared_with == ("actor",)
    assert parse_placement({"actor": "0-3:0-1", "rollout": "0-1:0,2-3:1"}, 4).components["rollout"].ranks == (0, 1)
    assert parse_placement({"actor": "0-3", "rollout": "0-3"}, 4, auto_scheduler=True).world_size == 4
    for raw, allowed in [
        ({"actor": "0-3", "rollout": "2-5"}, "slots not used by another entry, or exactly the same slots to collocate "
                                            "(slot 2 is also used by 'actor'"),
        ({"actor": "0-3", "rollout": "0-3:0-7"}, "the same processes as 'actor' on the same slots"),
    ]:
        with pytest.raises(ConfigError) as exc:
            parse_placement(raw, 8)
        assert_issue(exc.value, "cluster.component_placement.rollout", raw["rollout"], allowed)


# --------------------------------------------------------------------------- engine sections

ENGINE_KEYS = {
    "model": "path, tokenizer_path, vocab_size, hidden_size",
    "actor": "lr, min_lr, lr_warmup_samples",
    "rollout": "backend, sub_batch, max_new_tokens, top_p, top_k, stop",
    "algorithm": ("adv_estimator, norm_adv_by_std_in_grpo, gamma, clip_eps, clip_ratio_low, clip_ratio_high, "
                  "clip_ratio_c, loss_agg_mode, kl_coef, kl_loss_type, entropy_coeff, use_kl_in_reward, kl_penalty, "
                  "kl_ctrl, temperature"),
    "data": "train_files, val_files, prompt_key, answer_key",
    "reward": "name, fn, timeout_s, on_error, workers",
    "eval": "every, n, temperature, max_prompts",
}


@pytest.mark.parametrize("section", sorted(ENGINE_KEYS))
def test_unknown_engine_key_refused_with_allowed_keys(section: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML + f"{section}: {{bogus: 1}}\n")
    assert_issue(exc.value, f"{section}.bogus", 1, "one of the keys " + ENGINE_KEYS[section])
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML, [f"{section}.bogus=1"])
    assert_issue(exc.value, f"{section}.bogus", 1, "one of the keys " + ENGINE_KEYS[section])


@pytest.mark.parametrize("section", ["inference"])
def test_sections_without_settings_refuse_any_key(section: str) -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML + f"{section}: {{bogus: 1}}\n")
    assert_issue(exc.value, f"{section}.bogus", 1, "no keys")


def test_engine_defaults_are_the_engines_defaults() -> None:
    cfg = config_from_yaml_text(BASE_YAML)
    assert (cfg.actor.lr, cfg.actor.beta1, cfg.actor.threads, cfg.actor.warm_joiners) == (1e-3, 0.9, 1, True)
    assert (cfg.algorithm.clip_eps, cfg.algorithm.kl_coef, cfg.algorithm.temperature) == (0.2, 0.0, 1.0)
    assert (cfg.rollout.backend, cfg.rollout.sub_batch, cfg.rollout.max_new_tokens, cfg.rollout.top_p,
            cfg.rollout.top_k, cfg.rollout.stop) == ("hf", None, 256, 1.0, 0, [])
    assert (cfg.data.prompt_key, cfg.data.answer_key, cfg.data.apply_chat_template, cfg.data.overlong,
            cfg.data.shuffle) == ("prompt", "answer", None, "drop", True)
    assert (cfg.reward.name, cfg.reward.fn, cfg.reward.on_error, cfg.eval.every) == (None, None, "raise", 0)
    # a random model's sizes: null in the config, the engines' defaults when built
    assert cfg.model.vocab_size is None and cfg.model.hidden_size is None
    from slurm_rl.config import model_sizes
    from slurm_rl.engines.model_config import ModelConfig

    sizes = model_sizes(cfg.model)
    assert (sizes["hidden_size"], sizes["num_attention_heads"]) == (128, 4)
    defaults = ModelConfig()
    assert all(sizes[k] == getattr(defaults, k) for k in sizes if k not in ("vocab_size", "num_query_groups",
                                                                              "ffn_hidden_size"))


def test_model_path_refuses_size_keys_and_real_devices_need_data_and_reward() -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML, ["model.path=/m", "model.hidden_size=64", "model.num_layers=2"])
    assert_issue(exc.value, "model.hidden_size", 64, "null with model.path: the architecture and sizes come from "
                 "/m/config.json")
    assert_issue(exc.value, "model.num_layers", 2, "null with model.path")
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML, ["runtime.device=cpu", "eval.every=5"])
    assert_issue(exc.value, "data.train_files", [], "a list of .jsonl or .parquet prompt files")
    assert_issue(exc.value, "reward.name", None, "one of gsm8k, gsm8k_strict, math, exact, auto, or reward.fn")
    assert_issue(exc.value, "eval.every", 5, "data.val_files set")
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML, ["runtime.device=cpu", "data.train_files=[a.jsonl]", "reward.name=exact",
                                          "reward.fn=m:f"])
    assert_issue(exc.value, "reward.name", "exact", "exactly one of the two")
    cfg = config_from_yaml_text(BASE_YAML, ["runtime.device=cpu", "data.train_files=[a.jsonl]", "reward.name=exact",
                                            "reward.workers=0"])  # scored in the rank's process
    assert cfg.reward.workers == 0
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML, ["runtime.device=cpu", "data.train_files=[a.jsonl]", "reward.name=exact",
                                          "reward.workers=-1", "reward.timeout_s=0"])
    assert_issue(exc.value, "reward.workers", -1, "a non-negative int")
    assert_issue(exc.value, "reward.timeout_s", 0.0, "a positive number")


def test_bad_engine_values_named_with_the_users_keys() -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML, [
            "actor.lr=-1", "actor.beta1=1.5", "actor.lr_decay_style=step", "actor.threads=0",
            "actor.clip_grad=0",
            "rollout.backend=sglang", "rollout.sub_batch=0", "algorithm.temperature=0", "algorithm.kl_coef=-0.1",
            "data.overlong=truncate", "reward.on_error=ignore", "rollout.top_p=0", "rollout.top_k=-1",
            "data.max_prompt_length=0", "reward.timeout_s=0",
            "model.hidden_size=130", "model.num_layers=0",
        ])
    err = exc.value
    assert_issue(err, "actor.lr", -1.0, "a positive number")
    assert_issue(err, "actor.beta1", 1.5, "a number in [0, 1)")
    assert_issue(err, "actor.lr_decay_style", "step", "one of cosine, linear, constant")
    assert_issue(err, "actor.threads", 0, "a positive int")
    assert_issue(err, "actor.clip_grad", 0.0, "a positive number")
    assert_issue(err, "rollout.backend", "sglang", "one of hf, vllm")
    assert_issue(err, "rollout.sub_batch", 0, "a positive int")
    assert_issue(err, "algorithm.temperature", 0.0, "a positive number")
    assert_issue(err, "algorithm.kl_coef", -0.1, "a non-negative number")
    assert_issue(err, "data.overlong", "truncate", "one of drop, error")
    assert_issue(err, "reward.on_error", "ignore", "one of raise, zero")
    assert_issue(err, "rollout.top_p", 0.0, "a number in (0, 1]")
    assert_issue(err, "rollout.top_k", -1, "a non-negative int")
    assert_issue(err, "data.max_prompt_length", 0, "a positive int")
    assert_issue(err, "reward.timeout_s", 0.0, "a positive number")
    assert_issue(err, "model.hidden_size", 130, "a multiple of model.num_attention_heads (4)")
    assert_issue(err, "model.num_layers", 0, "a positive int")
    assert not any(k.startswith(("optim.", "actor.batch.")) for k in issues_of(exc))


def test_engine_value_types_and_head_size() -> None:
    with pytest.raises(ConfigError) as exc:
        config_from_yaml_text(BASE_YAML, ["actor.lr=abc", "model.num_attention_heads=8", "actor.min_lr=0.1"])
    assert_issue(exc.value, "actor.lr", "abc", "float")
    assert_issue(exc.value, "model.num_attention_heads", 8, "even head size >= 32")
    assert_issue(exc.value, "actor.min_lr", 0.1, "a number in [0, actor.lr (0.001)]")


def test_engine_errors_raised_by_load_config(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(BASE_YAML + "algorithm: {clip_eps: 0.2, kl: 0.1}\nactor: {lr: -1}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path, env={})
    assert_issue(exc.value, "algorithm.kl", 0.1, "one of the keys " + ENGINE_KEYS["algorithm"])
    assert_issue(exc.value, "actor.lr", -1.0, "a positive number")


def test_engine_sections_match_the_engine_types() -> None:
    """``model`` (its size keys, nulls resolved) and ``actor`` carry the engines' fields with the
    engines' defaults."""
    import dataclasses

    from slurm_rl.config import ActorSection
    from slurm_rl.engines.actor.optimizer import OptimConfig
    from slurm_rl.engines.model_config import ModelConfig

    def defaults(dc: Any) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(dc)}

    from slurm_rl.config import MODEL_SIZE_KEYS, model_sizes

    engine = {k: v for k, v in defaults(ModelConfig).items() if k in MODEL_SIZE_KEYS}
    assert set(MODEL_SIZE_KEYS) <= set(defaults(ModelSection))
    assert model_sizes(ModelSection()) == engine | {"vocab_size": None}  # null: the tokenizer's
    layout = {"precision": "auto", "recompute": "none", "attention_backend": "sdpa",  # the model's build, not the optimizer's
              "tensor_parallel": 1,
              "tensor_parallel_choices": dataclasses.MISSING, "pipeline_parallel": 1,
              "ppo_epochs": 1,  # the protocol's passes over an iteration
              "offload_weight": False, "offload_grad": False, "offload_optimizer": False}  # collocated phases
    assert defaults(ActorSection) == defaults(OptimConfig) | {"threads": 1, "warm_joiners": True} | layout
    assert list(defaults(ActorSection))[:len(defaults(OptimConfig))] == list(defaults(OptimConfig))


def test_the_config_owns_its_vocabularies() -> None:
    """Allowed values are declared once in the config (the bottom layer) and used by their packages."""
    from slurm_rl import config, rollout_config
    from slurm_rl.engines.actor import lr_schedule
    from slurm_rl.rewards.builtin import BUILTIN
    from slurm_rl.scheduler import lengths, state
    from slurm_rl.scheduler.policies import POLICIES

    assert POLICIES is config.POLICIES and state.PHASES is config.PHASES
    assert lengths.DISTRIBUTIONS is config.LENGTH_DISTRIBUTIONS and lr_schedule.DECAY_STYLES is config.LR_DECAY_STYLES
    assert set(BUILTIN) == set(config.REWARD_NAMES)
    imports = [line for line in (REPO / "slurm_rl" / "config.py").read_text().splitlines()
               if line.startswith(("from slurm_rl", "import slurm_rl"))]
    assert all(line.startswith(("from slurm_rl.placement", "from slurm_rl.errors", "from slurm_rl.rollout_config"))
               for line in imports), imports
    assert config.ROLLOUT_DTYPES is rollout_config.ROLLOUT_DTYPES  # the bottom layer's rollout module declares them


def test_old_logprobs_follow_the_inference_component() -> None:
    """Default: the actor's where inference ranks can score them, else the rollout's; ``actor``
    without an inference component is refused naming the key."""
    no_inference = BASE_YAML.replace("rollout: 2-5\n    inference: 6-7", "rollout: 2-7")
    assert config_from_yaml_text(BASE_YAML).algorithm.old_logprobs == "actor"
    assert config_from_yaml_text(no_inference).algorithm.old_logprobs == "rollout"
    assert config_from_yaml_text(BASE_YAML + "algorithm: {old_logprobs: rollout}\n").algorithm.old_logprobs == "rollout"
    with pytest.raises(ConfigError) as err:
        config_from_yaml_text(no_inference + "algorithm: {old_logprobs: actor}\n")
    assert_issue(err.value, "algorithm.old_logprobs", "actor", "an inference component in cluster.component_placement")
    with pytest.raises(ConfigError) as err:
        config_from_yaml_text(BASE_YAML + "algorithm: {old_logprobs: critic}\n")
    assert_issue(err.value, "algorithm.old_logprobs", "critic", "one of actor, rollout")


def test_a_valid_layer_merged_at_once_equals_the_merge_key_by_key(tmp_path: Path) -> None:
    """A valid config is merged into the schema in one OmegaConf merge (the fast path); that gives
    what the key-by-key merge gives, and an invalid one falls back to it with every issue."""
    from emulated_configs import emulated_config
    from resume_helpers import run_config

    docs = [OmegaConf.to_container(OmegaConf.load(p)) for p in CONFIG_FILES]
    docs += [emulated_config(tmp_path / "e"), run_config("cpu", tmp_path / "c"), run_config("emulated", tmp_path / "d")]
    for doc in docs:
        fast_issues: list = []
        slow_issues: list = []
        slow = _schema()
        _merge_into(slow, doc, "", slow_issues)
        fast = _merge_layer(_schema(), doc, fast_issues)
        assert fast_issues == slow_issues == []
        assert OmegaConf.to_container(fast) == OmegaConf.to_container(slow)
    bad = dict(docs[-1], train={"num_iterations": "many", "no_such_key": 1}, nope={"x": 1})
    slow_issues, fast_issues = [], []
    _merge_into(_schema(), bad, "", slow_issues)
    _merge_layer(_schema(), bad, fast_issues)
    assert fast_issues == slow_issues and {i.key for i in fast_issues} == {"train.num_iterations", "train.no_such_key", "nope"}


def test_missing_keys_are_named_as_omegaconf_names_them() -> None:
    """The missing values found in the resolved container are the ones ``OmegaConf.missing_keys`` finds, keys
    inside lists of items included."""
    from slurm_rl.config import _missing_keys, _register_resolvers

    _register_resolvers()
    root = _schema()
    root.merge_with({"scheduler": {"script": [{"placement": {"actor": "0"}}, {"placement": {"rollout": "1"}}]}})
    resolved = OmegaConf.to_container(root, resolve=True)
    assert sorted(_missing_keys(resolved)) == sorted(OmegaConf.missing_keys(root))
    assert any(k.startswith("scheduler.script[1].") for k in _missing_keys(resolved))
    assert _missing_keys({"a": {"b": "???", "c": [1, {"d": "???"}]}, "e": "x"}) == ["a.b", "a.c[1].d"]


def test_an_invalid_layer_after_a_valid_one_is_merged_key_by_key_onto_it(tmp_path: Path) -> None:
    """A valid layer then an invalid one: the invalid one's issues are named and nothing of the valid layer is lost
    (the failed one-step merge is not left half done)."""
    from slurm_rl.config import _merge_layers

    issues: list = []
    root = _merge_layers([("a", {"train": {"num_iterations": 7}}),
                          ("b", {"train": {"group_size": 3, "micro_batch_size": "x", "nope": 1}})], issues)
    assert {i.key for i in issues} == {"train.micro_batch_size", "train.nope"}
    assert root.train.num_iterations == 7 and root.train.group_size == 3


YAML_FILES = sorted((REPO / "configs").rglob("*.yaml"))  # the group files too


@pytest.mark.parametrize("text", [
    *YAML_FILES,
    "train: {lr: 1e-4, n: 3, on: yes, tag: '1e-4', none: null, list: [1, 2.5, ~, x]}\n",
    "runtime:\n  run_dir: runs/${now:%Y%m%d}\n  device: emulated\nmodel:\n  path: ???\n",
    "a:\n  - {b: .inf, c: -.5, d: 0x10, e: 1_000}\n",
], ids=[*(p.name for p in YAML_FILES), "scalars", "interpolation-and-missing", "list-of-mappings"])
def test_plain_yaml_reads_as_omegaconf_reads_it(text: str | Path) -> None:
    """A plain mapping takes the fast read; it gives what OmegaConf's round trip gave."""
    from slurm_rl.config import _read_yaml

    text = text.read_text() if isinstance(text, Path) else text

    assert _read_yaml(text, "x") == OmegaConf.to_container(OmegaConf.create(text), resolve=False)


@pytest.mark.parametrize("text, error", [
    ("a: 1\na: 2\n", "duplicate key"),
    ("a: [1\n", "x:2:1"),
    ("1: x\ntrue: y\n", None),
    ("- 1\n- 2\n", None),
], ids=["duplicate-key", "syntax-error", "non-string-keys", "list"])
def test_yaml_that_is_not_a_plain_mapping_reads_as_before(text: str, error: str | None) -> None:
    from slurm_rl.config import _read_yaml

    if error is None:
        assert _read_yaml(text, "x") == OmegaConf.to_container(OmegaConf.create(text), resolve=False)
    else:
        with pytest.raises(ConfigError, match=error):
            _read_yaml(text, "x")


def test_a_reusable_config_is_taken_only_where_its_file_and_read_environment_are_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fork server loads the run's config once; a rank takes that object where the file reads the
    same and every variable the load read has its value, else it loads the file itself."""
    from slurm_rl.config import ReusableConfig

    path = tmp_path / "config.yaml"
    path.write_text(BASE_YAML.replace("gpus_per_node: 8", "gpus_per_node: null"))
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "8")
    monkeypatch.setenv("SLURM_PROCID", "0")
    loaded = ReusableConfig.load(path)
    assert loaded.env["SLURM_GPUS_ON_NODE"] == "8" and "SLURM_PROCID" not in loaded.env
    assert loaded.get(path) is loaded.config  # the same file and environment
    assert loaded.get(path, env={**os.environ, "SLURM_PROCID": "3"}) is loaded.config  # a variable it never read
    regrown = loaded.get(path, env={**os.environ, "SLURM_GPUS_ON_NODE": "16"})
    assert regrown is not loaded.config and regrown.cluster.gpus_per_node == 16
    path.write_text(path.read_text().replace("num_nodes: 1", "num_nodes: 1\n  # edited"))
    edited = loaded.get(path)
    assert edited is not loaded.config and edited.cluster == loaded.config.cluster
    path.write_text(path.read_text() + "runtime:\n  run_dir: ${oc.env:HOME}/run\n")
    with pytest.raises(ConfigError):  # a duplicate top-level key: loaded again, refused as before
        loaded.get(path)


def test_the_warm_up_document_is_a_valid_config_and_warms_the_schema() -> None:
    """A server about to fork warms the loader with a small document (config.warm_caches): it must stay valid,
    or the warm-up silently does nothing."""
    from slurm_rl import config as config_module

    cfg = config_module.config_from_mapping(config_module._WARM_DOC, env={})
    assert cfg.runtime.device == "emulated"
    config_module._schema_pickle.cache_clear()
    config_module.warm_caches()
    assert config_module._schema_pickle.cache_info().currsize == 1
