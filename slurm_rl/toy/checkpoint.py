"""Small Hugging Face checkpoints written on the spot, instead of downloaded.

* :func:`hf_config` -- a ``LlamaConfig`` / ``Qwen2Config`` / ``Qwen3Config`` of a small model with the
  real particulars of each family: Llama without attention biases (optionally with Llama-3 RoPE
  scaling), Qwen2 with q/k/v biases, Qwen3 with q/k RMSNorm and an explicit ``head_dim``.
* :func:`make_model` / :func:`make_checkpoint` -- a random-init model under a fixed seed, every
  parameter perturbed by noise (so that biases are not all zero and norm weights not all one),
  saved with ``save_pretrained`` (safetensors, sharded on request), plus tokenizer files and
  ``generation_config.json``.
* :func:`write_checkpoint_of_shapes` -- the safetensors shards of a large model (e.g.
  :data:`QWEN25_05B`) written tensor by tensor from the shapes of a ``meta``-device model, never
  holding the model in memory.

transformers 5 keeps RoPE settings in ``rope_parameters`` (``{"rope_type": ..., "rope_theta": ...,
<scaling keys>}``) and writes that, not the older top-level ``rope_theta`` / ``rope_scaling``, into
``config.json``; it still reads the older spelling (as in :data:`QWEN25_05B`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedModel

__all__ = ["ARCHITECTURES", "QWEN25_05B", "hf_config", "make_checkpoint", "make_model",
           "meta_model_shapes", "write_checkpoint_of_shapes"]

ARCHITECTURES: tuple[str, ...] = ("llama", "qwen2", "qwen3")

# config.json of Qwen/Qwen2.5-0.5B-Instruct (494M parameters, 0.99 GB in bfloat16)
QWEN25_05B: Mapping[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

_NOISE_STD = 0.02  # added to every parameter after init (make_checkpoint)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "chat_template.jinja", "chat_template.json")
_SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64"}
_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.float64: "float64"}


def hf_config(arch: str, *, vocab_size: int, hidden_size: int = 64, num_layers: int = 2,
              num_heads: int = 2, num_kv_heads: int | None = None,
              intermediate_size: int | None = None, head_dim: int | None = None,
              tie_word_embeddings: bool = False, rope_theta: float = 10000.0,
              rope_scaling: Mapping[str, Any] | None = None, max_position_embeddings: int = 128,
              rms_norm_eps: float = 1e-6, bos_token_id: int = 1, eos_token_id: int = 2,
              pad_token_id: int = 0) -> PreTrainedConfig:
    """The transformers config of a small ``arch`` model (one of :data:`ARCHITECTURES`).

    ``num_kv_heads`` defaults to ``num_heads``, ``intermediate_size`` to ``4 * hidden_size``,
    ``head_dim`` to ``hidden_size // num_heads`` (Qwen2 has no other); ``rope_scaling`` is the
    scaling part of ``rope_parameters``, e.g. ``{"rope_type": "llama3", "factor": 8.0, ...}``.
    """
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch {arch!r}: expected one of {ARCHITECTURES}")
    if head_dim is None and hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_heads {num_heads}")
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    default_head_dim = hidden_size // num_heads
    head_dim = default_head_dim if head_dim is None else head_dim
    rope: dict[str, Any] = {"rope_type": "default"}
    if rope_scaling is not None:
        rope = dict(rope_scaling)
        if "type" in rope:  # the older spelling
            rope.setdefault("rope_type", rope.pop("type"))
    rope["rope_theta"] = float(rope_theta)
    common: dict[str, Any] = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size or 4 * hidden_size, hidden_act="silu",
        tie_word_embeddings=tie_word_embeddings, rope_parameters=rope,
        max_position_embeddings=max_position_embeddings, rms_norm_eps=rms_norm_eps,
        bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    if arch == "llama":
        return LlamaConfig(**common, head_dim=head_dim, attention_bias=False, mlp_bias=False)
    if arch == "qwen2":  # q/k/v projections always carry biases; no head_dim field
        if head_dim != default_head_dim:
            raise ValueError(f"qwen2: head_dim must be hidden_size // num_heads = {default_head_dim}")
        return Qwen2Config(**common, use_sliding_window=False, max_window_layers=num_layers)
    # qwen3: RMSNorm on q and k per head, no biases, head_dim independent of hidden/heads
    return Qwen3Config(**common, head_dim=head_dim, attention_bias=False, use_sliding_window=False,
                       max_window_layers=num_layers)


def _copy_tokenizer(tokenizer_dir: str | Path, directory: Path) -> None:
    src = Path(tokenizer_dir)
    copied = [name for name in _TOKENIZER_FILES if (src / name).is_file()]
    if "tokenizer.json" not in copied:
        raise FileNotFoundError(f"{src}: no tokenizer.json")
    for name in copied:
        shutil.copyfile(src / name, directory / name)


def make_model(arch: str, *, seed: int = 0, dtype: torch.dtype = torch.float32,
               **config_kwargs: Any) -> PreTrainedModel:
    """The random-init ``arch`` model of :func:`make_checkpoint` (config :func:`hf_config` of
    ``config_kwargs``), in memory, in eval mode: initialized in float32, then cast to ``dtype``.
    Deterministic in ``seed``; leaves the global torch RNG alone."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = hf_config(arch, **config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():  # biases off zero, norm weights off one; then ``dtype``
            param.add_(torch.randn(param.shape, generator=gen) * _NOISE_STD)
            param.data = param.data.to(dtype)  # buffers (RoPE inv_freq) stay float32, as loaded
    model.eval()
    model.config.dtype = dtype
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id)
    return model


def make_checkpoint(directory: str | Path, arch: str, *, seed: int = 0,
                    dtype: torch.dtype = torch.float32, max_shard_size: str | int | None = None,
                    tokenizer_dir: str | Path | None = None, **config_kwargs: Any) -> Path:
    """Write the model of :func:`make_model` as a Hugging Face checkpoint (safetensors, config.json,
    generation_config.json with the eos id) into ``directory`` and return it. ``max_shard_size``
    (e.g. ``"100KB"``) shards it with a ``model.safetensors.index.json``; ``tokenizer_dir``'s
    tokenizer files are copied in."""
    model = make_model(arch, seed=seed, dtype=dtype, **config_kwargs)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, **kwargs)
    if tokenizer_dir is not None:
        _copy_tokenizer(tokenizer_dir, directory)
    return directory


def _config_of(config_dict: Mapping[str, Any]) -> PreTrainedConfig:
    from transformers import AutoConfig

    rest = {k: v for k, v in config_dict.items() if k not in ("model_type", "transformers_version")}
    return AutoConfig.for_model(config_dict["model_type"], **rest)


def meta_model_shapes(config_dict: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint of ``config_dict`` (a config.json) holds, in
    state-dict order, from a model built on the ``meta`` device; a tied output embedding is left
    out, as ``save_pretrained`` does."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_config_of(config_dict))
    seen: set[int] = set()
    shapes: dict[str, tuple[int, ...]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:  # a tied weight: stored once, under its first name
            continue
        seen.add(id(tensor))
        shapes[name] = tuple(tensor.shape)
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _chunks(name: str, shape: tuple[int, ...], dtype: torch.dtype, fill: str,
            gen: torch.Generator, max_elements: int = 1 << 24) -> Iterator[memoryview]:
    """The bytes of one tensor, in pieces of at most ``max_elements`` elements (little-endian, as
    safetensors stores them)."""
    total, done = _numel(shape), 0
    itemsize = torch.empty((), dtype=dtype).element_size()
    zeros = memoryview(bytes(min(total, max_elements) * itemsize)) if fill == "zeros" else None
    norm = len(shape) == 1 and "norm" in name
    while done < total:
        n = min(max_elements, total - done)
        if zeros is not None:
            yield zeros[:n * itemsize]
        else:
            piece = (torch.randn(n, generator=gen) * _NOISE_STD + (1.0 if norm else 0.0)).to(dtype)
            yield memoryview(piece.view(torch.uint8).numpy())
        done += n


def _write_safetensors(path: Path, names: list[str], shapes: Mapping[str, tuple[int, ...]],
                       dtype: torch.dtype, fill: str, gen: torch.Generator) -> None:
    """One safetensors file written tensor by tensor (header, then the data in header order)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        size = _numel(shapes[name]) * itemsize
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(shapes[name]),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name in names:
            for piece in _chunks(name, shapes[name], dtype, fill, gen):
                f.write(piece)
    tmp.replace(path)


def write_checkpoint_of_shapes(directory: str | Path, config_dict: Mapping[str, Any], *,
                               dtype: torch.dtype = torch.bfloat16, fill: str = "zeros",
                               max_shard_bytes: int = 1_000_000_000, seed: int = 0,
                               tokenizer_dir: str | Path | None = None) -> Path:
    """Write a checkpoint of ``config_dict``'s shapes (a config.json, e.g. :data:`QWEN25_05B`) into
    ``directory`` without building the model in memory: safetensors shards of at most
    ``max_shard_bytes`` (more than one: ``model-0000i-of-0000n.safetensors`` plus
    ``model.safetensors.index.json``), filled with zeros or, ``fill="random"``, noise (norm weights
    around one), and ``config.json`` (its dtype set to ``dtype``). Returns ``directory``."""
    if fill not in ("zeros", "random"):
        raise ValueError(f"fill {fill!r}: expected 'zeros' or 'random'")
    if dtype not in _SAFETENSORS_DTYPES:
        raise ValueError(f"dtype {dtype}: expected one of {list(_SAFETENSORS_DTYPES)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shapes = meta_model_shapes(config_dict)
    itemsize = torch.empty((), dtype=dtype).element_size()
    shards: list[list[str]] = [[]]
    shard_bytes = 0
    for name, shape in shapes.items():
        size = _numel(shape) * itemsize
        if shards[-1] and shard_bytes + size > max_shard_bytes:
            shards.append([])
            shard_bytes = 0
        shards[-1].append(name)
        shard_bytes += size
    gen = torch.Generator().manual_seed(seed)
    if len(shards) == 1:
        _write_safetensors(directory / "model.safetensors", shards[0], shapes, dtype, fill, gen)
    else:
        weight_map: dict[str, str] = {}
        for i, names in enumerate(shards, start=1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            _write_safetensors(directory / file, names, shapes, dtype, fill, gen)
            weight_map.update({name: file for name in names})
        total = sum(_numel(s) for s in shapes.values()) * itemsize
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config = dict(config_dict)
    dtype_keys = [k for k in ("torch_dtype", "dtype") if k in config] or ["torch_dtype"]
    for key in dtype_keys:
        config[key] = _DTYPE_NAMES[dtype]
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer_dir is not None:
        _copy_tokenizer(tokenizer_dir, directory)
    return directory
