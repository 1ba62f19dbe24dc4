"""The config reference, generated from the typed config: every key of :class:`slurm_rl.config.RootSchema` with its
type, its default and its meaning (the comment on or above its field in ``slurm_rl/config.py``), and the key
tables of the foreign dialects (:mod:`slurm_rl.dialects`). ``python tools/gen_docs.py`` writes them into
``docs/config-reference.md``, ``docs/coming-from-verl.md`` and ``docs/coming-from-rlinf.md`` between the
``<!-- generated -->`` markers; a test holds the files to what this module prints."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from typing import Any

from omegaconf import MISSING

from slurm_rl.config import RootSchema

BEGIN, END = "<!-- generated: begin -->", "<!-- generated: end -->"


def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comment: the ``# ...`` lines right above it and the one after it on its line."""
    lines = inspect.getsource(cls).splitlines()
    out: dict[str, str] = {}
    above: list[str] = []
    for line in lines[1:]:
        text = line.strip()
        if text.startswith("#"):
            above.append(text.lstrip("# ").strip())
            continue
        m = re.match(r"(\w+)\s*:\s*[^=]+?(?:=.*?)?(?:#\s*(.*))?$", text)
        if m and not text.startswith(("def ", "@", '"""')):
            parts = [*above, *([m.group(2).strip()] if m.group(2) else [])]
            out[m.group(1)] = " ".join(parts)
        above = [] if not text.startswith("#") else above
    return out


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union and type(None) in args:
        return f"{_type_name(next(a for a in args if a is not type(None)))} or null"
    if origin in (list, typing.List):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin in (dict, typing.Dict):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> str:  # type: ignore[type-arg]
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(value):
            return ""
    else:
        return "required"
    if value is MISSING:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def _rows(cls: type, prefix: str) -> list[tuple[str, str, str, str]]:
    hints = typing.get_type_hints(cls)
    comments = _field_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        key, tp = f"{prefix}{f.name}", hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows += _rows(tp, key + ".")
            continue
        args = typing.get_args(tp)
        if typing.get_origin(tp) in (list, typing.List) and args and dataclasses.is_dataclass(args[0]):
            rows.append((key, "list", "`[]`", comments.get(f.name, "") or (args[0].__doc__ or "").strip()))
            rows += _rows(args[0], key + "[i].")
            continue
        rows.append((key, _type_name(tp), _default(f), comments.get(f.name, "")))
    return rows


def config_reference() -> str:
    """Markdown: one table per section of the config, every key with its type, default and meaning."""
    out = []
    hints = typing.get_type_hints(RootSchema)
    for f in dataclasses.fields(RootSchema):
        cls = hints[f.name]
        doc = " ".join((cls.__doc__ or "").split())
        out += [f"### `{f.name}`", "", doc, "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for key, tp, default, meaning in _rows(cls, f"{f.name}."):
            out.append(f"| `{key}` | {tp} | {default} | {meaning.replace('|', '&#124;')} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def dialect_table(name: str) -> str:
    """Markdown: every key of a foreign dialect's table, what it sets here or why it is ignored or refused."""
    from slurm_rl.dialects.core import dialects

    dialect = next(d for d in dialects() if d.name == name)
    out = [f"| {dialect.title} key | here | meaning |", "|---|---|---|"]
    for key in dialect.table:
        if key.kind in ("mapped", "derived"):
            here = f"`{key.ours}`" + (" (from several keys)" if key.derived else "")
            refused = " Refused unless the value is allowed." if key.refuse is not None else ""
            meaning = key.meaning + refused
        elif key.kind == "ignored":
            here = "ignored" + (" (a warning where its value asks for something)" if key.benign else "")
            meaning = f"{key.meaning}: {key.ignored}" + (
                " Refused where the value asks for what is not done here." if key.refuse is not None else "")
        else:
            here, meaning = "refused", key.meaning
        out.append(f"| `{key.foreign}` | {here} | {meaning.replace('|', '&#124;')} |")
    return "\n".join(out) + "\n"


def splice(text: str, generated: str) -> str:
    """``text`` with what lies between the generated markers replaced by ``generated``."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{generated}{END}{tail}"
