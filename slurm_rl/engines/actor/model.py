"""megatron-core GPTModel (Llama, Qwen2, Qwen3) built from a ModelConfig, and next-token log-probs.

State-dict names (TP=1, ``L`` = layer index, ``h`` = hidden, ``d`` = head size,
``n`` = attention heads, ``g`` = query groups (KV heads), ``f`` = ffn size, ``V`` = vocab)::

    embedding.word_embeddings.weight                   [V, h]
    decoder.layers.L.input_layernorm.weight            [h]        RMSNorm before attention
    decoder.layers.L.self_attention.linear_qkv.weight  [(n + 2g) d, h]
    decoder.layers.L.self_attention.linear_qkv.bias    [(n + 2g) d]     Qwen2 only
    decoder.layers.L.self_attention.q_layernorm.weight [d]        Qwen3 only (and k_layernorm)
    decoder.layers.L.self_attention.linear_proj.weight [h, n d]   attention output projection
    decoder.layers.L.pre_mlp_layernorm.weight          [h]        RMSNorm before the MLP
    decoder.layers.L.mlp.linear_fc1.weight             [2f, h]    rows [0, f) = gate, [f, 2f) = up
    decoder.layers.L.mlp.linear_fc2.weight             [h, f]     down projection
    decoder.final_layernorm.weight                     [h]
    output_layer.weight                                [V, h]     absent when embeddings are tied

``linear_qkv`` interleaves Q, K and V per query group: viewed as ``[g, (n/g + 2) d, h]``, group
``i`` holds its ``n/g`` query heads (``n/g * d`` rows), then its key head (``d`` rows), then its
value head (``d`` rows). The HF Llama equivalents are therefore::

    w = qkv.view(g, n // g + 2, d, h)
    q_proj = w[:, : n // g].reshape(n * d, h)
    k_proj = w[:, n // g].reshape(g * d, h)
    v_proj = w[:, n // g + 1].reshape(g * d, h)
    gate_proj, up_proj = fc1.chunk(2, dim=0)

RoPE is the non-interleaved (rotate-half) variant, as in HF Llama. ``*._extra_state`` entries in
``state_dict()`` are megatron bookkeeping (empty on this spec) and carry no tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from slurm_rl.engines.errors import EngineStateError
from slurm_rl.engines.model_config import ModelConfig

from .cpu_shim import apply_cpu_shim

if TYPE_CHECKING:
    from megatron.core.models.gpt import GPTModel


RECOMPUTE = {"none": {},
             "selective": {"recompute_granularity": "selective"},
             "full": {"recompute_granularity": "full", "recompute_method": "uniform",
                      "recompute_num_layers": 1}}
"""megatron-core activation recompute settings of ``actor.recompute``."""

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def transformer_config(cfg: ModelConfig, tp_size: int = 1, initialize: bool = True,
                       precision: str = "fp32", recompute: str = "none") -> Any:
    """The megatron ``TransformerConfig`` for ``cfg`` (no dropout, no fused kernels): parameters
    in ``precision`` (fp32 | bf16), activation ``recompute`` (none | selective | full)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = DTYPES[precision]
    return TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_query_groups,
        ffn_hidden_size=cfg.ffn_size,
        kv_channels=cfg.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=cfg.norm_epsilon,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=cfg.qkv_bias,
        qk_layernorm=cfg.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=True,
        perform_initialization=initialize,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=tp_size,
        **RECOMPUTE[recompute],
    )


def single_rank_group() -> Any:
    """A private one-rank gloo process group (no rendezvous with any other process).

    megatron-core modules read ``tp_group.size()`` / ``.rank()`` even at TP=1; a standalone
    group over an in-memory store satisfies that without megatron's global ``parallel_state``
    and without a collective ``new_group`` call across the world.
    """
    import datetime

    from torch.distributed import HashStore, ProcessGroupGloo

    store = HashStore()
    return ProcessGroupGloo(store, 0, 1, datetime.timedelta(seconds=60))


def init_local_process_group() -> bool:
    """Initialise a one-process gloo world (in-memory store) if torch.distributed is not.

    megatron-core modules only work with torch.distributed initialised; standalone users of
    the model (converters, tests, tools) call this first. Returns True if it initialised.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return True


def ensure_megatron_globals() -> None:
    """Create megatron's process-wide scratch buffer used by core attention.

    This is the only megatron global our code initialises (``parallel_state`` model-parallel
    groups are *not* initialised; groups are passed explicitly). Idempotent.
    """
    from megatron.core import parallel_state

    if getattr(parallel_state, "_GLOBAL_MEMORY_BUFFER", None) is None:
        parallel_state._set_global_memory_buffer()


def ensure_cuda_rng_tracker(seed: int, tp_rank: int) -> None:
    """Seed megatron's CUDA RNG tracker (the named states attention forks around its dropout)
    once per process on a CUDA device; the CPU shim's tracker plays this part on CPU.

    megatron's ``model_parallel_cuda_manual_seed`` with the ranks given explicitly
    (``parallel_state`` is not initialised). Later calls do nothing.
    """
    from megatron.core.tensor_parallel import random as mrandom

    if mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME in mrandom.get_cuda_rng_tracker().get_states():
        return
    mrandom.model_parallel_cuda_manual_seed(seed, tp_rank=tp_rank, ep_rank=0, etp_rank=0)


def preload_megatron(device: str = "cpu") -> None:
    """Import the megatron-core modules :func:`build_gpt_model` needs (and apply the CPU shim),
    so that a later build costs only the module construction. Idempotent."""
    if device.startswith("cpu"):
        apply_cpu_shim()
    from megatron.core.models.gpt import GPTModel  # noqa: F401
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: F401
    from megatron.core.process_groups_config import ProcessGroupCollection  # noqa: F401
    from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: F401


def _process_groups(tp_group: Any | None) -> Any:
    """Explicit megatron process groups (TP as given, or a one-rank group)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    one = single_rank_group()
    return ProcessGroupCollection(tp=tp_group if tp_group is not None else one, pp=one, cp=one,
                                  embd=None, pos_embd=None)


def build_gpt_model(cfg: ModelConfig, seed: int, device: str = "cpu",
                    tp_group: Any | None = None, initialize: bool = True,
                    precision: str = "fp32", recompute: str = "none", attention: str = "sdpa") -> "GPTModel":
    """Build the megatron-core GPTModel for ``cfg`` with weights determined by ``seed``.

    Initialisation is done on CPU from a generator seeded with ``seed`` (the global torch RNG
    is left untouched), so every rank that builds the model gets identical weights. With a
    ``tp_group`` of size > 1 each rank keeps its tensor-parallel shard (``layout.ParamSpec``) of
    the TP 1 model of the same seed, so the initial model does not depend on the TP size; logits
    are gathered over TP (``parallel_output=False``). ``initialize=False`` skips weight
    initialisation (a skeleton whose weights are about to be overwritten, e.g. by a reshard or a
    checkpoint load). ``precision`` is the parameters' dtype (fp32 | bf16); ``attention`` the core
    attention (:mod:`slurm_rl.engines.actor.attention`: sdpa | local).
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise EngineStateError(
            "build_gpt_model: torch.distributed is not initialised; megatron-core needs it "
            "(call init_local_process_group() for a single process)")
    if device.startswith("cpu"):
        apply_cpu_shim()
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    ensure_megatron_globals()
    tp_size = tp_group.size() if tp_group is not None else 1
    if not device.startswith("cpu"):
        ensure_cuda_rng_tracker(seed, tp_group.rank() if tp_group is not None else 0)
    from .attention import use_attention
    from .plain_ops import use_fast_rope, use_plain_linears, use_plain_swiglu

    use_fast_rope()
    spec = use_attention(get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=cfg.qk_norm), attention)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPTModel(
            config=transformer_config(cfg, tp_size, initialize and tp_size == 1, precision, recompute),
            transformer_layer_spec=spec,
            vocab_size=cfg.vocab_size,
            max_sequence_length=cfg.max_position_embeddings,
            pre_process=True,
            post_process=True,
            share_embeddings_and_output_weights=cfg.tie_word_embeddings,
            position_embedding_type="rope",
            rotary_percent=1.0,
            rotary_base=int(cfg.rotary_base) if float(cfg.rotary_base).is_integer()
            else cfg.rotary_base,
            pg_collection=_process_groups(tp_group),
            parallel_output=False,
        )
    if tp_size == 1:
        use_plain_linears(model)
    use_plain_swiglu(model)
    if initialize and tp_size > 1:
        _copy_tp_shard(model, build_gpt_model(cfg, seed, "cpu", attention=attention), tp_size, tp_group.rank())
    if cfg.rope_scaling:
        model.rotary_pos_emb.inv_freq = rope_inv_freq(cfg)
    return model.to(device)


def _copy_tp_shard(model: torch.nn.Module, full: torch.nn.Module, tp: int, tp_rank: int) -> None:
    """Copy TP rank ``tp_rank``'s shard of ``full``'s parameters into ``model``."""
    from .layout import param_specs

    params = dict(full.named_parameters())
    named = list(model.named_parameters())
    with torch.no_grad():
        for (name, p), spec in zip(named, param_specs(((n, p.shape) for n, p in named), tp)):
            p.copy_(spec.shard(params[name].detach(), tp, tp_rank))


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies of ``cfg`` computed by ``transformers`` itself (Llama-3 and
    every other ``rope_type`` it knows), so the actor rotates exactly as the HF model does."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from slurm_rl.engines.convert import hf_config

    hf = hf_config(cfg)
    rope_type = dict(cfg.rope_scaling or {}).get("rope_type", "default")
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise EngineStateError(f"model.rope_scaling: rope_type {rope_type!r} is not one of "
                               f"{sorted(ROPE_INIT_FUNCTIONS)}")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf, torch.device("cpu"))
    if abs(float(scaling) - 1.0) > 0:
        raise EngineStateError(f"model.rope_scaling: rope_type {rope_type!r} scales attention by "
                               f"{scaling}; only types that leave it at 1.0 are supported")
    return inv_freq.float()


def attention_mask_4d(attention_mask: torch.Tensor | None, batch: int, seq: int,
                      device: torch.device) -> torch.Tensor:
    """Megatron boolean mask ``[B, 1, T, T]`` (True = masked): causal plus key padding."""
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=device), diagonal=1)
    mask = causal.view(1, 1, seq, seq).expand(batch, 1, seq, seq)
    if attention_mask is not None:
        pad = ~attention_mask.to(device=device, dtype=torch.bool)
        mask = mask | pad.view(batch, 1, 1, seq)
    return mask


def forward_logits(model: torch.nn.Module, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logits ``[B, T, V]`` for right-padded ``input_ids [B, T]``.

    ``attention_mask [B, T]`` (1 = token, 0 = padding) hides padded keys; positions are
    ``0..T-1`` for every row, so sequences must be right-padded.
    """
    batch, seq = input_ids.shape
    device = input_ids.device
    position_ids = torch.arange(seq, device=device).unsqueeze(0).expand(batch, seq)
    mask = attention_mask_4d(attention_mask, batch, seq, device)
    return model(input_ids, position_ids, attention_mask=mask)


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probability of each next token: ``out[b, t] = log p(input_ids[b, t+1] | <= t)``.

    Returns float32 ``[B, T-1]``. Entries whose target is padding are meaningless and must be
    masked by the caller (``attention_mask[:, 1:]``).
    """
    return token_logprobs_and_entropy(model, input_ids, attention_mask, entropy=False)[0]


def token_logprobs_and_entropy(model: torch.nn.Module, input_ids: torch.Tensor,
                               attention_mask: torch.Tensor | None = None, entropy: bool = True
                               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`token_logprobs` and, with ``entropy``, the entropy of each next-token distribution
    (``-sum_v p_v log p_v``, float32 ``[B, T-1]``, differentiable: verl's ``entropy_coeff`` term); the logits
    are never held whole (:func:`slurm_rl.engines.actor.logprobs.batch_logprobs`)."""
    from .logprobs import batch_logprobs

    batch = {"input_ids": input_ids}
    if attention_mask is not None:
        batch["attention_mask"] = attention_mask
    return batch_logprobs(model, batch, input_ids.device, entropy)
