"""The translation machinery shared by the dialect tables: keys, rows, Hydra overrides, flattening."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slurm_rl.placement import ConfigError, ConfigIssue


@dataclass(frozen=True)
class Key:
    """One foreign key: what it sets here (``ours``, its value through ``convert``), or why it is ignored
    (``ignored``; a warning unless ``benign(value)``), or when it is refused (``refuse(value)`` returns the
    allowed text). ``derived``: set by the dialect's ``derive`` from several keys (``ours`` names what it sets).
    ``foreign`` ending in ``.*`` covers a whole subtree; ``leaf``: the key's value is its whole subtree."""

    foreign: str
    meaning: str
    ours: str | None = None
    convert: Callable[[Any], Any] | None = None
    ignored: str | None = None
    benign: Callable[[Any], bool] | None = None
    refuse: Callable[[Any], str | None] | None = None
    derived: bool = False
    leaf: bool = False

    @property
    def kind(self) -> str:
        """mapped | derived | ignored | refused (a key that is refused for every value but the ones allowed)."""
        if self.derived:
            return "derived"
        if self.ours is not None:
            return "mapped"
        return "ignored" if self.ignored is not None else "refused"


@dataclass(frozen=True)
class Row:
    """One line of a translation: the foreign key and value, our key and value (None: ignored), a note."""

    foreign: str
    value: Any
    ours: str | None
    ours_value: Any
    note: str
    given: bool = True  # written by the user (False: the dialect's default)

    def text(self) -> str:
        src = f"{self.foreign} = {_show(self.value)}"
        if self.ours is None:
            return f"{src}: ignored ({self.note})"
        return f"{src} -> {self.ours} = {_show(self.ours_value)}" + (f"  ({self.note})" if self.note else "")


@dataclass
class Translation:
    """A foreign config translated: our config document, the rows, the warnings."""

    dialect: str
    source: str
    ours: dict[str, Any]
    rows: list[Row]
    warnings: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"dialect": self.dialect, "source": self.source, "warnings": list(self.warnings),
                "rows": [dataclasses.asdict(r) for r in self.rows]}


@dataclass(frozen=True)
class Dialect:
    """A foreign dialect: its table, its defaults (the values a key takes when not written), how it is
    recognised, and ``derive(values, given, out)`` for what several keys set together."""

    name: str
    title: str
    table: tuple[Key, ...]
    defaults: Mapping[str, Any]
    detect: Callable[[Mapping[str, Any]], bool]
    derive: Callable[[Mapping[str, Any], set[str], "Out"], None]

    def lookup(self, key: str) -> Key | None:
        """The table's entry for a dotted key: itself, else the closest ``prefix.*``."""
        exact = {k.foreign: k for k in self.table}
        if key in exact:
            return exact[key]
        parts = key.split(".")
        for n in range(len(parts) - 1, 0, -1):
            hit = exact.get(".".join(parts[:n]) + ".*")
            if hit is not None:
                return hit
        return None


@dataclass
class Out:
    """What a translation collects: our document, rows, warnings, issues."""

    dialect: str
    ours: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    issues: list[ConfigIssue] = field(default_factory=list)

    def set(self, our_key: str, value: Any, foreign: str, foreign_value: Any, note: str = "",
            given: bool = True) -> None:
        node = self.ours
        *head, last = our_key.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
        self.rows.append(Row(foreign, foreign_value, our_key, value, note, given))

    def ignore(self, foreign: str, value: Any, reason: str, warn: bool, given: bool = True) -> None:
        self.rows.append(Row(foreign, value, None, None, reason, given))
        if warn:
            self.warnings.append(f"{foreign}={_show(value)} ignored: {reason}")

    def refuse(self, foreign: str, value: Any, allowed: str) -> None:
        self.issues.append(ConfigIssue(foreign, value, allowed))


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
        return text if len(text) <= 80 else text[:77] + "..."
    return "null" if value is None else str(value)


# --------------------------------------------------------------------------- documents and overrides

_RESOLVERS: dict[str, Callable[..., Any]] = {  # the OmegaConf resolvers RLinf's configs use
    "add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
    "int_div": lambda a, b: a // b, "not": lambda a: not a, "eq": lambda a, b: a == b,
}


def _register_resolvers() -> None:
    register = getattr(OmegaConf, "register_resolver", None) or OmegaConf.register_new_resolver  # OmegaConf >= 2.4
    for name, fn in _RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            register(name, fn)


def parse_override(item: str) -> tuple[str, str, Any] | None:
    """A Hydra override as (op, dotted key, value): op ``=`` (set), ``+`` (add), ``++`` (add or set), ``~``
    (delete). None when ``item`` is not one."""
    op = "="
    text = item
    for prefix in ("++", "+", "~"):
        if text.startswith(prefix):
            op, text = prefix, text[len(prefix):]
            break
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not key or (not sep and op != "~"):
        return None
    if not sep:
        return op, key, None
    try:
        value = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]), resolve=False)["v"]
    except (yaml.YAMLError, OmegaConfBaseException):
        value = raw
    return op, key, value


def _apply(doc: dict[str, Any], op: str, key: str, value: Any) -> None:
    node = doc
    *head, last = key.split(".")
    for part in head:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    if op == "~":
        node.pop(last, None)
    else:
        node[last] = value


def split_overrides(dialect: Dialect, overrides: Sequence[str]) -> tuple[list[tuple[str, str, Any]], list[str]]:
    """The overrides in the dialect (keys its table knows, and any key outside our sections) and ours (the rest,
    Hydra's ``+``/``++`` dropped)."""
    from slurm_rl.config import RootSchema

    sections = {f.name for f in dataclasses.fields(RootSchema)}
    foreign: list[tuple[str, str, Any]] = []
    ours: list[str] = []
    for item in overrides:
        parsed = parse_override(item)
        if parsed is not None and (dialect.lookup(parsed[1]) is not None or parsed[1].split(".")[0] not in sections):
            foreign.append(parsed)
        else:
            ours.append(item.lstrip("+"))
    return foreign, ours


def _flatten(doc: Mapping[str, Any], dialect: Dialect, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value; a subtree is one value where the table says so (``leaf`` or ``prefix.*``)."""
    out: dict[str, Any] = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        entry = dialect.lookup(key)
        whole = entry is not None and (entry.leaf or (entry.foreign.endswith(".*") and key == entry.foreign[:-2]))
        if isinstance(v, Mapping) and v and not whole:
            out.update(_flatten(v, dialect, key + "."))
        else:
            out[key] = v
    return out


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in base.items()}
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def translate(dialect: Dialect, doc: Mapping[str, Any], overrides: Sequence[tuple[str, str, Any]],
              source: str) -> Translation:
    """``doc`` (a foreign config, unresolved) with ``overrides`` applied, through the dialect's table.
    Raises :class:`ConfigError` naming every refused or unknown key."""
    _register_resolvers()
    user: dict[str, Any] = _merge({}, doc)
    for op, key, value in overrides:
        _apply(user, op, key, value)
    try:
        resolved = OmegaConf.to_container(OmegaConf.create(_merge(dialect.defaults, user)), resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError([ConfigIssue(getattr(exc, "full_key", None) or source, None,
                                       f"a resolvable {dialect.title} config ({str(exc).splitlines()[0]})")]) from None
    assert isinstance(resolved, dict)
    given = set(_flatten(user, dialect))
    values = _flatten(resolved, dialect)
    out = Out(dialect.name)
    for key, value in values.items():
        entry = dialect.lookup(key)
        if entry is None:
            out.refuse(key, value, f"a {dialect.title} key this translation knows (docs/coming-from-{dialect.name}.md "
                                   "lists them with what each sets here), or one of ours")
            continue
        if entry.refuse is not None:
            allowed = entry.refuse(value)
            if allowed is not None:
                out.refuse(key, value, allowed)
                continue
        if entry.derived:
            continue
        if entry.ours is not None and value is None and entry.convert is not None:
            if key in given:
                out.rows.append(Row(key, None, entry.ours, None, "null: our default stays"))
        elif entry.ours is not None:
            out.set(entry.ours, entry.convert(value) if entry.convert else value, key, value,
                    "" if key in given else f"{dialect.title}'s default", key in given)
        elif entry.ignored is not None and key in given:
            out.ignore(key, value, entry.ignored, warn=entry.benign is not None and not entry.benign(value))
    dialect.derive(values, given, out)
    if out.issues:
        raise ConfigError(out.issues)
    return Translation(dialect.name, source, out.ours, out.rows, out.warnings)


# --------------------------------------------------------------------------- the command line's entry


def dialects() -> tuple[Dialect, ...]:
    from slurm_rl.dialects.rlinf import RLINF
    from slurm_rl.dialects.verl import VERL

    return VERL, RLINF


def detect_dialect(doc: Any) -> Dialect | None:
    """The foreign dialect of a config document (None: ours)."""
    if not isinstance(doc, Mapping):
        return None
    return next((d for d in dialects() if d.detect(doc)), None)


def read_foreign(config: str) -> tuple[Dialect, dict[str, Any]] | None:
    """A foreign config file (or the bare name of a dialect: its default config) as (dialect, document);
    None for one of ours (or a file that cannot be read: loading it names the problem)."""
    path = Path(config)
    if not path.is_file():
        for d in dialects():
            if config == d.name:
                return d, {}
        return None
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    dialect = detect_dialect(doc)
    return (dialect, doc) if dialect is not None else None


def resolve_config(config: str, overrides: Sequence[str]) -> tuple[str, list[str], Translation | None]:
    """What ``load_config`` reads for a command line's CONFIG and overrides: for a foreign config, the
    translation written as one of ours (a YAML file in a temporary directory) and our overrides; for ours, as
    given (Hydra's ``+``/``++`` dropped)."""
    foreign = read_foreign(config)
    if foreign is None:
        return config, [o.lstrip("+") for o in overrides], None
    dialect, doc = foreign
    mine, ours = split_overrides(dialect, overrides)
    translation = translate(dialect, doc, mine, config)
    directory = Path(tempfile.mkdtemp(prefix=f"slurm-rl-{dialect.name}-"))
    target = directory / "translated.yaml"
    header = f"# {dialect.title} config {config} translated by slurm_rl.dialects\n"
    target.write_text(header + yaml.safe_dump(translation.ours, sort_keys=False))
    return str(target), ours, translation
