"""Hugging Face checkpoint directories in and out: architecture, checks, streaming load, export.

A checkpoint directory holds ``config.json``, ``*.safetensors`` (one file, or shards listed by
``model.safetensors.index.json``) and tokenizer files. Supported architectures
(:data:`SUPPORTED`): Llama (GQA, ``rope_theta``, Llama-3 ``rope_scaling``), Qwen2/Qwen2.5 (q/k/v
biases, tied embeddings), Qwen3 dense (q/k RMSNorm, its own ``head_dim``).

* :func:`model_config_from_dir` reads the architecture and sizes from ``config.json``
  (through ``transformers.AutoConfig``, which resolves legacy RoPE keys);
* :func:`checkpoint_problems` lists every problem of a directory without reading tensor data
  (safetensors headers only): unreadable config, unsupported architecture, missing tensors,
  wrong shapes, no tokenizer;
* :func:`load_into_megatron` streams the tensors into a megatron-core model: each megatron
  parameter reads only the HF tensors it is made of (``convert.hf_sources``);
* :func:`write_hf_dir` writes HF-named tensors as a directory ``transformers`` and vLLM load.
"""

from __future__ import annotations

import json
import shutil
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch
from torch import Tensor

from slurm_rl.engines.convert import fuse_sources, hf_param_shapes, hf_sources
from slurm_rl.engines.model_config import ModelConfig
from slurm_rl.errors import InputError

SUPPORTED = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
Problem = tuple[str, Any, str]


class CheckpointError(InputError):
    """A model directory cannot be used (names the directory, the file and what is wrong)."""


def read_config_json(path: str | Path) -> dict[str, Any]:
    """``config.json`` of the checkpoint directory ``path`` as a dict."""
    cfg_file = Path(path) / "config.json"
    try:
        data = json.loads(cfg_file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no config.json (a Hugging Face checkpoint directory "
                              "holds config.json and *.safetensors)") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{cfg_file}: unreadable: {err}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{cfg_file}: not a JSON object")
    return data


def architecture_of(config: Mapping[str, Any], where: str) -> str:
    """Our architecture name of a ``config.json`` dict, or :class:`CheckpointError` naming its
    ``architectures`` and the supported list."""
    archs = config.get("architectures") or []
    known = [SUPPORTED[a] for a in archs if a in SUPPORTED]
    if not known:
        raise CheckpointError(f"{where}: architectures {archs} is not supported; supported: "
                              f"{', '.join(SUPPORTED)}")
    return known[0]


def _refuse(where: str, key: str, value: Any, allowed: str) -> None:
    raise CheckpointError(f"{where}: {key} = {value!r} is not supported (allowed: {allowed})")


def model_config_from_hf(hf: Any, where: str) -> ModelConfig:
    """The engines' :class:`ModelConfig` of a ``transformers`` config object."""
    raw = hf.to_dict()
    arch = architecture_of(raw, where)
    if getattr(hf, "hidden_act", "silu") != "silu":
        _refuse(where, "hidden_act", hf.hidden_act, "silu")
    if arch != "qwen2" and getattr(hf, "attention_bias", False):
        _refuse(where, "attention_bias", True, "false (q/k/v biases are Qwen2's)")
    if getattr(hf, "mlp_bias", False):
        _refuse(where, "mlp_bias", True, "false")
    if getattr(hf, "use_sliding_window", False):
        _refuse(where, "use_sliding_window", True, "false")
    rope = dict(getattr(hf, "rope_parameters", None) or {})
    theta = float(rope.pop("rope_theta", getattr(hf, "rope_theta", 10000.0)))
    scaling = rope if rope.get("rope_type", "default") != "default" else None
    heads = hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    try:
        return ModelConfig(
            vocab_size=hf.vocab_size, hidden_size=hf.hidden_size, num_layers=hf.num_hidden_layers,
            num_attention_heads=heads,
            num_query_groups=getattr(hf, "num_key_value_heads", None) or heads,
            ffn_hidden_size=hf.intermediate_size,
            max_position_embeddings=hf.max_position_embeddings, rotary_base=theta,
            norm_epsilon=float(hf.rms_norm_eps),
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            architecture=arch,
            kv_channels=head_dim if head_dim * heads != hf.hidden_size else None,
            qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3", rope_scaling=scaling)
    except ValueError as err:
        raise CheckpointError(f"{where}: {err}") from None


def model_config_from_dir(path: str | Path) -> ModelConfig:
    """The :class:`ModelConfig` of the checkpoint directory ``path`` (its ``config.json``)."""
    from transformers import AutoConfig

    where = f"{Path(path) / 'config.json'}"
    architecture_of(read_config_json(path), where)
    try:
        hf = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise CheckpointError(f"{where}: transformers cannot read it: {err}") from None
    return model_config_from_hf(hf, where)


def checkpoint_dtype(path: str | Path) -> torch.dtype:
    """The dtype the checkpoint says its weights are in (``dtype`` / ``torch_dtype``), fp32 if none."""
    config = read_config_json(path)
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    return getattr(torch, str(name), torch.float32)


class SafetensorsFiles:
    """The tensors of a checkpoint directory by name: which file holds each, its shape, and a
    reader that opens each file once (memory-mapped) and reads one tensor at a time."""

    def __init__(self, path: str | Path) -> None:
        from safetensors import safe_open

        self.path = Path(path)
        index = self.path / INDEX
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError) as err:
                raise CheckpointError(f"{index}: unreadable: {err}") from None
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p.name for p in self.path.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"{self.path}: no *.safetensors files (nor {INDEX})")
        self.file_of: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for name in files:
            try:
                with safe_open(str(self.path / name), framework="pt") as f:
                    for key in f.keys():
                        self.file_of[key] = name
                        self.shapes[key] = tuple(f.get_slice(key).get_shape())
            except Exception as err:  # safetensors raises its own error types
                raise CheckpointError(f"{self.path / name}: unreadable safetensors: {err}") from None
        self._stack = ExitStack()
        self._open: dict[str, Any] = {}

    def read(self, name: str) -> Tensor:
        """The tensor ``name`` (KeyError naming the directory when absent)."""
        from safetensors import safe_open

        if name not in self.file_of:
            raise CheckpointError(f"{self.path}: tensor {name!r} is missing from the safetensors")
        file = self.file_of[name]
        if file not in self._open:
            self._open[file] = self._stack.enter_context(
                safe_open(str(self.path / file), framework="pt"))
        return self._open[file].get_tensor(name)

    def close(self) -> None:
        """Close the open files."""
        self._stack.close()
        self._open.clear()

    def __enter__(self) -> "SafetensorsFiles":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def tensor_problems(files: SafetensorsFiles, cfg: ModelConfig) -> list[str]:
    """Tensors the model needs that are missing or of a wrong shape (one line each)."""
    out = []
    for name, shape in hf_param_shapes(cfg):
        have = files.shapes.get(name)
        if have is None:
            out.append(f"tensor {name} is missing (expected shape {list(shape)})")
        elif have != shape:
            out.append(f"tensor {name} has shape {list(have)}, the config.json implies {list(shape)}")
    return out


def has_tokenizer(path: str | Path) -> bool:
    """Whether ``path`` holds tokenizer files ``AutoTokenizer`` can load."""
    p = Path(path)
    return any((p / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.json"))


def checkpoint_problems(path: Any, key: str = "model.path",
                        tokenizer_path: Any = None) -> list[Problem]:
    """Every problem of the checkpoint directory ``path`` as (key, value, what is allowed),
    without reading tensor data."""
    p = Path(str(path))
    if not p.is_dir():
        return [(key, str(path), "an existing, readable Hugging Face checkpoint directory")]
    try:
        cfg = model_config_from_dir(p)
        with SafetensorsFiles(p) as files:
            problems = [(key, str(path), line) for line in tensor_problems(files, cfg)]
    except CheckpointError as err:
        problems = [(key, str(path), str(err))]
    if tokenizer_path is None and not has_tokenizer(p):
        problems.append((key, str(path), "a directory with tokenizer files (tokenizer.json, "
                         "tokenizer.model or vocab.json), or model.tokenizer_path set"))
    return problems


@torch.no_grad()
def load_into_megatron(model: torch.nn.Module, path: str | Path, cfg: ModelConfig,
                       shard: Callable[[str, Tensor], Tensor] | None = None,
                       skip: tuple[str, ...] = ()) -> dict[str, float]:
    """Copy the checkpoint's weights into the megatron-core ``model`` of ``cfg`` in place,
    tensor by tensor (each parameter reads only its own HF tensors). ``shard(name, full)`` cuts
    a tensor-parallel rank's part of a full megatron tensor; parameters named in ``skip`` (a
    critic's value head) keep their values. Returns ``bytes`` read and ``seconds``."""
    import time

    t0, nbytes = time.perf_counter(), 0
    with SafetensorsFiles(path) as files:
        for name, param in model.named_parameters():
            if name in skip:
                continue
            sources = [files.read(s) for s in hf_sources(name, cfg)]
            nbytes += sum(t.numel() * t.element_size() for t in sources)
            value = fuse_sources(name, sources, cfg)
            if shard is not None:
                value = shard(name, value)
            if tuple(value.shape) != tuple(param.shape):
                raise CheckpointError(f"{path}: {hf_sources(name, cfg)} make shape "
                                      f"{list(value.shape)}, the actor's {name} is {list(param.shape)}")
            param.copy_(value)
    return {"bytes": float(nbytes), "seconds": time.perf_counter() - t0}


def write_hf_dir(named: Iterable[tuple[str, Tensor]], cfg: ModelConfig, directory: str | Path,
                 config_source: str | Path | None = None, tokenizer_source: str | Path | None = None,
                 dtype: torch.dtype | None = None, max_shard_bytes: int = 4 << 30) -> Path:
    """Write HF-named tensors as a Hugging Face directory: safetensors (sharded with an index
    above ``max_shard_bytes``), ``config.json`` (the source's, or made from ``cfg``) and the
    tokenizer files of ``tokenizer_source``. ``dtype`` (default: the source's) is the saved dtype."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    if dtype is None:
        dtype = checkpoint_dtype(config_source) if config_source is not None else torch.float32
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for name, t in named:
        t = t.detach().to(device="cpu", dtype=dtype).contiguous()
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += n
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata=meta)
    else:
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out / fname), metadata=meta)
            for name, t in shard.items():
                weight_map[name] = fname
                total += t.numel() * t.element_size()
        (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total},
                                             "weight_map": weight_map}, indent=2))
    dtype_name = str(dtype).removeprefix("torch.")
    if config_source is not None:
        config = read_config_json(config_source)
        config.pop("torch_dtype", None)
        config["dtype"] = dtype_name
        (out / "config.json").write_text(json.dumps(config, indent=2))
        gen = Path(config_source) / "generation_config.json"
        if gen.exists():
            shutil.copyfile(gen, out / "generation_config.json")
    else:
        from slurm_rl.engines.convert import hf_config

        made = hf_config(cfg)
        made.dtype = dtype
        made.save_pretrained(str(out))
    if tokenizer_source is not None:
        for fname in TOKENIZER_FILES:
            src = Path(tokenizer_source) / fname
            if src.exists():
                shutil.copyfile(src, out / fname)
    return out
