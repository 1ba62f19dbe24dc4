"""A dense reward for the toy tasks: partial credit for a response close to the answer.

``partial_match`` is a ``reward.fn`` (``slurm_rl.toy.rewards:partial_match``): 1.0 for the exact
answer, otherwise ``0.5 * matches / max(len(response), len(answer))`` where ``matches`` counts the
positions where both agree. A random model scores above 0 on most samples, so every GRPO group has
a learning signal from the first iteration (the binary ``exact`` reward gives most groups none).
The answer is the text after ``"#### "`` when it has one (the add task's GSM8K format).
"""

from __future__ import annotations

from typing import Any


def partial_match(prompt: str, response: str, answer: Any, extra: dict) -> float:
    """Reward in [0, 1] of ``response`` against ``answer`` (see the module docstring)."""
    target = str(answer).split("####")[-1].strip()
    text = response.strip()
    if text == target:
        return 1.0
    matches = sum(1 for a, b in zip(text, target) if a == b)
    return 0.5 * matches / max(len(text), len(target), 1)
