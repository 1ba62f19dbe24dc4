"""Hypothesis example counts: full in the whole suite (CI), a tenth in the quick loop.

Profiles: ``full`` (default) and ``quick``, chosen with ``--hypothesis-profile`` or, when none is
named, ``quick`` for a run that deselects the slow tests (``-m "not slow"``). A property test asks
for its full count with ``@settings(max_examples=examples(400), ...)``.
"""

from __future__ import annotations

from hypothesis import settings

FULL, QUICK = "full", "quick"
# the base count of each profile; examples(n) scales n by it (hypothesis' default is 100)
settings.register_profile(FULL, max_examples=100)
settings.register_profile(QUICK, max_examples=10)


def examples(n: int) -> int:
    """``n`` examples under the full profile, a tenth (at least 10) under the quick one."""
    return max(min(n, 10), n * settings.default.max_examples // 100)
