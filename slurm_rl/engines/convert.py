"""Megatron-core GPT (local or TE spec) <-> Hugging Face Llama / Qwen2 / Qwen3: names, layouts, config.

Megatron layouts (megatron-core 0.16.1):
* ``self_attention.linear_qkv.weight`` is ``[groups * (heads_per_group + 2) * head_dim, hidden]``
  interleaved per query group as ``[q_1..q_n, k, v]`` (see ``Attention.get_query_key_value_tensors``);
  ``linear_qkv.bias`` (Qwen2) is interleaved the same way;
* ``self_attention.q_layernorm`` / ``k_layernorm`` (Qwen3) are HF's ``q_norm`` / ``k_norm``: an
  RMSNorm over each head, applied before RoPE in both;
* ``mlp.linear_fc1.weight`` is ``[gate; up]`` stacked along dim 0 (gated linear unit);
* RoPE is non-interleaved (``rotary_interleaved=False``), which is HF's ``rotate_half`` layout,
  so q/k rows need no permutation;
* TE specs fuse the norms into the next linear (``linear_qkv.layer_norm_weight``,
  ``linear_fc1.layer_norm_weight``); both spellings are accepted.

Conversion is streaming: each megatron tensor maps to HF tensors on its own, so an actor can
convert and ship its parameters bucket by bucket; :func:`hf_sources` names the HF tensors one
megatron tensor is made of, so a loader reads only those.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from slurm_rl.engines.model_config import ModelConfig

if TYPE_CHECKING:  # torch is imported where tensors are handled: `hf_param_shapes` (validate) needs none
    from torch import Tensor

NamedTensors = Iterable[tuple[str, "Tensor"]]

_LAYER = re.compile(r"^(?:module\.)*decoder\.layers\.(\d+)\.(.+)$")
_LAYER_MAP = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}
_GLOBAL_MAP = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def hf_config(cfg: ModelConfig, **extra: Any) -> Any:
    """The ``transformers`` config (Llama, Qwen2 or Qwen3) with ``cfg``'s architecture, fp32."""
    import transformers

    rope: dict[str, Any] = dict(cfg.rope_scaling or {"rope_type": "default"})
    rope["rope_theta"] = float(cfg.rotary_base)
    common: dict[str, Any] = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.kv_groups, head_dim=cfg.head_dim, hidden_act="silu",
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.norm_epsilon,
        tie_word_embeddings=cfg.tie_word_embeddings, rope_parameters=rope)
    if cfg.architecture == "llama":
        made = transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common, **extra)
    elif cfg.architecture == "qwen2":
        made = transformers.Qwen2Config(use_sliding_window=False, **common, **extra)
    else:
        made = transformers.Qwen3Config(attention_bias=False, use_sliding_window=False, **common,
                                        **extra)
    made.architectures = [HF_CLASSES[cfg.architecture]]
    return made


def hf_param_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """HF parameter names and shapes in the order ``megatron_to_hf`` emits them."""
    h, d, f, v = cfg.hidden_size, cfg.head_dim, cfg.ffn_size, cfg.vocab_size
    n, g = cfg.num_attention_heads, cfg.kv_groups
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (v, h))]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", (h,)))
        for proj, rows in (("q_proj", n * d), ("k_proj", g * d), ("v_proj", g * d)):
            out.append((p + f"self_attn.{proj}.weight", (rows, h)))
        if cfg.qkv_bias:
            out += [(p + "self_attn.q_proj.bias", (n * d,)), (p + "self_attn.k_proj.bias", (g * d,)),
                    (p + "self_attn.v_proj.bias", (g * d,))]
        if cfg.qk_norm:
            out += [(p + "self_attn.q_norm.weight", (d,)), (p + "self_attn.k_norm.weight", (d,))]
        out += [(p + "self_attn.o_proj.weight", (h, n * d)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (f, h)),
                (p + "mlp.up_proj.weight", (f, h)),
                (p + "mlp.down_proj.weight", (h, f))]
    out.append(("model.norm.weight", (h,)))
    if not cfg.tie_word_embeddings:
        out.append(("lm_head.weight", (v, h)))
    return out


def split_qkv(qkv: Tensor, cfg: ModelConfig) -> tuple[Tensor, Tensor, Tensor]:
    """Megatron fused ``linear_qkv`` weight (or bias) -> HF ``(q, k, v)`` weights (or biases)."""
    g, d = cfg.kv_groups, cfg.head_dim
    per_group = cfg.num_attention_heads // g
    rest = tuple(qkv.shape[1:])
    w = qkv.reshape(g, per_group + 2, d, *rest)
    q = w[:, :per_group].reshape(g * per_group * d, *rest)
    k = w[:, per_group].reshape(g * d, *rest)
    v = w[:, per_group + 1].reshape(g * d, *rest)
    return q.contiguous(), k.contiguous(), v.contiguous()


def fuse_qkv(q: Tensor, k: Tensor, v: Tensor, cfg: ModelConfig) -> Tensor:
    """HF ``(q, k, v)`` weights (or biases) -> megatron fused ``linear_qkv`` weight (or bias)."""
    import torch

    g, d = cfg.kv_groups, cfg.head_dim
    per_group = cfg.num_attention_heads // g
    rest = tuple(q.shape[1:])
    w = torch.cat([q.reshape(g, per_group, d, *rest), k.reshape(g, 1, d, *rest),
                   v.reshape(g, 1, d, *rest)], dim=1)
    return w.reshape(g * (per_group + 2) * d, *rest)


def hf_sources(name: str, cfg: ModelConfig) -> list[str]:
    """The HF tensor names the megatron tensor ``name`` is made of (in fusion order)."""
    name = re.sub(r"^(?:module\.)+", "", name)
    if name in _GLOBAL_MAP:
        if name == "output_layer.weight" and cfg.tie_word_embeddings:
            return ["model.embed_tokens.weight"]
        return [_GLOBAL_MAP[name]]
    m = _LAYER.match(name)
    if not m:
        raise KeyError(f"hf_sources: unknown megatron parameter {name!r}")
    p, rest = f"model.layers.{m.group(1)}.", m.group(2)
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = rest.rsplit(".", 1)[1]
        return [p + f"self_attn.{x}_proj.{kind}" for x in "qkv"]
    if rest == "mlp.linear_fc1.weight":
        return [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
    if rest in _LAYER_MAP:
        return [p + _LAYER_MAP[rest]]
    raise KeyError(f"hf_sources: unknown megatron layer parameter {name!r}")


def fuse_sources(name: str, tensors: list[Tensor], cfg: ModelConfig) -> Tensor:
    """The megatron tensor ``name`` from its :func:`hf_sources` tensors."""
    import torch

    if name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
        return fuse_qkv(*tensors, cfg)
    if name.endswith("linear_fc1.weight"):
        return torch.cat(tensors)
    return tensors[0]


def megatron_to_hf(named: NamedTensors, cfg: ModelConfig) -> Iterator[tuple[str, Tensor]]:
    """Stream megatron ``(name, tensor)`` pairs as HF (Llama / Qwen2 / Qwen3) pairs.

    ``_extra_state`` entries are skipped; a tied model's ``output_layer.weight`` is dropped;
    unknown names raise ``KeyError`` naming them.
    """
    import torch

    for name, t in named:
        if name.endswith("_extra_state"):
            continue
        name = re.sub(r"^(?:module\.)+", "", name)
        if name in _GLOBAL_MAP:
            if name == "output_layer.weight" and cfg.tie_word_embeddings:
                continue
            yield _GLOBAL_MAP[name], t
            continue
        m = _LAYER.match(name)
        if not m:
            raise KeyError(f"megatron_to_hf: unknown megatron parameter {name!r}")
        i, rest = m.group(1), m.group(2)
        p = f"model.layers.{i}."
        if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
            kind = rest.rsplit(".", 1)[1]
            for proj, part in zip("qkv", split_qkv(t, cfg)):
                yield p + f"self_attn.{proj}_proj.{kind}", part
        elif rest == "mlp.linear_fc1.weight":
            gate, up = torch.chunk(t, 2, dim=0)
            yield p + "mlp.gate_proj.weight", gate.contiguous()
            yield p + "mlp.up_proj.weight", up.contiguous()
        elif rest in _LAYER_MAP:
            yield p + _LAYER_MAP[rest], t
        else:
            raise KeyError(f"megatron_to_hf: unknown megatron layer parameter {name!r}")


def critic_to_hf(named: NamedTensors, cfg: ModelConfig) -> Iterator[tuple[str, Tensor]]:
    """A critic's megatron pairs as transformers' ``*ForTokenClassification`` (one label) pairs: the
    body as :func:`megatron_to_hf`, the value head ``output_layer.{weight,bias}`` as ``score.*``."""
    body = []
    for name, t in named:
        short = re.sub(r"^(?:module\.)+", "", name)
        if short in ("output_layer.weight", "output_layer.bias"):
            yield "score." + short.rsplit(".", 1)[1], t
        else:
            body.append((name, t))
    yield from megatron_to_hf(body, cfg)


_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_HF_TO_MEG_LAYER = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
}


def hf_to_megatron(named: NamedTensors, cfg: ModelConfig) -> Iterator[tuple[str, Tensor]]:
    """Stream HF (Llama / Qwen2 / Qwen3) pairs as megatron (local spec) pairs.

    q/k/v and gate/up are buffered per layer until complete, so memory stays at one layer.
    A tied HF ``lm_head.weight`` is dropped. Incomplete fused groups raise ``KeyError``.
    """
    import torch

    inverse_global = {v: k for k, v in _GLOBAL_MAP.items()}
    pending: dict[str, dict[str, Tensor]] = {}
    for name, t in named:
        if name in inverse_global:
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            yield inverse_global[name], t
            continue
        m = _HF_LAYER.match(name)
        if not m:
            raise KeyError(f"hf_to_megatron: unknown HF parameter {name!r}")
        i, rest = m.group(1), m.group(2)
        p = f"decoder.layers.{i}."
        if rest in _HF_TO_MEG_LAYER:
            yield p + _HF_TO_MEG_LAYER[rest], t
            continue
        part, kind = rest.split(".")[-2:]
        if part in ("q_proj", "k_proj", "v_proj"):
            key, parts, target = p + "qkv" + kind, ("q_proj", "k_proj", "v_proj"), "linear_qkv"
        elif part in ("gate_proj", "up_proj") and kind == "weight":
            key, parts, target = p + "fc1", ("gate_proj", "up_proj"), "linear_fc1"
        else:
            raise KeyError(f"hf_to_megatron: unknown HF layer parameter {name!r}")
        buf = pending.setdefault(key, {})
        buf[part] = t
        if all(x in buf for x in parts):
            del pending[key]
            if target == "linear_qkv":
                yield p + f"self_attention.linear_qkv.{kind}", fuse_qkv(
                    buf["q_proj"], buf["k_proj"], buf["v_proj"], cfg)
            else:
                yield p + "mlp.linear_fc1.weight", torch.cat([buf["gate_proj"], buf["up_proj"]])
    if pending:
        missing = {k: sorted(v) for k, v in pending.items()}
        raise KeyError(f"hf_to_megatron: incomplete fused parameters (have only): {missing}")
