"""Toy verifiable tasks as dataset files (``.jsonl`` or ``.parquet``), like a downloaded data set.

The toy tasks (once generated inside the training loop), pure functions of ``(seed, index)``:
* ``add``: prompt ``"3+4="``, answer ``"#### 7"`` (the GSM8K answer format: the number after
  ``"#### "``), operands in ``[0, max_operand]``;
* ``copy``: prompt ``"abc="``, answer ``"abc"``; ``reverse``: answer ``"cba"`` (reward: exact match);
  the strings are ``length`` letters of the first ``alphabet`` lower-case letters.

A row is ``{"prompt": ..., "answer": ..., "task": ..., "id": i}``; with ``chat=True`` the prompt is a
conversation, ``[{"role": "user", "content": "3+4="}]``.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from typing import Any, Iterator

__all__ = ["ANSWER_PREFIX", "TASKS", "make_example", "make_row", "read_task_dataset",
           "task_rows", "write_task_dataset"]

TASKS: tuple[str, ...] = ("add", "copy", "reverse")  # as slurm_rl.config.TASKS
ANSWER_PREFIX = "#### "  # GSM8K: the final answer follows this marker


def make_example(task: str, seed: int, index: int, *, max_operand: int = 9, length: int = 3,
                 alphabet: int = 8) -> tuple[str, str]:
    """``(prompt, target)`` of problem ``index`` of ``task`` under ``seed``; the target is the bare
    answer (``"7"``, ``"cba"``). A pure function of its arguments."""
    if task not in TASKS:
        raise ValueError(f"task {task!r}: expected one of {TASKS}")
    if not 1 <= alphabet <= 26:
        raise ValueError(f"alphabet {alphabet}: expected 1..26 letters")
    rng = random.Random(f"{task}/{seed}/{index}")  # str seeds hash with sha512: stable everywhere
    if task == "add":
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        return f"{a}+{b}=", str(a + b)
    s = "".join(rng.choice(string.ascii_lowercase[:alphabet]) for _ in range(length))
    return f"{s}=", s if task == "copy" else s[::-1]


def make_row(task: str, seed: int, index: int, *, max_operand: int = 9, length: int = 3,
             alphabet: int = 8, chat: bool = False) -> dict[str, Any]:
    """Dataset row ``index``: ``{"prompt", "answer", "task", "id"}`` (see the module docstring)."""
    prompt, target = make_example(task, seed, index, max_operand=max_operand, length=length,
                                  alphabet=alphabet)
    answer = ANSWER_PREFIX + target if task == "add" else target
    return {"prompt": [{"role": "user", "content": prompt}] if chat else prompt,
            "answer": answer, "task": task, "id": index}


def task_rows(task: str = "add", *, rows: int = 2000, seed: int = 0, first_id: int = 0,
              **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Rows ``first_id .. first_id + rows - 1`` (``kwargs``: those of :func:`make_row`)."""
    for i in range(first_id, first_id + rows):
        yield make_row(task, seed, i, **kwargs)


def write_task_dataset(path: str | Path, task: str = "add", *, rows: int = 2000, seed: int = 0,
                       max_operand: int = 9, length: int = 3, alphabet: int = 8,
                       chat: bool = False, first_id: int = 0) -> Path:
    """Write ``rows`` rows of ``task`` to ``path``: JSON lines (``.jsonl``) or Parquet
    (``.parquet``), chosen by the suffix; the file appears complete or not at all."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".parquet"):
        raise ValueError(f"{path}: expected a .jsonl or .parquet file")
    data = list(task_rows(task, rows=rows, seed=seed, first_id=first_id, max_operand=max_operand,
                          length=length, alphabet=alphabet, chat=chat))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".jsonl":
        tmp.write_text("".join(json.dumps(row) + "\n" for row in data))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(data), tmp)
    tmp.replace(path)
    return path


def read_task_dataset(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a file written by :func:`write_task_dataset`."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text().splitlines() if line]
