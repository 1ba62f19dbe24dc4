"""configs/examples/gsm8k_qwen2.5_0.5b.yaml holds together: its GSM8K conversion snippet (run here
on parquet files of the hub's layout) writes prompts the run accepts, and with a checkpoint of
Qwen2.5-0.5B's exact shapes (zeros, written on the spot) and a small chat tokenizer in place of the
downloads the example validates (``load_config`` + ``input_problems``, and ``slurm_rl.cli validate``
as a user runs it from the directory holding ``models/`` and ``data/``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_command import CLI

for _module in ("torch", "transformers", "pyarrow"):  # found, not imported: each test imports what it uses
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"needs {_module}", allow_module_level=True)

from slurm_rl.config import load_config  # noqa: E402
from slurm_rl.inputs import input_problems  # noqa: E402

pytestmark = pytest.mark.slow  # writes a 1 GB checkpoint; the CLI imports torch and transformers

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs/examples/gsm8k_qwen2.5_0.5b.yaml"
MODEL = "models/Qwen2.5-0.5B-Instruct"  # the example's model.path, relative to where it runs
SUFFIX = " Let's think step by step and output the final answer after \"####\"."
# Rows as openai/gsm8k ("main") holds them: a question, a worked answer ending "#### N".
ROWS = {
    "train": [
        {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
                     "many clips in May. How many clips did Natalia sell altogether?",
         "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                   "Natalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72"},
        {"question": "Weng earns $12 an hour for babysitting. Yesterday, she did 50 minutes of "
                     "babysitting. How much did she earn?",
         "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n"
                   "Working 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"},
        {"question": "A box holds 8 rows of 9 pens. How many pens are in the box?",
         "answer": "8 * 9 = <<8*9=72>>72\n#### 72"},
    ],
    "test": [
        {"question": "Janet has 70 apples and buys 2 more. How many apples does she have?",
         "answer": "70 + 2 = <<70+2=72>>72\n#### 72"},
        {"question": "Tom reads 1,000 pages in 4 days, the same each day. How many a day?",
         "answer": "1000 / 4 = <<1000/4=250>>250\n#### 250"},
    ],
}
# Qwen2.5-0.5B by its config.json: 151936 x 896 embeddings (tied: stored once), 24 layers of
# attention (14 query heads of 64, 2 KV groups, q/k/v biases) and a 4864-wide gated MLP, final norm.
H, L, N, G, D, F, V = 896, 24, 14, 2, 64, 4864, 151936
LAYER = H + (H + 1) * (N + 2 * G) * D + N * D * H + H + 3 * H * F  # norms, qkv (+bias), o, MLP
QWEN25_05B_PARAMS = V * H + L * LAYER + H


def conversion_snippet() -> str:
    """The Python of the config's heredoc (between ``<<'EOF'`` and ``EOF``), comment marks off."""
    lines = CONFIG.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith("<<'EOF'"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "# EOF"
               or lines[i].lstrip("# ").rstrip() == "EOF")
    body = [line.lstrip("#") for line in lines[start + 1:end]]
    indent = min(len(b) - len(b.lstrip()) for b in body if b.strip())
    return "\n".join(b[indent:] for b in body) + "\n"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A directory as the example's comments leave it: ``models/...`` and ``data/gsm8k``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from slurm_rl.toy.checkpoint import QWEN25_05B, write_checkpoint_of_shapes
    from slurm_rl.toy.tokenizer import CHAT_TEMPLATE, train_tokenizer

    root = tmp_path_factory.mktemp("gsm8k_example")
    texts = [r["question"] + SUFFIX for rows in ROWS.values() for r in rows]
    train_tokenizer(root / "tokenizer", texts, chat_template=CHAT_TEMPLATE)
    t0 = time.perf_counter()
    write_checkpoint_of_shapes(root / MODEL, QWEN25_05B, dtype=torch.bfloat16,
                               tokenizer_dir=root / "tokenizer")
    write_s = time.perf_counter() - t0
    raw = root / "data/gsm8k/raw/main"  # hf download openai/gsm8k --include "main/*"
    raw.mkdir(parents=True)
    for split, rows in ROWS.items():
        pq.write_table(pa.Table.from_pylist(rows), raw / f"{split}-00000-of-00001.parquet")
    proc = subprocess.run([sys.executable, "-c", conversion_snippet()], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return {"root": root, "write_s": write_s}


def test_conversion_snippet_writes_chat_prompts_with_gsm8k_answers(workdir: dict) -> None:
    for split, rows in ROWS.items():
        lines = (workdir["root"] / f"data/gsm8k/{split}.jsonl").read_text().splitlines()
        got = [json.loads(line) for line in lines]
        assert got == [{"prompt": [{"role": "user", "content": r["question"] + SUFFIX}],
                        "answer": r["answer"]} for r in rows]
    assert got[0]["answer"].endswith("#### 72")


def test_checkpoint_has_qwen25_05b_architecture_and_size(workdir: dict) -> None:
    import torch
    from safetensors import safe_open

    from slurm_rl.engines.hf_checkpoint import model_config_from_dir

    path = workdir["root"] / MODEL
    cfg = model_config_from_dir(path)
    assert (cfg.architecture, cfg.hidden_size, cfg.num_layers, cfg.num_attention_heads) == (
        "qwen2", 896, 24, 14)
    assert (cfg.num_query_groups, cfg.kv_groups, cfg.ffn_size, cfg.vocab_size) == (
        2, 2, 4864, 151936)
    assert cfg.head_dim == 64 and cfg.tie_word_embeddings and cfg.qkv_bias and not cfg.qk_norm
    assert cfg.rotary_base == 1e6 and cfg.norm_epsilon == 1e-6
    numel = 0
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            shape = f.get_slice(key).get_shape()
            numel += int(torch.Size(shape).numel())
            assert f.get_slice(key).get_dtype() == "BF16", key
    assert QWEN25_05B_PARAMS == 494_032_768
    assert cfg.num_parameters() == numel == QWEN25_05B_PARAMS
    assert (path / "model.safetensors").stat().st_size > 2 * QWEN25_05B_PARAMS  # bf16 + header
    print(f"checkpoint of Qwen2.5-0.5B's shapes written in {workdir['write_s']:.1f}s")


def test_example_validates_with_the_files(workdir: dict) -> None:
    root = workdir["root"]
    data = root / "data/gsm8k"
    cfg = load_config(CONFIG, [f"model.path={root / MODEL}",
                               f"data.train_files=[{data / 'train.jsonl'}]",
                               f"data.val_files=[{data / 'test.jsonl'}]"], env={})
    assert input_problems(cfg) == []
    assert cfg.runtime.device == "cuda" and cfg.cluster.auto_scheduler
    assert cfg.scheduler.policy == "auto" and cfg.rollout.backend == "vllm"
    assert cfg.placement.num_slots == 8 and set(cfg.placement.components) == {
        "actor", "rollout", "inference"}
    assert cfg.reward.name == "gsm8k" and cfg.eval.every == 10
    assert cfg.train.rollout_batch_size * cfg.train.group_size % cfg.train.global_batch_size == 0
    assert cfg.actor.lr == 1e-6 and cfg.actor.lr_warmup_samples > 0
    assert cfg.algorithm.kl_coef == 0.001


def test_example_rejects_missing_downloads(tmp_path: Path) -> None:
    """Before the downloads, validation names the model directory and both data files."""
    cfg = load_config(CONFIG, [f"model.path={tmp_path / MODEL}",
                               f"data.train_files=[{tmp_path / 'train.jsonl'}]",
                               f"data.val_files=[{tmp_path / 'test.jsonl'}]"], env={})
    keys = {issue.key for issue in input_problems(cfg)}
    assert {"model.path", "data.train_files[0]", "data.val_files[0]"} <= keys


def test_cli_validate_exits_0_where_the_files_are(workdir: dict) -> None:
    """As the comments say to run it: from the directory holding models/ and data/, no overrides."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([*CLI, "validate", str(CONFIG)],
                          cwd=workdir["root"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "valid" in proc.stdout and "world size 8" in proc.stdout
