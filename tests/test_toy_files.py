"""The toy files of ``slurm_rl.toy`` (tokenizer, checkpoints, datasets) and
``tools/make_toy_files.py``: written files load back with transformers and are what they claim."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("transformers") is None:  # found, not imported: the tests that load with it import it
    pytest.skip("needs transformers", allow_module_level=True)

from safetensors import safe_open  # noqa: E402

from slurm_rl.toy.checkpoint import (  # noqa: E402
    QWEN25_05B, make_checkpoint, make_model, meta_model_shapes, write_checkpoint_of_shapes)
from slurm_rl.toy.tasks import make_row, read_task_dataset, write_task_dataset  # noqa: E402
from slurm_rl.toy.tokenizer import CHAT_TEMPLATE, train_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
ARCH_KWARGS: dict[str, dict[str, Any]] = {
    "llama": {"rope_scaling": LLAMA3_ROPE, "num_kv_heads": 1},
    "qwen2": {"tie_word_embeddings": True, "num_kv_heads": 1, "rope_theta": 1e6},
    "qwen3": {"head_dim": 48},
}
SMALL = dict(vocab_size=48, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=96,
             max_position_embeddings=64)
TEXTS = ["3+4=#### 7", "abc=cba", "12*3-4=", "user: x\nassistant: ", "  zz  ", "a\n\n b: c"]
IDS = torch.tensor([[1, 12, 7, 13, 20, 5, 5, 5, 5, 4, 16], [1, 21, 22, 23, 20, 23, 22, 21, 0, 3, 9]])


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            out.update({name: f.get_tensor(name) for name in f.keys()})
    return out


def _shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            out.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    return out


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tok")
    train_tokenizer(directory, ["3+4=#### 7", "abc=cba"], chat_template=CHAT_TEMPLATE)
    return directory


def test_tokenizer_round_trip(tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<bos>", "<eos>")
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids[0] == 1 and len(ids) == len(text) + 1  # <bos>, then one id per character
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(tok.encode("3+4", add_special_tokens=False) + [2, 0],
                      skip_special_tokens=True) == "3+4"
    assert tok.convert_ids_to_tokens(tok.encode(" \n", add_special_tokens=False)) == ["Ġ", "Ċ"]
    assert len(tok) == 3 + len(set("0123456789+-*=# abcdefghijklmnopqrstuvwxyz:\n"))
    conv = [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "#### 7"},
            {"role": "user", "content": "1+1="}]
    text = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    assert text == "<bos>user: 3+4=\nassistant: #### 7<eos>\nuser: 1+1=\nassistant: "
    assert tok.encode(text, add_special_tokens=False).count(2) == 1  # <eos> is one token
    assert json.loads((tokenizer_dir / "tokenizer_config.json").read_text())["tokenizer_class"] \
        == "PreTrainedTokenizerFast"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_checkpoint_loads_with_same_logits(arch: str, tmp_path: Path, tokenizer_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {**SMALL, **ARCH_KWARGS[arch]}
    directory = make_checkpoint(tmp_path / arch, arch, seed=3, tokenizer_dir=tokenizer_dir, **kwargs)
    model = make_model(arch, seed=3, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(directory).eval()
    assert type(loaded) is type(model)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, model(IDS).logits, rtol=0, atol=0)
        other = make_model(arch, seed=4, **kwargs)(IDS).logits
    assert not torch.allclose(other, model(IDS).logits)  # the seed matters
    # transformers 5 loads a qwen2 checkpoint's tokenizer as Qwen2Tokenizer (its own byte-level
    # pipeline): the ids and texts must still be those of the tokenizer directory
    tok, base = AutoTokenizer.from_pretrained(directory), AutoTokenizer.from_pretrained(tokenizer_dir)
    assert len(tok) == len(base) <= 48 and (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    for text in TEXTS:
        assert tok.encode(text) == base.encode(text)
        assert tok.decode(tok.encode(text), skip_special_tokens=True) == text
    assert tok.chat_template == CHAT_TEMPLATE
    conv = [{"role": "user", "content": "3+4="}]
    assert tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False) \
        == "<bos>user: 3+4=\nassistant: "
    assert json.loads((directory / "generation_config.json").read_text())["eos_token_id"] == 2

    config = json.loads((directory / "config.json").read_text())
    tensors = _tensors(directory)
    assert config["vocab_size"] == 48 and config["architectures"] == [type(model).__name__]
    norms = [t for name, t in tensors.items() if "norm" in name]
    assert norms and all(not torch.allclose(t, torch.ones_like(t)) for t in norms)
    biases = {name: t for name, t in tensors.items() if name.endswith(".bias")}
    assert all(t.abs().sum() > 0 for t in biases.values())
    if arch == "llama":
        assert config["rope_parameters"] == {**LLAMA3_ROPE, "rope_theta": 10000.0}
        assert not config["attention_bias"] and not biases
        assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)  # 1 KV head
    if arch == "qwen2":
        assert config["tie_word_embeddings"] and "lm_head.weight" not in tensors
        assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}
        for layer in range(2):
            assert {f"model.layers.{layer}.self_attn.{p}_proj.bias" for p in "qkv"} \
                <= set(biases)
        assert f"model.layers.0.self_attn.o_proj.bias" not in tensors
        assert tensors["model.layers.0.self_attn.k_proj.bias"].shape == (32,)
    if arch == "qwen3":
        assert config["head_dim"] == 48 != config["hidden_size"] // config["num_attention_heads"]
        assert tensors["model.layers.0.self_attn.q_norm.weight"].shape == (48,)
        assert tensors["model.layers.0.self_attn.k_norm.weight"].shape == (48,)
        assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (96, 64)
        assert tensors["model.layers.0.self_attn.o_proj.weight"].shape == (64, 96)
        assert not biases


def test_sharded_checkpoint(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    directory = make_checkpoint(tmp_path / "sharded", "qwen2", max_shard_size="40KB",
                                dtype=torch.bfloat16, **SMALL)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in directory.glob("*.safetensors"))
    assert len(shards) > 1 and sorted(set(index["weight_map"].values())) == shards
    assert set(index["weight_map"]) == set(_shapes(directory))
    loaded = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()
    model = make_model("qwen2", dtype=torch.bfloat16, **SMALL)
    assert next(loaded.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, model(IDS).logits, rtol=0, atol=0)


# Qwen2.5-0.5B's config.json with every size scaled down (14 heads on 2 KV heads, tied embeddings)
SMALL_QWEN25 = {**QWEN25_05B, "hidden_size": 112, "num_attention_heads": 14,
                "num_key_value_heads": 2, "intermediate_size": 96, "num_hidden_layers": 3,
                "vocab_size": 160, "max_position_embeddings": 256, "bos_token_id": 1,
                "eos_token_id": 2}


@pytest.mark.parametrize("fill", ["zeros", "random"])
def test_checkpoint_of_shapes(fill: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    directory = write_checkpoint_of_shapes(tmp_path / "shapes", SMALL_QWEN25, fill=fill,
                                           max_shard_bytes=40_000)
    # what save_pretrained writes for a real model of the same config
    from transformers import AutoConfig

    config = AutoConfig.for_model("qwen2", **{k: v for k, v in SMALL_QWEN25.items()
                                               if k not in ("model_type", "transformers_version")})
    reference = tmp_path / "reference"
    AutoModelForCausalLM.from_config(config).save_pretrained(reference)
    expected = _shapes(reference)
    assert "lm_head.weight" not in expected  # tied
    assert _shapes(directory) == expected == meta_model_shapes(SMALL_QWEN25)

    index = json.loads((directory / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in directory.glob("*.safetensors"))
    assert len(files) > 1 and sorted(set(index["weight_map"].values())) == files
    assert set(index["weight_map"]) == set(expected)
    for file in files:
        assert (directory / file).stat().st_size <= 40_000 + 10_000  # data + header
    tensors = _tensors(directory)
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in tensors.values())
    if fill == "zeros":
        assert all(not t.any() for t in tensors.values())
    else:
        assert all(t.float().std() > 0 for t in tensors.values() if t.numel() > 1)
        norm = tensors["model.norm.weight"].float()
        assert 0.8 < norm.mean() < 1.2
    saved = json.loads((directory / "config.json").read_text())
    assert saved["torch_dtype"] == "bfloat16" and saved["rope_theta"] == 1e6
    loaded = AutoModelForCausalLM.from_pretrained(directory)  # loads without missing keys
    assert loaded.config.hidden_size == 112 and loaded.config.tie_word_embeddings

    fp32 = write_checkpoint_of_shapes(tmp_path / "fp32", SMALL_QWEN25, dtype=torch.float32)
    assert (fp32 / "model.safetensors").is_file()  # one shard: no index
    assert json.loads((fp32 / "config.json").read_text())["torch_dtype"] == "float32"
    assert _shapes(fp32) == expected


def test_qwen25_05b_shapes() -> None:
    shapes = meta_model_shapes(QWEN25_05B)
    assert sum(torch.Size(s).numel() for s in shapes.values()) == 494_032_768
    assert shapes["model.embed_tokens.weight"] == (151936, 896)
    assert shapes["model.layers.23.self_attn.k_proj.bias"] == (128,)
    assert "lm_head.weight" not in shapes


@pytest.mark.parametrize("task", ["add", "copy", "reverse"])
def test_task_datasets(task: str, tmp_path: Path) -> None:
    a = write_task_dataset(tmp_path / "a.jsonl", task, rows=64, seed=5)
    b = write_task_dataset(tmp_path / "b.jsonl", task, rows=64, seed=5)
    assert a.read_bytes() == b.read_bytes()  # deterministic
    c = write_task_dataset(tmp_path / "c.jsonl", task, rows=64, seed=6)
    assert a.read_bytes() != c.read_bytes()
    rows = read_task_dataset(a)
    assert len(rows) == 64 and all(set(r) == {"prompt", "answer", "task", "id"} for r in rows)
    assert [r["id"] for r in rows] == list(range(64)) and {r["task"] for r in rows} == {task}
    for r in rows:
        assert r["prompt"].endswith("=")
        lhs = r["prompt"][:-1]
        if task == "add":
            x, y = lhs.split("+")
            assert r["answer"] == f"#### {int(x) + int(y)}" and int(x) <= 9 and int(y) <= 9
        else:
            assert len(lhs) == 3 and set(lhs) <= set("abcdefgh")
            assert r["answer"] == (lhs if task == "copy" else lhs[::-1])
    assert rows[10] == make_row(task, 5, 10)  # row i is a function of (seed, i) alone
    pq = read_task_dataset(write_task_dataset(tmp_path / "a.parquet", task, rows=64, seed=5))
    assert pq == rows
    chat = read_task_dataset(write_task_dataset(tmp_path / "chat.parquet", task, rows=8, seed=5,
                                                chat=True))
    assert [r["prompt"] for r in chat] == [[{"role": "user", "content": r["prompt"]}]
                                           for r in rows[:8]]


def test_make_toy_files_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.spec_from_file_location("make_toy_files", REPO / "tools" / "make_toy_files.py")
    assert spec is not None and spec.loader is not None
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    out = tmp_path / "toy"
    assert cli.main([str(out), "--arch", "qwen2", "--rows", "40", "--val-rows", "8"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"]["written"] and summary["train"]["rows"] == 40
    assert {p.name for p in out.iterdir()} >= {"tokenizer", "model", "train.jsonl", "val.jsonl"}
    config = json.loads((out / "model" / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(out / "model")
    assert config["vocab_size"] % 8 == 0 and len(tok) <= config["vocab_size"] < len(tok) + 8
    assert config["hidden_size"] // config["num_attention_heads"] >= 32
    assert config["max_position_embeddings"] == 64
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    train, val = read_task_dataset(out / "train.jsonl"), read_task_dataset(out / "val.jsonl")
    assert [r["id"] for r in val] == list(range(40, 48)) and len(train) == 40
    ids = tok(train[0]["prompt"], return_tensors="pt").input_ids
    with torch.no_grad():
        assert model(ids).logits.shape == (1, ids.shape[1], config["vocab_size"])
    before = (out / "model" / "model.safetensors").stat().st_mtime_ns
    assert cli.main([str(out), "--arch", "qwen2", "--rows", "40", "--val-rows", "8"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert not any(again[k]["written"] for k in ("tokenizer", "model", "train", "val"))
    assert (out / "model" / "model.safetensors").stat().st_mtime_ns == before
    with pytest.raises(SystemExit, match="other settings"):
        cli.main([str(out), "--arch", "llama", "--rows", "40", "--val-rows", "8"])
    assert cli.main([str(out), "--arch", "llama", "--rows", "40", "--val-rows", "8", "--force"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["arch"] == "llama"
    sys.modules.pop("make_toy_files", None)


def test_partial_match_gives_partial_credit() -> None:
    from slurm_rl.toy.rewards import partial_match

    assert partial_match("3+4=", "7", "#### 7", {}) == 1.0
    assert partial_match("abc=", "abd", "abc", {}) == 0.5 * 2 / 3
    assert partial_match("abc=", "", "abc", {}) == 0.0
    assert partial_match("9+9=", "1", "#### 18", {}) == 0.25
