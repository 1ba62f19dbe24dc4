"""Megatron-core GPT <-> HF Llama conversion: layouts, round trip, and equal logits."""

from __future__ import annotations

import pytest
import torch

from slurm_rl.engines.convert import (fuse_qkv, hf_param_shapes, hf_to_megatron,
                                      megatron_to_hf, split_qkv)
from slurm_rl.engines.model_config import ModelConfig

MHA = ModelConfig(vocab_size=40, hidden_size=64, num_layers=2, num_attention_heads=2)
GQA = ModelConfig(vocab_size=40, hidden_size=128, num_layers=2, num_attention_heads=4,
                  num_query_groups=2, ffn_hidden_size=96, tie_word_embeddings=True)


def fake_megatron_state(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """A megatron-core 0.16.1 local-spec GPT state dict built by hand (names and shapes)."""
    g = torch.Generator().manual_seed(seed)
    h, d, f = cfg.hidden_size, cfg.head_dim, cfg.ffn_size
    qkv_rows = (cfg.num_attention_heads + 2 * cfg.kv_groups) * d
    sd = {"embedding.word_embeddings.weight": torch.randn(cfg.vocab_size, h, generator=g)}
    for i in range(cfg.num_layers):
        p = f"decoder.layers.{i}."
        sd[p + "input_layernorm.weight"] = torch.rand(h, generator=g)
        sd[p + "self_attention.linear_proj.weight"] = torch.randn(h, cfg.num_attention_heads * d,
                                                                   generator=g)
        sd[p + "self_attention.linear_proj._extra_state"] = torch.empty(0)
        sd[p + "self_attention.linear_qkv.weight"] = torch.randn(qkv_rows, h, generator=g)
        sd[p + "pre_mlp_layernorm.weight"] = torch.rand(h, generator=g)
        sd[p + "mlp.linear_fc1.weight"] = torch.randn(2 * f, h, generator=g)
        sd[p + "mlp.linear_fc2.weight"] = torch.randn(h, f, generator=g)
    sd["decoder.final_layernorm.weight"] = torch.rand(h, generator=g)
    if not cfg.tie_word_embeddings:
        sd["output_layer.weight"] = torch.randn(cfg.vocab_size, h, generator=g)
    return sd


@pytest.mark.parametrize("cfg", [MHA, GQA], ids=["mha", "gqa-tied"])
def test_round_trip_and_shapes(cfg: ModelConfig) -> None:
    sd = fake_megatron_state(cfg)
    hf = dict(megatron_to_hf(sd.items(), cfg))
    assert {n: tuple(t.shape) for n, t in hf.items()} == dict(hf_param_shapes(cfg))
    back = dict(hf_to_megatron(hf.items(), cfg))
    expected = {k: v for k, v in sd.items() if not k.endswith("_extra_state")}
    assert set(back) == set(expected)
    for k, v in expected.items():
        assert torch.equal(back[k], v), k


def test_qkv_split_follows_query_group_interleaving() -> None:
    cfg = GQA  # 4 query heads in 2 groups, head size 32
    d = cfg.head_dim
    # label each row block: group g holds [q(2g), q(2g+1), k(g), v(g)]
    labels = []
    for grp in range(2):
        labels += [("q", 2 * grp), ("q", 2 * grp + 1), ("k", grp), ("v", grp)]
    code = {"q": 0, "k": 100, "v": 200}
    qkv = torch.cat([torch.full((d, cfg.hidden_size), float(code[kind] + idx))
                     for kind, idx in labels])
    q, k, v = split_qkv(qkv, cfg)
    assert [q[i * d, 0].item() for i in range(4)] == [0, 1, 2, 3]
    assert [k[i * d, 0].item() for i in range(2)] == [100, 101]
    assert [v[i * d, 0].item() for i in range(2)] == [200, 201]
    assert torch.equal(fuse_qkv(q, k, v, cfg), qkv)


def test_fc1_is_gate_then_up_and_prefixes_are_accepted() -> None:
    sd = fake_megatron_state(MHA)
    f = MHA.ffn_size
    fc1 = sd["decoder.layers.0.mlp.linear_fc1.weight"]
    wrapped = [("module." + k, v) for k, v in sd.items()]
    hf = dict(megatron_to_hf(wrapped, MHA))
    assert torch.equal(hf["model.layers.0.mlp.gate_proj.weight"], fc1[:f])
    assert torch.equal(hf["model.layers.0.mlp.up_proj.weight"], fc1[f:])


def test_te_fused_norm_names_map_to_hf_norms() -> None:
    t = torch.ones(MHA.hidden_size)
    names = dict(megatron_to_hf([("decoder.layers.1.self_attention.linear_qkv.layer_norm_weight",
                                  t), ("decoder.layers.1.mlp.linear_fc1.layer_norm_weight", t)],
                                MHA))
    assert set(names) == {"model.layers.1.input_layernorm.weight",
                          "model.layers.1.post_attention_layernorm.weight"}


def test_unknown_and_incomplete_names_are_errors() -> None:
    with pytest.raises(KeyError, match="decoder.layers.0.foo.weight"):
        list(megatron_to_hf([("decoder.layers.0.foo.weight", torch.ones(1))], MHA))
    with pytest.raises(KeyError, match="bogus"):
        list(megatron_to_hf([("bogus", torch.ones(1))], MHA))
    with pytest.raises(KeyError, match="incomplete"):
        list(hf_to_megatron([("model.layers.0.self_attn.q_proj.weight", torch.ones(64, 64))],
                            MHA))


def test_hf_param_shapes_match_transformers_llama() -> None:
    from slurm_rl.engines.rollout.hf import build_hf_model

    for cfg in (MHA, GQA):
        model = build_hf_model(cfg)
        got = {n: tuple(p.shape) for n, p in model.named_parameters()}
        assert got == dict(hf_param_shapes(cfg))


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [MHA, GQA], ids=["mha", "gqa-tied"])
def test_megatron_and_hf_logits_agree(cfg: ModelConfig) -> None:
    from slurm_rl.engines.actor.model import (build_gpt_model, forward_logits,
                                              init_local_process_group)
    from slurm_rl.engines.rollout.hf import build_hf_model

    init_local_process_group()
    actor = build_gpt_model(cfg, seed=3)
    hf = build_hf_model(cfg, seed=99)
    result = hf.load_state_dict(dict(megatron_to_hf(actor.named_parameters(), cfg)),
                                strict=False)
    assert not result.unexpected_keys
    assert result.missing_keys == (["lm_head.weight"] if cfg.tie_word_embeddings else [])
    ids = torch.randint(0, cfg.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = forward_logits(actor, ids)
        b = hf(input_ids=ids).logits
    assert (a - b).abs().max().item() < 1e-3
    back = dict(hf_to_megatron(((n, p) for n, p in hf.named_parameters()), cfg))
    for name, p in actor.named_parameters():
        assert torch.equal(back[name], p), name
