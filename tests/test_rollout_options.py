"""The rollout section's vLLM options (verl's names): defaults as the engine gets them, the values vLLM
would refuse refused by ``load_config`` / ``validate`` naming the key, TP engines over rollout ranks, and
the shards each TP rank of a vLLM engine holds. The engines built with these options:
tests/test_vllm_options.py and tests/test_vllm_tp.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from slurm_rl.config import ConfigError, config_from_yaml_text
from slurm_rl.engines.rollout.tp_shards import expand_shard, shard_of, shard_spec
from slurm_rl.rollout_config import engine_tp, processes_per_engine, resolve_engine_options
from cli_command import CLI

ONE_NODE = ("cluster: {num_nodes: 1, gpus_per_node: 8, component_placement: {actor: 0-3, rollout: 4-7}}\n"
            "runtime: {device: cpu}\ndata: {train_files: [p.jsonl]}\nreward: {name: exact}\n"
            "model: {hidden_size: 128, num_attention_heads: 4, max_position_embeddings: 256}\n"
            "rollout: {backend: vllm, max_new_tokens: 64}\n")


def load(*overrides: str, text: str = ONE_NODE) -> Any:
    return config_from_yaml_text(text, list(overrides))


def issue_line(overrides: list[str], key: str, value: Any, text: str = ONE_NODE) -> str:
    with pytest.raises(ConfigError) as exc:
        load(*overrides, text=text)
    lines = [line for line in str(exc.value).splitlines() if line.startswith(f"{key}: got {value!r}; allowed: ")]
    assert len(lines) == 1, f"no line for {key} / {value!r} in:\n{exc.value}"
    return lines[0]


def options(cfg: Any, device: str) -> dict[str, Any]:
    return resolve_engine_options(cfg.rollout, device, "bf16" if device == "cuda" else "fp32",
                                  cfg.data.max_prompt_length, 256)


def test_defaults_on_cpu_and_cuda() -> None:
    cfg = load("data.max_prompt_length=100")
    cpu, cuda = options(cfg, "cpu"), options(cfg, "cuda")
    assert cpu == {"dtype": "float32", "enforce_eager": True, "max_model_len": 164, "enable_prefix_caching": True,
                   "gpu_memory_utilization": 0.5}
    assert cuda == {**cpu, "dtype": "bfloat16", "enforce_eager": False}  # bf16 with CUDA graphs
    assert options(load(), "cpu")["max_model_len"] == 256  # no prompt bound: the model's context


def test_set_options_pass_through() -> None:
    cfg = load("rollout.dtype=float32", "rollout.enforce_eager=true", "rollout.max_model_len=200",
               "rollout.enable_chunked_prefill=false", "rollout.enable_prefix_caching=false",
               "rollout.max_num_seqs=64", "rollout.max_num_batched_tokens=512", "rollout.gpu_memory_utilization=0.7")
    assert options(cfg, "cuda") == {"dtype": "float32", "enforce_eager": True, "max_model_len": 200,
                                    "enable_prefix_caching": False, "gpu_memory_utilization": 0.7,
                                    "enable_chunked_prefill": False, "max_num_seqs": 64, "max_num_batched_tokens": 512}


@pytest.mark.parametrize("overrides,key,value,allowed", [
    (["rollout.dtype=fp8"], "rollout.dtype", "fp8", "one of bfloat16, float16, float32"),
    (["rollout.dtype=float16"], "rollout.dtype", "float16", "bfloat16 or float32 on cpu"),
    (["rollout.max_num_seqs=0"], "rollout.max_num_seqs", 0, "a positive int"),
    (["rollout.tensor_model_parallel_size=0"], "rollout.tensor_model_parallel_size", 0, "a positive int"),
    (["rollout.gpu_memory_utilization=1.5"], "rollout.gpu_memory_utilization", 1.5, "(0, 1]"),
    (["rollout.max_model_len=300"], "rollout.max_model_len", 300, "at most the model's context of 256"),
    (["data.max_prompt_length=100", "rollout.max_model_len=150"], "rollout.max_model_len", 150,
     "at least data.max_prompt_length + rollout.max_new_tokens = 100 + 64 = 164"),
    (["data.max_prompt_length=200"], "rollout.max_new_tokens", 64, "at most 56 so that a prompt"),
    (["rollout.max_new_tokens=256"], "rollout.max_new_tokens", 256, "less than the model's context of 256"),
    (["rollout.max_num_seqs=64", "rollout.max_num_batched_tokens=32"], "rollout.max_num_batched_tokens", 32,
     "at least rollout.max_num_seqs (64)"),
    (["rollout.enable_chunked_prefill=false", "rollout.max_num_batched_tokens=128"],
     "rollout.max_num_batched_tokens", 128, "at least the engine's max_model_len (256)"),
    (["rollout.tensor_model_parallel_size=3", "cluster.component_placement.rollout=4-6:0"],
     "rollout.tensor_model_parallel_size", 3,
     "num_attention_heads 4 is not a multiple of 3"),
])
def test_values_vllm_refuses(overrides: list[str], key: str, value: Any, allowed: str) -> None:
    assert allowed in issue_line(overrides, key, value)


EMULATED = ONE_NODE.replace("device: cpu", "device: emulated")


def test_tp_engines_over_rollout_ranks_on_cpu() -> None:
    """An engine over ranks on cpu/cuda is vLLM's (each rank's shard in a host process of its own), static."""
    cfg = load("rollout.tensor_model_parallel_size=2", "scheduler.policy=static")
    assert processes_per_engine(cfg.rollout, cfg.placement) == cfg.scheduler.rollout_ranks_per_instance == 2
    line = issue_line(["rollout.tensor_model_parallel_size=2", "rollout.backend=hf"],
                      "rollout.tensor_model_parallel_size", 2)
    assert "1 with rollout.backend hf" in line and "rollout.backend vllm" in line
    auto = ["rollout.tensor_model_parallel_size=2", "cluster.auto_scheduler=true", "scheduler.policy=auto"]
    assert load(*auto).scheduler.policy == "auto"  # the engine's ranks leave and rejoin the rollout together
    line = issue_line([*auto[:2], "scheduler.policy=plan"], "scheduler.policy", "plan")
    assert "static or auto with rollout engines over 2 ranks on runtime.device cpu" in line
    line = issue_line([*auto, "cluster.use_pre_process_policy=true"], "cluster.use_pre_process_policy", True)
    assert "false with rollout engines over 2 ranks" in line and "mid-iteration" in line


def test_tp_engines_over_rollout_ranks() -> None:
    cfg = load("rollout.tensor_model_parallel_size=2", text=EMULATED)
    assert engine_tp(cfg.rollout, cfg.placement) == 2
    assert processes_per_engine(cfg.rollout, cfg.placement) == 2
    assert cfg.scheduler.rollout_ranks_per_instance == 2  # the scheduler moves whole engines
    line = issue_line(["rollout.tensor_model_parallel_size=4", "cluster.component_placement.rollout=4-6"],
                      "cluster.component_placement.rollout", "4-6", text=EMULATED)
    assert "a multiple of rollout.tensor_model_parallel_size (4)" in line
    line = issue_line(["rollout.tensor_model_parallel_size=2", "scheduler.rollout_ranks_per_instance=4"],
                      "scheduler.rollout_ranks_per_instance", 4, text=EMULATED)
    assert "2 (the ranks of one engine" in line


def test_tp_engine_inside_one_node() -> None:
    two = EMULATED.replace("num_nodes: 1, gpus_per_node: 8", "num_nodes: 2, gpus_per_node: 4").replace(
        "actor: 0-3, rollout: 4-7", "actor: 0-2, rollout: 3-6, inference: 7")
    line = issue_line(["rollout.tensor_model_parallel_size=2"], "cluster.component_placement.rollout", "3-6", text=two)
    assert "inside one node: ranks [3, 4]" in line


def test_a_process_owning_slots_is_one_engine() -> None:
    """RLinf's "resources:processes" form: a rollout process owning 2 GPUs runs a TP-2 engine by itself."""
    cfg = load("cluster.component_placement.rollout=4-7:0-1")
    assert engine_tp(cfg.rollout, cfg.placement) == 2 and processes_per_engine(cfg.rollout, cfg.placement) == 1
    line = issue_line(["cluster.component_placement.rollout=4-7:0-1", "rollout.tensor_model_parallel_size=4"],
                      "rollout.tensor_model_parallel_size", 4)
    assert "gives each rollout process 2 slots" in line


def test_null_tp_follows_rollout_ranks_per_instance() -> None:
    cfg = load("scheduler.rollout_ranks_per_instance=2", text=EMULATED)
    assert engine_tp(cfg.rollout, cfg.placement, cfg.scheduler.rollout_ranks_per_instance) == 2


def test_validate_prints_the_engine_options(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    (tmp_path / "c.yaml").write_text(ONE_NODE)
    cmd = [*CLI, "validate", str(tmp_path / "c.yaml"), "cluster.component_placement.rollout=4-7:0-1",
           "rollout.max_num_seqs=32"]
    text = subprocess.run([*cmd, "data.max_prompt_length=16"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    line = next(x for x in text.stdout.splitlines() if x.strip().startswith("rollout:"))
    assert "2 engine(s) of TP 2 (1 rank(s) each)" in line and "max_model_len 80" in line and "max_num_seqs 32" in line
    bad = subprocess.run([*cmd, "rollout.max_model_len=9999"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "rollout.max_model_len: got 9999" in bad.stderr


# --------------------------------------------------------------------------- shards of a TP engine


def _named(heads: int, kv: int, hidden: int = 64, ffn: int = 96, vocab: int = 100) -> dict[str, torch.Tensor]:
    d = hidden // heads
    g = torch.Generator().manual_seed(0)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.layers.0.self_attn.q_proj.weight": (heads * d, hidden),
              "model.layers.0.self_attn.k_proj.weight": (kv * d, hidden),
              "model.layers.0.self_attn.v_proj.bias": (kv * d,), "model.layers.0.self_attn.o_proj.weight": (hidden, heads * d),
              "model.layers.0.mlp.gate_proj.weight": (ffn, hidden), "model.layers.0.mlp.down_proj.weight": (hidden, ffn),
              "model.layers.0.input_layernorm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}
    return {n: torch.randn(s, generator=g) for n, s in shapes.items()}


@pytest.mark.parametrize("tp,kv", [(2, 2), (4, 4), (4, 2), (2, 1)])
def test_shards_cover_each_tensor_once(tp: int, kv: int) -> None:
    """Split tensors: the ranks' shards laid side by side give the tensor back (KV heads fewer than the
    ranks: each rank holds its replica's head); norms whole on every rank."""
    heads = 4
    for name, full in _named(heads, kv).items():
        specs = [shard_spec(name, tuple(full.shape), tp, r, heads, kv) for r in range(tp)]
        shards = [shard_of(name, full, tp, r, heads, kv) for r in range(tp)]
        if specs[0].dim is None:
            assert "layernorm" in name and all(s is full for s in shards)
            continue
        distinct = []
        for sp, sh in zip(specs, shards):
            if (sp.start, sp.stop) not in [(a.start, a.stop) for a, _ in distinct]:
                distinct.append((sp, sh))
        assert torch.equal(torch.cat([sh for _, sh in distinct], dim=specs[0].dim), full), name
        if kv < tp and ("k_proj" in name or "v_proj" in name):
            assert len(distinct) == kv  # tp / kv ranks share one head
        for r, (sp, sh) in enumerate(zip(specs, shards)):
            back = expand_shard(name, sh, tuple(full.shape), tp, r, heads, kv)
            assert torch.equal(back.narrow(sp.dim, sp.start, sp.stop - sp.start), sh)
            assert float(back.abs().sum()) == pytest.approx(float(sh.abs().sum()))  # zero elsewhere


def test_vocab_shards_follow_vllms_padding() -> None:
    """vLLM pads the vocabulary to a multiple of 64 and gives each rank an equal part of the padded rows."""
    specs = [shard_spec("lm_head.weight", (100, 8), 2, r, 4, 4) for r in range(2)]
    assert [(s.start, s.stop) for s in specs] == [(0, 64), (64, 100)]
