"""Hugging Face checkpoints of Llama, Qwen2 and Qwen3 (made here with ``transformers``): the actor
loads them with the logprobs ``transformers`` gives, the hf rollout agrees with the actor after a
weight sync, HF -> actor -> export is bitwise, and a bad checkpoint is named before a launch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hf_archs import ARCHS
import torch

from slurm_rl.toy.tokenizer import CHAT_TEMPLATE, train_tokenizer

LOGPROB_ATOL = 1e-5  # fp32; logprobs are O(1)-O(10) quantities


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from slurm_rl.toy.checkpoint import make_checkpoint

    root = tmp_path_factory.mktemp("hf")
    tok = train_tokenizer(root / "tokenizer", chat_template=CHAT_TEMPLATE)
    vocab = (len(tok) + 7) // 8 * 8
    out = {arch: make_checkpoint(root / arch, arch, seed=3, tokenizer_dir=root / "tokenizer", vocab_size=vocab,
                                 hidden_size=64, num_layers=2, max_position_embeddings=64, **kw)
           for arch, kw in ARCHS.items()}
    out["llama-sharded"] = make_checkpoint(root / "llama-sharded", "llama", seed=3, max_shard_size="20KB",
                                           tokenizer_dir=root / "tokenizer", vocab_size=vocab, hidden_size=64,
                                           num_layers=2, max_position_embeddings=64, **ARCHS["llama"])
    return out


def _actor(path: Path, attention: str = "sdpa") -> tuple[Any, Any]:
    from slurm_rl.engines.actor.model import build_gpt_model, init_local_process_group
    from slurm_rl.engines.hf_checkpoint import load_into_megatron, model_config_from_dir

    init_local_process_group()
    cfg = model_config_from_dir(path)
    model = build_gpt_model(cfg, seed=0, initialize=False, attention=attention)
    load_into_megatron(model, path, cfg)
    return model, cfg


def _batch(vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (3, 48), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("arch", "attention"), [*((a, "sdpa") for a in sorted(ARCHS)), ("qwen2", "local")])
def test_actor_logprobs_equal_transformers(checkpoints: dict[str, Path], arch: str, attention: str) -> None:
    """Either core attention (qwen2's GQA, one KV head for two query heads, under both)."""
    from transformers import AutoModelForCausalLM

    from slurm_rl.engines.actor.model import token_logprobs
    from slurm_rl.engines.rollout.hf import score_sequences

    actor, cfg = _actor(checkpoints[arch], attention)
    assert cfg.architecture == arch
    assert (cfg.qkv_bias, cfg.qk_norm, cfg.head_dim) == (arch == "qwen2", arch == "qwen3", 48 if arch == "qwen3" else 32)
    assert (cfg.rope_scaling or {}).get("rope_type") == ("llama3" if arch == "llama" else None)
    ids = _batch(cfg.vocab_size)
    with torch.no_grad():
        got = token_logprobs(actor, ids)
    hf = AutoModelForCausalLM.from_pretrained(str(checkpoints[arch]), dtype=torch.float32).eval()
    want = torch.stack(score_sequences(hf, ids.tolist(), torch.device("cpu")))
    assert (got - want).abs().max().item() < LOGPROB_ATOL


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_hf_rollout_agrees_with_the_actor_after_a_weight_sync(checkpoints: dict[str, Path], arch: str) -> None:
    from slurm_rl.engines.actor.model import token_logprobs
    from slurm_rl.engines.convert import hf_param_shapes, megatron_to_hf
    from slurm_rl.engines.rollout.hf import HFRolloutEngine

    actor, cfg = _actor(checkpoints[arch])
    engine = HFRolloutEngine(cfg, checkpoint=checkpoints[arch])
    with torch.no_grad():  # a trained actor: every parameter moved
        for p in actor.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.02)
    named = list(megatron_to_hf(actor.named_parameters(), cfg))
    assert {n: tuple(t.shape) for n, t in named} == dict(hf_param_shapes(cfg))  # every tensor, once
    engine.update_weights(named, version=1)
    ids = _batch(cfg.vocab_size)
    with torch.no_grad():
        want = token_logprobs(actor, ids)
    got = torch.stack(engine.score(ids.tolist()))
    assert (got - want).abs().max().item() < LOGPROB_ATOL


@pytest.mark.parametrize("arch", [*sorted(ARCHS), "llama-sharded"])
def test_hf_to_actor_to_export_is_bitwise(checkpoints: dict[str, Path], arch: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slurm_rl.engines.convert import megatron_to_hf
    from slurm_rl.engines.hf_checkpoint import SafetensorsFiles, write_hf_dir

    src = checkpoints[arch]
    actor, cfg = _actor(src)
    out = write_hf_dir(megatron_to_hf(actor.named_parameters(), cfg), cfg, tmp_path / "out", config_source=src,
                       tokenizer_source=src, max_shard_bytes=30_000 if arch.endswith("sharded") else 4 << 30)
    with SafetensorsFiles(src) as a, SafetensorsFiles(out) as b:
        assert set(a.shapes) == set(b.shapes)
        assert all(torch.equal(a.read(n), b.read(n)) for n in a.shapes)
    assert (out / "model.safetensors.index.json").exists() == arch.endswith("sharded")
    assert json.loads((out / "config.json").read_text())["architectures"] == \
        json.loads((src / "config.json").read_text())["architectures"]
    loaded = AutoModelForCausalLM.from_pretrained(str(out))
    assert AutoTokenizer.from_pretrained(str(out)).chat_template == CHAT_TEMPLATE
    original = AutoModelForCausalLM.from_pretrained(str(src))
    ids = _batch(cfg.vocab_size)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, original(ids).logits)


def test_bad_checkpoints_are_named(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    from slurm_rl.engines.hf_checkpoint import checkpoint_problems

    def copy(name: str) -> Path:
        return Path(shutil.copytree(checkpoints["qwen2"], tmp_path / name))

    assert checkpoint_problems(checkpoints["qwen2"]) == []
    assert checkpoint_problems(tmp_path / "nowhere")[0][2] == \
        "an existing, readable Hugging Face checkpoint directory"
    gone = copy("missing")
    tensors = load_file(gone / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"][:, :8].contiguous()
    save_file(tensors, gone / "model.safetensors")
    lines = [p[2] for p in checkpoint_problems(gone)]
    assert "tensor model.layers.1.self_attn.k_proj.bias is missing (expected shape [32])" in lines
    assert "tensor model.layers.0.mlp.up_proj.weight has shape [256, 8], the config.json implies [256, 64]" in lines
    other = copy("gemma")
    config = json.loads((other / "config.json").read_text())
    config["architectures"] = ["Gemma2ForCausalLM"]
    (other / "config.json").write_text(json.dumps(config))
    (msg,) = [p[2] for p in checkpoint_problems(other)]
    assert "architectures ['Gemma2ForCausalLM'] is not supported; supported: LlamaForCausalLM, " \
           "Qwen2ForCausalLM, Qwen3ForCausalLM" in msg
    bare = copy("no-tokenizer")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (bare / f).unlink()
    assert [p[2] for p in checkpoint_problems(bare)][0].startswith("a directory with tokenizer files")
    assert checkpoint_problems(bare, tokenizer_path=checkpoints["qwen2"]) == []
