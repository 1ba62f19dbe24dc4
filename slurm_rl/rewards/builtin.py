"""The built-in reward functions: ``gsm8k``, ``gsm8k_strict`` (verl's), ``math``, ``exact`` and ``auto``
(by the row's ``data_source``, as verl routes it).

Each is ``(prompt, response, answer, extra) -> float`` and returns 1.0 for a correct response,
0.0 otherwise; a ground truth that cannot be read raises ``ValueError`` (a data problem, not a
wrong response). They are pure functions of their arguments and run in the reward worker
processes of :class:`~slurm_rl.rewards.runner.RewardRunner`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Any

__all__ = ["BUILTIN", "DATA_SOURCES", "MATH_TIMEOUT_S", "RewardFn", "auto", "exact", "gsm8k", "gsm8k_strict", "math"]

RewardFn = Callable[[str, str, Any, dict], float]
"""A reward function: ``(prompt, response, answer, extra) -> float``."""

MATH_TIMEOUT_S = 2
"""math-verify's own limit (seconds) on each parse and each comparison, in the main thread of a
process (signal.alarm: an int; math-verify silently fails every parse given a float). The
runner's ``timeout_s`` bounds the whole call."""

# A number as GSM8K writes it: optional sign, digits with thousands commas, optional decimals.
_NUMBER = r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(_NUMBER)
_HASH_NUMBER_RE = re.compile(r"####\s*\$?\s*(" + _NUMBER + ")")


def _to_decimal(text: str) -> Decimal | None:
    """``text`` (commas and a leading ``$`` dropped) as a finite Decimal, or None."""
    cleaned = text.strip().replace(",", "").lstrip("$").strip()
    try:
        value = Decimal(cleaned)
    except (InvalidOperation, ValueError):
        return None
    return value if value.is_finite() else None


def _gsm8k_gold(answer: Any) -> Decimal:
    """The GSM8K ground truth as verl reads it: the text after the last ``####`` (or the whole
    answer: a number string, an int or a float), commas removed."""
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float, Decimal)):
        raise ValueError(f"gsm8k: the answer {answer!r} is not a GSM8K solution or a number")
    text = answer.rsplit("####", 1)[-1] if isinstance(answer, str) else str(answer)
    value = _to_decimal(text)
    if value is None:
        raise ValueError(f"gsm8k: no number in the answer {answer!r} "
                         "(expected '... #### 72' or a bare number)")
    return value


def _gsm8k_prediction(response: str) -> Decimal | None:
    """The response's answer: the number after the last ``####`` if any, else the last number
    (verl's "flexible" rule); None when the response holds no number."""
    marked = _HASH_NUMBER_RE.findall(response)
    found = marked or _NUMBER_RE.findall(response)
    return _to_decimal(found[-1]) if found else None


def gsm8k(prompt: str, response: str, answer: Any, extra: dict) -> float:
    """1.0 if the response's final number equals the GSM8K answer (as numbers: "7" == "7.0")."""
    gold = _gsm8k_gold(answer)
    pred = _gsm8k_prediction(response)
    return 1.0 if pred is not None and pred == gold else 0.0


_VERL_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
_VERL_CLIP_CHARS = 300  # verl reads the last 300 characters of a response


def gsm8k_strict(prompt: str, response: str, answer: Any, extra: dict) -> float:
    """verl's GSM8K score (``verl.utils.reward_score.gsm8k``, its default ``method="strict"``): 1.0 if the
    last ``#### N`` of the response's last 300 characters, commas and ``$`` removed, equals the ground
    truth as text ("7.0" is not "7"); no ``#### N``: 0.0. The ground truth is the text after ``####`` (a
    GSM8K solution) or the answer itself (verl's preprocessed ``reward_model.ground_truth``)."""
    _gsm8k_gold(answer)  # a ground truth that holds no number is a data problem: ValueError
    gold = answer.rsplit("####", 1)[-1].strip() if isinstance(answer, str) else str(answer)
    found = _VERL_STRICT_RE.findall(response[-_VERL_CLIP_CHARS:])
    return 1.0 if found and found[-1].replace(",", "").replace("$", "") == gold else 0.0


def math(prompt: str, response: str, answer: Any, extra: dict) -> float:  # noqa: A001 (the reward's name)
    """1.0 if math-verify finds the response's answer equal to the gold answer.

    The gold answer is LaTeX (``\\frac{1}{2}``, ``$...$`` or ``\\boxed{...}``) or a number; a bare
    one is wrapped in ``$...$``. math-verify's signal-based timeouts (:data:`MATH_TIMEOUT_S`) are
    used in a main thread only; elsewhere they are off and the caller's timeout bounds the call."""
    from math_verify import parse, verify  # imported here: sympy and antlr take ~0.3 s to load

    limit = MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold_text = str(answer).strip()
    if "$" not in gold_text and "\\boxed" not in gold_text and "\\(" not in gold_text:
        gold_text = f"${gold_text}$"
    gold = parse(gold_text, parsing_timeout=limit)  # type: ignore[arg-type]
    if not gold:
        raise ValueError(f"math: math-verify cannot parse the answer {answer!r}")
    pred = parse(response, parsing_timeout=limit)  # type: ignore[arg-type]
    if not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=limit) else 0.0


def exact(prompt: str, response: str, answer: Any, extra: dict) -> float:
    """1.0 if the stripped response equals ``str(answer)`` stripped."""
    return 1.0 if response.strip() == str(answer).strip() else 0.0


# verl's default_compute_score: which reward scores a row, by its data_source column
DATA_SOURCES: Mapping[str, str] = MappingProxyType({
    "openai/gsm8k": "gsm8k_strict",
    "lighteval/MATH": "math", "DigitalLearningGmbH/MATH-lighteval": "math", "HuggingFaceH4/MATH-500": "math",
})


def auto(prompt: str, response: str, answer: Any, extra: dict) -> float:
    """The reward of the row's ``data_source`` column, as verl's ``default_compute_score`` routes it
    (:data:`DATA_SOURCES`); an unknown or missing source raises ``ValueError`` naming it."""
    source = extra.get("data_source")
    if source not in DATA_SOURCES:
        raise ValueError(f"auto: no reward for data_source {source!r}; known sources: {', '.join(DATA_SOURCES)} "
                         "(or name the reward: reward.name / reward.fn)")
    return BUILTIN[DATA_SOURCES[source]](prompt, response, answer, extra)


BUILTIN: Mapping[str, RewardFn] = MappingProxyType({"gsm8k": gsm8k, "gsm8k_strict": gsm8k_strict, "math": math,
                                                   "exact": exact, "auto": auto})
"""The built-in rewards by ``reward.name`` (read-only)."""
