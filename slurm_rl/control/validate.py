"""Field checks for control documents read from shared storage: errors name the file and the field."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from slurm_rl.control.errors import TornFileError

_KINDS = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an int"),
    "count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a non-negative int"),
    "number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "a boolean"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "histogram": (lambda v: isinstance(v, dict) and all(
        isinstance(b, str) and b.isascii() and b.isdigit() and str(int(b)) == b and isinstance(n, int) and not isinstance(n, bool)
        and n >= 0 for b, n in v.items()), "an object of bucket numbers to non-negative ints"),
}


def check_fields(doc: Mapping[str, Any], path: str | os.PathLike[str], required: Mapping[str, str],
                 optional: Mapping[str, str] | None = None, within: str | None = None) -> Mapping[str, Any]:
    """Check ``doc``'s fields against kinds (``int``, ``count``, ``number``, ``bool``, ``str``,
    ``object``, ``list``, ``histogram``; a ``?`` suffix also allows null). Raises :class:`TornFileError`
    naming ``path``, the field (``within.field`` for an object nested in field ``within``), its value
    and what it must be. Returns ``doc``."""
    prefix = f"{within}." if within else ""
    for name, kind in required.items():
        if name not in doc:
            raise TornFileError(f"{path}: field '{prefix}{name}' is missing (must be {_KINDS[kind.rstrip('?')][1]})")
    for name, kind in {**required, **(optional or {})}.items():
        if name not in doc:
            continue
        value = doc[name]
        nullable = kind.endswith("?")
        ok, want = _KINDS[kind.rstrip("?")]
        if not (ok(value) or (nullable and value is None)):
            raise TornFileError(f"{path}: field '{prefix}{name}' must be {want}{' or null' if nullable else ''}, "
                                f"got {value!r}")
    return doc


def check_known(doc: Mapping[str, Any], path: str | os.PathLike[str], known: Iterable[str]) -> None:
    """Refuse a field outside ``known`` (a writer's typo would otherwise be written and never read)."""
    allowed = set(known)
    unknown = [name for name in doc if name not in allowed]
    if unknown:
        raise TornFileError(f"{path}: field '{unknown[0]}' is not a known field (known: {', '.join(sorted(allowed))})")


def check_equal(doc: Mapping[str, Any], path: str | os.PathLike[str], **expected: Any) -> None:
    """Check identity fields (``epoch=3, rank=5``) against what the file's name says."""
    for name, want in expected.items():
        if doc.get(name) != want:
            raise TornFileError(f"{path}: field '{name}' is {doc.get(name)!r}, expected {want!r} (from the file name)")
