"""Write the toy files a run would otherwise download: tokenizer, model checkpoint, datasets.

    .venv/bin/python tools/make_toy_files.py DIR [--arch llama] [--task add] [--rows N] [--seed S]

writes ``DIR/tokenizer/`` (character-level, trained with ``tokenizers``, with a chat template),
``DIR/model/`` (a random-init Hugging Face checkpoint with the tokenizer files copied in),
``DIR/train.jsonl`` and ``DIR/val.jsonl``, and prints a JSON summary. What already exists is kept
(``--force`` rewrites it); ``DIR/make_toy_files.json`` records the settings, and a rerun with
other settings is refused without ``--force``. The model's vocabulary is the tokenizer's rounded up to a multiple of 8.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from slurm_rl.toy.checkpoint import ARCHITECTURES, make_checkpoint  # noqa: E402
from slurm_rl.toy.tasks import TASKS, task_rows, write_task_dataset  # noqa: E402
from slurm_rl.toy.tokenizer import CHAT_TEMPLATE, train_tokenizer  # noqa: E402

MANIFEST = "make_toy_files.json"  # the settings DIR was made with
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="output directory")
    p.add_argument("--arch", default="llama", choices=ARCHITECTURES)
    p.add_argument("--task", default="add", choices=TASKS)
    p.add_argument("--rows", type=int, default=2000, help="training rows")
    p.add_argument("--val-rows", type=int, default=200, help="validation rows (ids after train's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model init and the datasets")
    p.add_argument("--max-operand", type=int, default=9, help="add: operands in [0, N]")
    p.add_argument("--length", type=int, default=3, help="copy / reverse: letters per string")
    p.add_argument("--alphabet", type=int, default=8, help="copy / reverse: first N letters")
    p.add_argument("--chat", action="store_true", help="prompts as [{role: user, content}]")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2, help="head size hidden/heads: vLLM CPU needs >= 32")
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    p.add_argument("--intermediate", type=int, default=None, help="default: 4 * hidden")
    p.add_argument("--head-dim", type=int, default=None, help="llama / qwen3; default hidden/heads")
    p.add_argument("--max-position", type=int, default=64, help="max_position_embeddings")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--tie-word-embeddings", action="store_true")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--max-shard-size", default=None, help='e.g. "100KB": a sharded checkpoint')
    p.add_argument("--force", action="store_true", help="rewrite files that exist")
    return p.parse_args(argv)


def _replace_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    tmp.replace(final)


def make_toy_files(args: argparse.Namespace) -> dict[str, Any]:
    """Write what is missing (everything with ``--force``) under ``args.dir``; the summary."""
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    root: Path = args.dir
    root.mkdir(parents=True, exist_ok=True)
    data_kw = dict(task=args.task, seed=args.seed, max_operand=args.max_operand,
                   length=args.length, alphabet=args.alphabet, chat=args.chat)
    summary: dict[str, Any] = {"dir": str(root)}
    settings = {k: v for k, v in sorted(vars(args).items()) if k not in ("dir", "force")}
    manifest = root / MANIFEST
    if manifest.is_file() and not args.force:
        old = json.loads(manifest.read_text())
        changed = {k: [old.get(k), v] for k, v in settings.items() if old.get(k) != v}
        if changed:
            raise SystemExit(f"{root} was made with other settings {changed} ([old, new]); "
                             "rerun with --force to rewrite it")

    tok_dir = root / "tokenizer"
    written = args.force or not (tok_dir / "tokenizer.json").is_file()
    if written:
        texts = [r["answer"] + "".join(m["content"] for m in r["prompt"]) if args.chat
                 else r["prompt"] + r["answer"]
                 for r in task_rows(args.task, rows=min(args.rows, 1000), seed=args.seed,
                                    max_operand=args.max_operand, length=args.length,
                                    alphabet=args.alphabet, chat=args.chat)]
        tmp = root / "tokenizer.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        train_tokenizer(tmp, texts, chat_template=CHAT_TEMPLATE)
        _replace_dir(tmp, tok_dir)
    tok_size = len(AutoTokenizer.from_pretrained(tok_dir))
    summary["tokenizer"] = {"path": str(tok_dir), "size": tok_size, "written": written}

    model_dir = root / "model"
    vocab_size = -(-tok_size // 8) * 8
    written = args.force or not (model_dir / "config.json").is_file()
    if written:
        tmp = root / "model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        make_checkpoint(tmp, args.arch, seed=args.seed, dtype=DTYPES[args.dtype],
                        max_shard_size=args.max_shard_size, tokenizer_dir=tok_dir,
                        vocab_size=vocab_size, hidden_size=args.hidden, num_layers=args.layers,
                        num_heads=args.heads, num_kv_heads=args.kv_heads,
                        intermediate_size=args.intermediate, head_dim=args.head_dim,
                        tie_word_embeddings=args.tie_word_embeddings, rope_theta=args.rope_theta,
                        max_position_embeddings=args.max_position)
        _replace_dir(tmp, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    summary["model"] = {"path": str(model_dir), "arch": config["model_type"],
                        "vocab_size": config["vocab_size"], "hidden_size": config["hidden_size"],
                        "num_hidden_layers": config["num_hidden_layers"], "written": written,
                        "files": sorted(p.name for p in model_dir.iterdir())}

    for name, rows, first_id in (("train", args.rows, 0), ("val", args.val_rows, args.rows)):
        path = root / f"{name}.jsonl"
        written = args.force or not path.is_file()
        if written:
            write_task_dataset(path, rows=rows, first_id=first_id, **data_kw)
        n = sum(1 for line in path.read_text().splitlines() if line)
        summary[name] = {"path": str(path), "rows": n, "written": written}
    manifest.write_text(json.dumps(settings, indent=1) + "\n")
    summary["settings"] = settings
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    return summary


def main(argv: list[str] | None = None) -> int:
    print(json.dumps(make_toy_files(parse_args(argv)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
