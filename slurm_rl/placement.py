"""RLinf ``component_placement`` parsing and the immutable :class:`Placement` it yields.

A placement maps components (actor, rollout, inference) onto global process ranks of the
allocation. The world is fixed for the allocation: every accelerator slot hosts at least one
process (an idle rank when no component uses it), and a slot hosts ``k`` processes when an entry
of the form ``"resources:processes"`` puts ``k`` processes on it. Ranks are numbered slot-major.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

COMPONENTS: tuple[str, ...] = ("actor", "rollout", "inference")
"""Known components, in pipeline order (also the order the auto scheduler requires)."""

REQUIRED_COMPONENTS: tuple[str, ...] = ("actor", "rollout")
"""Components every placement must place."""

PLACEMENT_FORMS = (
    "a range 'a-b' with a <= b, a comma list of ranges, 'all', or 'resources:processes'"
)
_ENTRY_KEYS = ("node_group", "placement")
_RANGE_RE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


class _Missing:
    """Marker for a value that is absent from the configuration."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING_VALUE: Any = _Missing()


@dataclass(frozen=True)
class ConfigIssue:
    """One configuration problem: the key path, the offending value and what is allowed."""

    key: str
    value: Any
    allowed: str

    def __str__(self) -> str:
        return f"{self.key}: got {self.value!r}; allowed: {self.allowed}"


class ConfigError(ValueError):
    """Invalid configuration; ``issues`` lists every problem found, one per line in ``str()``."""

    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        self.issues: list[ConfigIssue] = list(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (tuple(self.issues),))


class FrozenDict(dict):  # type: ignore[type-arg]
    """A dict that refuses mutation; copies, pickles and ``dataclasses.asdict`` still work."""

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("placement components are read-only")

    __setitem__ = __delitem__ = __ior__ = _read_only  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))


@dataclass(frozen=True)
class ComponentPlacement:
    """Where one component runs.

    ``ranks`` are global process ranks in the component's own process order (process ``j`` of
    the component is ``ranks[j]``); ``slots`` are the distinct accelerator slots it occupies,
    sorted. ``shared_with`` names the components collocated with it (same ranks).
    """

    name: str
    ranks: tuple[int, ...]
    slots: tuple[int, ...]
    node_group: str | None = None
    shared_with: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """Immutable assignment of components to the global ranks of a fixed world."""

    num_slots: int
    world_size: int
    components: Mapping[str, ComponentPlacement]
    slot_of_rank: tuple[int, ...]
    num_nodes: int = 1
    _roles: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = {n: self.components[n] for n in COMPONENTS if n in self.components}
        object.__setattr__(self, "components", FrozenDict(ordered))
        roles: list[list[str]] = [[] for _ in range(self.world_size)]
        for name, comp in ordered.items():
            for rank in comp.ranks:
                roles[rank].append(name)
        object.__setattr__(self, "_roles", tuple(tuple(r) for r in roles))

    def roles_of(self, rank: int) -> tuple[str, ...]:
        """Components that include ``rank``, in :data:`COMPONENTS` order; ``()`` means idle."""
        if not 0 <= rank < self.world_size:
            raise IndexError(f"rank {rank} is outside the world of {self.world_size} ranks")
        return self._roles[rank]

    def ranks_on_slot(self, slot: int) -> tuple[int, ...]:
        """Global ranks hosted by accelerator slot ``slot``."""
        return tuple(r for r, s in enumerate(self.slot_of_rank) if s == slot)

    def node_of_slot(self, slot: int) -> int:
        """Node index of accelerator slot ``slot`` (slots are numbered node-major)."""
        return slot // (self.num_slots // self.num_nodes)

    def node_of_rank(self, rank: int) -> int:
        """Node index hosting global rank ``rank``."""
        return self.node_of_slot(self.slot_of_rank[rank])

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict: world size, slot of every rank and each component's ranks/slots."""
        comps: dict[str, Any] = {}
        for name, comp in self.components.items():
            entry: dict[str, Any] = {"ranks": list(comp.ranks), "slots": list(comp.slots)}
            if comp.node_group is not None:
                entry["node_group"] = comp.node_group
            if comp.shared_with:
                entry["shared_with"] = list(comp.shared_with)
            comps[name] = entry
        return {
            "world_size": self.world_size,
            "num_slots": self.num_slots,
            "num_nodes": self.num_nodes,
            "slot_of_rank": list(self.slot_of_rank),
            "components": comps,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], key: str = "placement") -> Placement:
        """Inverse of :meth:`to_json`; validates the data and raises :class:`ConfigError`."""
        issues: list[ConfigIssue] = []
        world = data.get("world_size") if isinstance(data, Mapping) else None
        if not _is_int(world) or world < 1:
            raise ConfigError([ConfigIssue(f"{key}.world_size", world, "a positive int")])
        slot_of_rank = data.get("slot_of_rank", list(range(world)))
        if (
            not isinstance(slot_of_rank, list)
            or len(slot_of_rank) != world
            or not all(_is_int(s) and s >= 0 for s in slot_of_rank)
            or list(slot_of_rank) != sorted(slot_of_rank)
        ):
            raise ConfigError([ConfigIssue(
                f"{key}.slot_of_rank", slot_of_rank,
                f"a non-decreasing list of {world} non-negative slot indices")])
        num_slots = data.get("num_slots", max(slot_of_rank) + 1)
        num_nodes = data.get("num_nodes", 1)
        if not _is_int(num_slots) or num_slots <= max(slot_of_rank):
            issues.append(ConfigIssue(f"{key}.num_slots", num_slots, "an int above every slot index"))
        if not _is_int(num_nodes) or num_nodes < 1 or (_is_int(num_slots) and num_slots % num_nodes):
            issues.append(ConfigIssue(f"{key}.num_nodes", num_nodes, "a positive int dividing num_slots"))
        comps_raw = data.get("components")
        if not isinstance(comps_raw, Mapping):
            issues.append(ConfigIssue(f"{key}.components", comps_raw, "a mapping of component to ranks"))
        if issues:
            raise ConfigError(issues)
        base = cls(num_slots, world, {}, tuple(slot_of_rank), num_nodes)
        ranks = {n: (v.get("ranks") if isinstance(v, Mapping) else v) for n, v in comps_raw.items()}
        shared = {
            n: tuple(v.get("shared_with", ())) for n, v in comps_raw.items() if isinstance(v, Mapping)
        }
        groups = {n: v.get("node_group") for n, v in comps_raw.items() if isinstance(v, Mapping)}
        return _build_from_ranks(ranks, base, key, shared, groups)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_range(text: str, num_slots: int | None) -> list[int] | None:
    """``"a-b"``, ``"a"`` (or ``"all"`` when ``num_slots`` is given) -> list; None if malformed."""
    if num_slots is not None and text.strip() == "all":
        return list(range(num_slots))
    m = _RANGE_RE.match(text)
    if m is None:
        return None
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) is not None else lo
    return list(range(lo, hi + 1)) if lo <= hi else None


def _parse_spec(spec: str, num_slots: int, where: str) -> tuple[list[int], list[str]]:
    """Parse one placement string into the slot of each process (process-rank order).

    Returns ``(slots_by_process, problems)``; each problem is an "allowed" text.
    """
    if not spec.strip():
        return [], [PLACEMENT_FORMS]
    slots: list[int] = []
    problems: list[str] = []
    used: set[int] = set()
    for segment in spec.split(","):
        res_text, sep, proc_text = segment.partition(":")
        resources = _parse_range(res_text, num_slots)
        if resources is None:
            return [], [PLACEMENT_FORMS]
        repeated = used.intersection(resources)
        if repeated:
            return [], [f"each slot at most once per entry (slot {min(repeated)} is listed twice)"]
        used.update(resources)
        if sep:
            procs = _parse_range(proc_text, None)
            if procs is None:
                return [], [PLACEMENT_FORMS]
            if procs[0] != len(slots):
                return [], [
                    "process ranks contiguous from 0 across the segments of one entry "
                    f"(segment {segment.strip()!r} starts at process {procs[0]}, expected {len(slots)})"]
            if len(procs) % len(resources):
                return [], [
                    "processes spread evenly over the resources of their segment "
                    f"({segment.strip()!r} puts {len(procs)} processes on {len(resources)} resources; "
                    "use a multiple of the resource count)"]
            per = len(procs) // len(resources)
            slots.extend(r for r in resources for _ in range(per))
        else:
            slots.extend(resources)
    bad = sorted(s for s in used if s >= num_slots)
    if bad:
        problems.append(f"slots 0-{num_slots - 1} ({where}); slot {bad[0]} is outside the allocation")
    return slots, problems


@dataclass
class _Entry:
    key: str
    names: tuple[str, ...]
    spec: Any
    node_group: str | None
    slots: list[int]


def _unwrap_entry(
    entry_key: str, value: Any, issues: list[ConfigIssue]
) -> tuple[Any, str | None, str | None]:
    """Return ``(original spec, spec text or None, node_group)`` for one entry value."""
    node_group: str | None = None
    spec = value
    if isinstance(value, Mapping):
        extra = sorted(str(k) for k in value if k not in _ENTRY_KEYS)
        if extra:
            issues.append(ConfigIssue(f"{entry_key}.{extra[0]}", value[extra[0]],
                                      "only the keys node_group and placement"))
        group = value.get("node_group")
        if group is not None and not isinstance(group, str):
            issues.append(ConfigIssue(f"{entry_key}.node_group", group, "a node group label (str)"))
        node_group = None if group is None else str(group)
        if "placement" not in value:
            issues.append(ConfigIssue(f"{entry_key}.placement", MISSING_VALUE, PLACEMENT_FORMS))
            return value, None, node_group
        spec = value["placement"]
        entry_key = f"{entry_key}.placement"
    if _is_int(spec) and spec >= 0:
        return spec, str(spec), node_group
    if isinstance(spec, str):
        return spec, spec, node_group
    issues.append(ConfigIssue(entry_key, spec, PLACEMENT_FORMS))
    return spec, None, node_group


def parse_placement(
    raw: Mapping[str, Any],
    num_slots: int,
    key: str = "cluster.component_placement",
    auto_scheduler: bool = False,
    num_nodes: int = 1,
    world: Placement | None = None,
) -> Placement:
    """Parse an RLinf ``component_placement`` mapping over ``num_slots`` accelerator slots.

    With ``world`` given, the processes per slot of that placement define the (fixed) world and
    the new placement must fit in it; otherwise the world is derived from ``raw``. Raises
    :class:`ConfigError` listing every problem.
    """
    issues: list[ConfigIssue] = []
    where = f"num_nodes*gpus_per_node = {num_slots}"
    if not isinstance(raw, Mapping):
        raise ConfigError([ConfigIssue(key, raw, "a mapping of component names to placements")])
    entries: list[_Entry] = []
    placed_by: dict[str, str] = {}
    for raw_key, value in raw.items():
        entry_key = f"{key}.{raw_key}"
        names = tuple(n.strip() for n in str(raw_key).split(","))
        ok_names = True
        for name in names:
            if name not in COMPONENTS:
                ok_names = False
                issues.append(ConfigIssue(entry_key, name, "component names among "
                                          f"{', '.join(COMPONENTS)} (comma-separated to share one entry)"))
            elif name in placed_by:
                ok_names = False
                issues.append(ConfigIssue(entry_key, name, "each component in one entry only "
                                          f"({name!r} is already placed by {placed_by[name]!r})"))
            else:
                placed_by[name] = str(raw_key)
        spec, text, group = _unwrap_entry(entry_key, value, issues)
        if text is None:
            continue
        slots, problems = _parse_spec(text, num_slots, where)
        for problem in problems:
            issues.append(ConfigIssue(entry_key, spec, problem))
        if not problems and ok_names:
            entries.append(_Entry(entry_key, names, spec, group, slots))
    for name in REQUIRED_COMPONENTS:
        if name not in placed_by:
            issues.append(ConfigIssue(f"{key}.{name}", MISSING_VALUE,
                                      f"a placement for each of {', '.join(REQUIRED_COMPONENTS)} "
                                      "(inference is optional)"))
    owner: dict[int, _Entry] = {}
    for entry in entries:
        clash = sorted({s for s in entry.slots if s in owner and owner[s] is not entry})
        if clash:
            other = owner[clash[0]]
            issues.append(ConfigIssue(entry.key, entry.spec, (
                f"slots not used by another entry (slot {clash[0]} is also used by "
                f"{','.join(other.names)!r}); components sharing slots must be declared together, "
                "e.g. 'actor,inference: 0-7'")))
        for s in entry.slots:
            owner.setdefault(s, entry)
    if auto_scheduler:
        issues.extend(_check_auto_order(entries))
    if issues:
        raise ConfigError(issues)
    return _assign_ranks(entries, num_slots, num_nodes, world, issues)


def _check_auto_order(entries: Sequence[_Entry]) -> list[ConfigIssue]:
    """RLinf auto-scheduler rule: contiguous blocks in the order actor -> rollout -> inference."""
    allowed = ("with cluster.auto_scheduler=true, each component on one contiguous block of slots, "
               "blocks in the order actor -> rollout -> inference")
    issues: list[ConfigIssue] = []
    blocks: list[tuple[int, _Entry]] = []
    for entry in entries:
        distinct = sorted(set(entry.slots))
        if distinct != list(range(distinct[0], distinct[-1] + 1)):
            issues.append(ConfigIssue(entry.key, entry.spec, allowed))
        blocks.append((min(COMPONENTS.index(n) for n in entry.names), entry))
    blocks.sort(key=lambda b: b[0])
    for (_, first), (_, second) in zip(blocks, blocks[1:]):
        if max(first.slots) >= min(second.slots):
            issues.append(ConfigIssue(second.key, second.spec, allowed))
    return issues


def _assign_ranks(
    entries: Sequence[_Entry], num_slots: int, num_nodes: int, world: Placement | None,
    issues: list[ConfigIssue],
) -> Placement:
    """Number ranks slot-major and build the :class:`Placement`."""
    need = [1] * num_slots
    for entry in entries:
        for s in set(entry.slots):
            need[s] = max(need[s], entry.slots.count(s))
    if world is not None:
        have = [0] * world.num_slots
        for s in world.slot_of_rank:
            have[s] += 1
        for entry in entries:
            over = [s for s in sorted(set(entry.slots)) if entry.slots.count(s) > have[s]]
            if over:
                issues.append(ConfigIssue(entry.key, entry.spec, (
                    f"at most {have[over[0]]} process(es) on slot {over[0]}: the world is fixed by the "
                    "initial placement")))
        if issues:
            raise ConfigError(issues)
        need = have
    offsets = [0] * num_slots
    for s in range(1, num_slots):
        offsets[s] = offsets[s - 1] + need[s - 1]
    slot_of_rank = tuple(s for s in range(num_slots) for _ in range(need[s]))
    comps: dict[str, ComponentPlacement] = {}
    for entry in entries:
        local = [0] * num_slots
        ranks: list[int] = []
        for s in entry.slots:
            ranks.append(offsets[s] + local[s])
            local[s] += 1
        for name in entry.names:
            comps[name] = ComponentPlacement(
                name=name, ranks=tuple(ranks), slots=tuple(sorted(set(entry.slots))),
                node_group=entry.node_group,
                shared_with=tuple(n for n in COMPONENTS if n in entry.names and n != name))
    return Placement(num_slots, len(slot_of_rank), comps, slot_of_rank, num_nodes)


def _build_from_ranks(
    components: Mapping[str, Any],
    base: Placement,
    key: str,
    shared: Mapping[str, Sequence[str]] | None = None,
    groups: Mapping[str, Any] | None = None,
) -> Placement:
    issues: list[ConfigIssue] = []
    clean: dict[str, tuple[int, ...]] = {}
    for name, ranks in components.items():
        ckey = f"{key}.{name}"
        if name not in COMPONENTS:
            issues.append(ConfigIssue(ckey, name, f"component names among {', '.join(COMPONENTS)}"))
            continue
        if (
            isinstance(ranks, (str, bytes)) or not isinstance(ranks, Sequence) or not ranks
            or not all(_is_int(r) and 0 <= r < base.world_size for r in ranks)
            or len(set(ranks)) != len(ranks)
        ):
            issues.append(ConfigIssue(ckey, ranks if isinstance(ranks, (str, int)) else list(ranks or []),
                                      f"a non-empty list of distinct ranks in 0-{base.world_size - 1}"))
            continue
        clean[name] = tuple(ranks)
    allowed_pairs = {(n, o) for n, c in base.components.items() for o in c.shared_with}
    for n, m in (shared or {}).items():
        allowed_pairs.update((n, o) for o in m)
    names = [n for n in COMPONENTS if n in clean]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = set(clean[a]) & set(clean[b])
            if common and (a, b) not in allowed_pairs and (b, a) not in allowed_pairs:
                issues.append(ConfigIssue(f"{key}.{b}", list(clean[b]), (
                    f"ranks not used by {a!r} (rank {min(common)} is in both); only collocated "
                    "components may share ranks")))
    if issues:
        raise ConfigError(issues)
    comps: dict[str, ComponentPlacement] = {}
    for name in names:
        mates = tuple(o for o in names if o != name and set(clean[o]) & set(clean[name]))
        group = (groups or {}).get(name)
        if group is None and name in base.components:
            group = base.components[name].node_group
        comps[name] = ComponentPlacement(
            name=name, ranks=clean[name],
            slots=tuple(sorted({base.slot_of_rank[r] for r in clean[name]})),
            node_group=None if group is None else str(group), shared_with=mates)
    return Placement(base.num_slots, base.world_size, comps, base.slot_of_rank, base.num_nodes)


def placement_from_ranks(
    components: Mapping[str, Sequence[int]], base: Placement, key: str = "placement"
) -> Placement:
    """New placement over ``base``'s world with component ranks given directly.

    Validates component names, that rank lists are non-empty, distinct and inside the world, and
    that only components collocated in ``base`` share ranks. Raises :class:`ConfigError`.
    """
    return _build_from_ranks(components, base, key)
