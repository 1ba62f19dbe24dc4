"""The actor's tensor-parallel keys: precision, recompute, tensor_parallel (+ choices),
pipeline_parallel, the ranks per actor instance that follow them, TP groups inside one node and
model shapes that split over every TP size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurm_rl.config import (
    ConfigError,
    actor_precision,
    actor_tp_choices,
    config_from_yaml_text,
    straddling_tp_groups,
    tp_shape_problems,
)
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]
TWO_NODES = ("cluster: {num_nodes: 2, gpus_per_node: 4, component_placement: {actor: 0-3, rollout: 4-7}}\n"
             "runtime: {device: emulated}\n")
REAL = ["runtime.device=cpu", "data.train_files=[prompts.jsonl]", "reward.name=exact"]


def load(*overrides: str, text: str = TWO_NODES) -> Any:
    return config_from_yaml_text(text, list(overrides))


def issue_line(overrides: list[str], key: str, value: Any, text: str = TWO_NODES) -> str:
    """The one line of the error that names ``key`` and ``value``."""
    with pytest.raises(ConfigError) as exc:
        load(*overrides, text=text)
    lines = [line for line in str(exc.value).splitlines() if line.startswith(f"{key}: got {value!r}; allowed: ")]
    assert len(lines) == 1, f"no line for {key} / {value!r} in:\n{exc.value}"
    return lines[0]


def test_defaults() -> None:
    cfg = load()
    a = cfg.actor
    assert (a.precision, a.recompute, a.tensor_parallel, a.tensor_parallel_choices, a.pipeline_parallel) == (
        "auto", "none", 1, [], 1)
    assert actor_precision(cfg) == "fp32" and actor_tp_choices(cfg) == (1,)
    assert cfg.scheduler.actor_ranks_per_instance == 1


@pytest.mark.parametrize("value", ["auto", "fp32", "bf16"])
def test_precision_good(value: str) -> None:
    cfg = load(f"actor.precision={value}")
    assert actor_precision(cfg) == ("fp32" if value == "auto" else value)


def test_precision_auto_is_bf16_on_cuda() -> None:
    cuda = load("runtime.device=cuda", *REAL[1:])
    assert actor_precision(cuda) == "bf16"
    assert actor_precision(load("runtime.device=cuda", "actor.precision=fp32", *REAL[1:])) == "fp32"
    assert actor_precision(load(*REAL)) == "fp32"


def test_precision_bad() -> None:
    line = issue_line(["actor.precision=fp16"], "actor.precision", "fp16")
    assert line.endswith("one of auto, fp32, bf16")


@pytest.mark.parametrize("value", ["none", "selective", "full"])
def test_recompute_good(value: str) -> None:
    assert load(f"actor.recompute={value}").actor.recompute == value


def test_recompute_bad() -> None:
    assert issue_line(["actor.recompute=all"], "actor.recompute", "all").endswith("one of none, selective, full")


def test_attention_backend_good_and_bad() -> None:
    assert load("actor.attention_backend=local").actor.attention_backend == "local"
    assert load().actor.attention_backend == "sdpa"
    assert issue_line(["actor.attention_backend=flash"], "actor.attention_backend", "flash").endswith(
        "one of sdpa, local")


def test_tensor_parallel_good_and_bad() -> None:
    assert load("actor.tensor_parallel=2").actor.tensor_parallel == 2
    assert load("actor.tensor_parallel=4").actor.tensor_parallel == 4
    assert "a positive int" in issue_line(["actor.tensor_parallel=0"], "actor.tensor_parallel", 0)
    assert "int" in issue_line(["actor.tensor_parallel=two"], "actor.tensor_parallel", "two")


def test_tensor_parallel_choices() -> None:
    cfg = load("actor.tensor_parallel=2", "actor.tensor_parallel_choices=[4,1,2]")
    assert actor_tp_choices(cfg) == (1, 2, 4)
    line = issue_line(["actor.tensor_parallel=2", "actor.tensor_parallel_choices=[1,4]"],
                      "actor.tensor_parallel_choices", [1, 4])
    assert "contains actor.tensor_parallel (2)" in line
    line = issue_line(["actor.tensor_parallel_choices=[1,0]"], "actor.tensor_parallel_choices[1]", 0)
    assert "a positive int" in line


def test_pipeline_parallel_refused() -> None:
    assert load("actor.pipeline_parallel=1").actor.pipeline_parallel == 1
    line = issue_line(["actor.pipeline_parallel=2"], "actor.pipeline_parallel", 2)
    assert "pipeline parallelism is not supported yet" in line and "use actor.tensor_parallel" in line
    assert line.split("; allowed: ")[1].startswith("1 ")


def test_actor_ranks_per_instance_follows_tensor_parallel() -> None:
    cfg = load("actor.tensor_parallel=2")
    assert cfg.scheduler.actor_ranks_per_instance == 2
    assert config_from_yaml_text(cfg.to_yaml()) == cfg  # the resolved config loads again, equal
    assert load("actor.tensor_parallel=2", "scheduler.actor_ranks_per_instance=2").scheduler.actor_ranks_per_instance == 2
    line = issue_line(["actor.tensor_parallel=2", "scheduler.actor_ranks_per_instance=4"],
                      "scheduler.actor_ranks_per_instance", 4)
    assert "actor.tensor_parallel (2)" in line
    line = issue_line(["scheduler.actor_ranks_per_instance=2"], "scheduler.actor_ranks_per_instance", 2)
    assert "actor.tensor_parallel (1)" in line


def test_actor_ranks_split_into_whole_tp_groups() -> None:
    line = issue_line(["actor.tensor_parallel=3"], "cluster.component_placement.actor", "0-3")
    assert "multiple of the actor's tensor-parallel size 3" in line and "4 ranks" in line


def test_tp_group_across_nodes_refused() -> None:
    ok = load("actor.tensor_parallel=2", "cluster.component_placement={actor: 2-5, rollout: '0-1,6-7'}")
    assert ok.placement.components["actor"].ranks == (2, 3, 4, 5)
    line = issue_line(["actor.tensor_parallel=2", "cluster.component_placement={actor: 3-4, rollout: '0-2,5-7'}"],
                      "cluster.component_placement.actor", "3-4")
    assert "ranks [3, 4] lie on nodes [0, 1]" in line
    # with tp 1 every rank is its own group
    assert load("cluster.component_placement={actor: 3-4, rollout: '0-2,5-7'}").actor.tensor_parallel == 1


def test_tp_groups_follow_the_nodes_of_node_groups() -> None:
    """Nodes of different sizes: node 0 has 2 slots, node 1 has 4, so ranks 1-2 cross a node."""
    text = ("cluster:\n  num_nodes: 2\n  node_groups: {small: {nodes: '0', gpus_per_node: 2}, "
            "big: {nodes: '1', gpus_per_node: 4}}\n  component_placement: {actor: 1-2, rollout: '0,3-5'}\n"
            "runtime: {device: emulated}\n")
    line = issue_line(["actor.tensor_parallel=2"], "cluster.component_placement.actor", "1-2", text=text)
    assert "lie on nodes [0, 1]" in line
    good = text.replace("actor: 1-2, rollout: '0,3-5'", "actor: 2-3, rollout: '0-1,4-5'")
    assert load("actor.tensor_parallel=2", text=good).actor.tensor_parallel == 2


def test_scripted_step_actor_tp() -> None:
    script = ("scheduler: {policy: scripted, script: [{at_iteration: 1, placement: {actor: 0-1, rollout: 2-7}, "
              "actor_tp: 1}]}\n")
    cfg = load("actor.tensor_parallel=2", "actor.tensor_parallel_choices=[1,2]", text=TWO_NODES + script)
    assert cfg.scheduler.script[0].actor_tp == 1
    line = issue_line(["actor.tensor_parallel=2"], "scheduler.script[0].actor_tp", 1, text=TWO_NODES + script)
    assert "one of 2" in line
    # a step without actor_tp keeps the size in force: its actor ranks must suit it
    keep = script.replace(", actor_tp: 1", "").replace("actor: 0-1, rollout: 2-7", "actor: 0-2, rollout: 3-7")
    line = issue_line(["actor.tensor_parallel=2"], "scheduler.script[0].placement.actor", "0-2", text=TWO_NODES + keep)
    assert "multiple of the actor's tensor-parallel size 2" in line
    from slurm_rl.scheduler.live_state import policy_config

    assert policy_config(cfg).script[0].actor_tp == 1


def test_tp_shape_problems() -> None:
    sizes = {"vocab_size": 64, "num_attention_heads": 8, "num_query_groups": 2, "ffn_hidden_size": 384, "hidden_size": 256}
    assert tp_shape_problems(sizes, 1) == [] and tp_shape_problems(sizes, 2) == []
    problems = tp_shape_problems(sizes, 4)
    assert problems == ["model.num_query_groups 2 is not a multiple of tensor-parallel size 4"]
    odd = {**sizes, "vocab_size": 50, "num_query_groups": None, "ffn_hidden_size": 102, "num_attention_heads": 6}
    assert tp_shape_problems(odd, 4) == [
        "model.num_attention_heads 6 is not a multiple of tensor-parallel size 4",
        "model.ffn_hidden_size 102 is not a multiple of tensor-parallel size 4",
        "model.vocab_size 50 is not a multiple of tensor-parallel size 4"]
    assert tp_shape_problems({**sizes, "vocab_size": None}, 2) == []  # not known yet: skipped


def test_model_must_split_over_every_tp_choice() -> None:
    model = ["model.hidden_size=256", "model.num_attention_heads=4", "model.num_query_groups=2", "model.vocab_size=64"]
    assert load(*REAL, *model, "actor.tensor_parallel=2").actor.tensor_parallel == 2
    line = issue_line([*REAL, *model, "actor.tensor_parallel=4"], "actor.tensor_parallel", 4)
    assert "model.num_query_groups 2 is not a multiple of tensor-parallel size 4" in line
    line = issue_line([*REAL, *model, "actor.tensor_parallel=2", "actor.tensor_parallel_choices=[2,4]"],
                      "actor.tensor_parallel_choices", 4)
    assert "model.num_query_groups 2" in line
    # emulated runs build no model: its sizes do not constrain the TP size
    assert load(*model, "actor.tensor_parallel=4").actor.tensor_parallel == 4


def test_checkpoint_shapes_must_split(tmp_path: Path) -> None:
    """``model.path``'s config.json sizes are checked before a launch (slurm_rl.inputs)."""
    from slurm_rl.inputs import tp_model_problems

    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 384,
        "intermediate_size": 1024, "num_attention_heads": 6, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "vocab_size": 1000, "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}))
    path = [f"model.path={tmp_path}"]
    assert tp_model_problems(load(*REAL, *path, "actor.tensor_parallel=2"), None) == []
    (issue,) = tp_model_problems(load(*REAL, *path, "actor.tensor_parallel=4"), None)
    assert issue.key == "actor.tensor_parallel" and issue.value == 4
    assert "model.num_attention_heads 6 is not a multiple of tensor-parallel size 4" in issue.allowed
    assert f"{tmp_path}/config.json" in issue.allowed


def test_straddling_tp_groups() -> None:
    node = lambda r: r // 4  # noqa: E731
    assert straddling_tp_groups([0, 1, 2, 3, 4, 5, 6, 7], 4, node) == []
    assert straddling_tp_groups([2, 3, 4, 5], 4, node) == [(2, 3, 4, 5)]
    assert straddling_tp_groups([5, 1, 0, 4], 2, node) == []  # chunks of the sorted ranks: (0, 1), (4, 5)
    assert straddling_tp_groups([0, 1, 3, 4], 2, node) == [(3, 4)]


def test_validate_cli(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    run = f"runtime: {{device: emulated, run_dir: {tmp_path / 'run'}}}"
    path.write_text(TWO_NODES.replace("runtime: {device: emulated}", run)
                    + "actor: {tensor_parallel: 2, tensor_parallel_choices: [1, 2], recompute: selective}\n")
    cmd = [*CLI, "validate", str(path)]
    out = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["actor"] == {"tensor_parallel": 2, "tensor_parallel_choices": [1, 2],
                                               "precision": "fp32", "recompute": "selective"}
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert text.returncode == 0 and "tensor_parallel 2 (choices 1, 2), precision fp32 (auto), recompute selective" in text.stdout
    bad = subprocess.run(cmd + ["actor.pipeline_parallel=2"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2
    assert "actor.pipeline_parallel: got 2; allowed: 1" in bad.stderr
