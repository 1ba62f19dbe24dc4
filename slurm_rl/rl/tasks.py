"""Verifiable toy tasks for GRPO on CPU: prompts, targets and a reward in [0, 1].

Reward (``score_answer``): the generated ids are cut at the first ``<eos>`` and decoded.
* 1.0 when the text equals the target and ``<eos>`` was emitted;
* otherwise partial credit ``0.5 * matches / max(len(text), len(target))`` where ``matches``
  counts positions where the text agrees with the target (a missing ``<eos>`` counts as one
  extra wrong position). A random-init model scores about 0.5/vocab per answer, a model that
  always emits the exact answer scores 1.

Tasks:
* ``add``: ``"a+b="`` -> ``str(a+b)``, operands in ``[0, max_operand]``;
* ``copy``: ``"s="`` -> ``s``; ``reverse``: ``"s="`` -> ``s[::-1]``; ``s`` is ``length`` letters
  drawn from the first ``alphabet`` lower-case letters.

Prompts depend only on (seed, iteration, index): the sampler is deterministic and stateless.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Sequence

from slurm_rl.config import TASKS, TaskConfig  # the ``task`` section, validated by load_config
from slurm_rl.rl.tokenizer import CharTokenizer

__all__ = ["TASKS", "Problem", "TaskConfig", "make_problem", "sample_problems", "score_answer"]


@dataclass(frozen=True)
class Problem:
    """One prompt with its verifiable target."""

    prompt_ids: list[int]
    prompt: str
    target: str


def make_problem(cfg: TaskConfig, rng: random.Random, tok: CharTokenizer) -> Problem:
    """Draw one problem of ``cfg``'s task from ``rng``."""
    if cfg.name == "add":
        a, b = rng.randint(0, cfg.max_operand), rng.randint(0, cfg.max_operand)
        prompt, target = f"{a}+{b}=", str(a + b)
    else:
        s = "".join(rng.choice(string.ascii_lowercase[:cfg.alphabet]) for _ in range(cfg.length))
        prompt, target = f"{s}=", s if cfg.name == "copy" else s[::-1]
    return Problem(tok.encode(prompt, add_bos=True), prompt, target)


def sample_problems(cfg: TaskConfig, tok: CharTokenizer, seed: int, iteration: int, n: int
                    ) -> list[Problem]:
    """The ``n`` problems of ``iteration``: a pure function of (cfg, seed, iteration, n)."""
    rng = random.Random(f"{seed}/{iteration}")
    return [make_problem(cfg, rng, tok) for _ in range(n)]


def score_answer(ids: Sequence[int], target: str, tok: CharTokenizer) -> float:
    """Reward in [0, 1] of generated ``ids`` (see module docstring)."""
    ended = tok.eos_id in ids
    text = tok.decode(ids, stop_at_eos=True)
    if ended and text == target:
        return 1.0
    matches = sum(1 for a, b in zip(text, target) if a == b)
    length = max(len(text), len(target)) + (0 if ended else 1)
    return 0.5 * matches / max(length, 1)
