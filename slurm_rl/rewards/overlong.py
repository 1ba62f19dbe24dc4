"""DAPO's overlong reward shaping, as verl's DAPO reward manager applies it."""

from __future__ import annotations

from collections.abc import Sequence


def overlong_penalties(lengths: Sequence[int], max_new_tokens: int, buffer_len: int, factor: float) -> list[float]:
    """Per response, ``min(-(length - (max_new_tokens - buffer_len)) / buffer_len * factor, 0)``: nothing up
    to ``max_new_tokens - buffer_len`` tokens, then linearly down to ``-factor`` at ``max_new_tokens``."""
    expected = max_new_tokens - buffer_len
    return [min(-(n - expected) / buffer_len * factor, 0.0) for n in lengths]
