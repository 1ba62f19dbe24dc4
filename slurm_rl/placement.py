"""RLinf ``component_placement`` parsing and the immutable :class:`Placement` it yields.

A placement maps components (actor, rollout, inference) onto global process ranks of the
allocation. The world is fixed for the allocation: every accelerator slot hosts at least one
process (an idle rank when no component uses it), and a slot hosts ``k`` processes when an entry
of the form ``"resources:processes"`` puts ``k`` processes on it; with fewer processes than
resources (``"0-3:0-1"``) one process owns several slots. Ranks are numbered in the order of
their (first) slot. Slots are numbered node-major; nodes may hold different numbers of slots
(node groups), and a ``{node_group, placement}`` entry numbers the slots of its group's nodes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_rl.errors import InputError

COMPONENTS: tuple[str, ...] = ("actor", "rollout", "inference")
"""Known components, in pipeline order (also the order the auto scheduler requires)."""

REQUIRED_COMPONENTS: tuple[str, ...] = ("actor", "rollout")
"""Components every placement must place."""

WITH_ACTOR: tuple[str, ...] = ("critic",)
"""Components that train on the actor's ranks and move with them (named in the actor's entry,
RLinf's ``actor,critic,...``); they are not components of an epoch."""

WITH_ROLLOUT: tuple[str, ...] = ("reward",)
"""Components that run beside every rollout rank (rule-based rewards in CPU worker processes of each
rollout rank): an entry naming them must cover the rollout's slots (RLinf's ``actor,rollout,reward: all``,
``reward: all``); they are not components of an epoch either."""

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


class ConfigError(InputError):
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
    slots_of_rank: tuple[tuple[int, ...], ...] | None = None
    """Every slot each rank owns (default: its one slot); ``slot_of_rank`` is the first of them."""
    slots_per_node: tuple[int, ...] | None = None
    """Slots of each node (default: ``num_slots / num_nodes`` each)."""
    reward_ranks: tuple[int, ...] = ()
    """Where the reward is placed apart from the rollout (its entries leave rollout slots uncovered, e.g.
    ``reward: 6-7``): the ranks whose worker processes score every response, between the rollout and the
    inference (a rewards stage); empty when the rewards run beside every rollout rank, or none is placed."""
    critic_ranks: tuple[int, ...] = ()
    """PPO's critic on ranks of its own (an entry ``critic: 4-5``): idle ranks in every epoch that train
    the critic only; empty when the critic trains on the actor's ranks (``actor,critic``) or there is none."""
    _roles: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.slots_of_rank is None:
            object.__setattr__(self, "slots_of_rank", tuple((s,) for s in self.slot_of_rank))
        if self.slots_per_node is None:
            per = self.num_slots // self.num_nodes
            object.__setattr__(self, "slots_per_node", (per,) * self.num_nodes)
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

    @property
    def mode(self) -> str:
        """RLinf's names: ``disaggregated`` (no rank serves two components), ``collocated`` (every rank
        in use serves every component), else ``hybrid``."""
        used = [r for r in self._roles if r]
        if all(len(r) == 1 for r in used):
            return "disaggregated"
        return "collocated" if all(len(r) == len(self.components) for r in used) else "hybrid"

    def ranks_by_roles(self) -> dict[tuple[str, ...], list[int]]:
        """The ranks serving each combination of components (``()``: idle ranks), in rank order."""
        out: dict[tuple[str, ...], list[int]] = {}
        for rank, roles in enumerate(self._roles):
            out.setdefault(roles, []).append(rank)
        return out

    def ranks_on_slot(self, slot: int) -> tuple[int, ...]:
        """Global ranks that own accelerator slot ``slot``."""
        return tuple(r for r, slots in enumerate(self.slots_of_rank) if slot in slots)

    def node_of_slot(self, slot: int) -> int:
        """Node index of accelerator slot ``slot`` (slots are numbered node-major)."""
        end = 0
        for node, count in enumerate(self.slots_per_node):
            end += count
            if slot < end:
                return node
        raise IndexError(f"slot {slot} is outside the {self.num_slots} slots of the allocation")

    def ranks_per_node(self) -> tuple[int, ...]:
        """How many ranks each node hosts (srun / submitit start that many tasks there)."""
        counts = [0] * self.num_nodes
        for slot in self.slot_of_rank:
            counts[self.node_of_slot(slot)] += 1
        return tuple(counts)

    def first_slot_of_node(self, node: int) -> int:
        """Global index of node ``node``'s first slot (its local accelerator 0)."""
        return sum(self.slots_per_node[:node])

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
            "slots_per_node": list(self.slots_per_node),
            "slot_of_rank": list(self.slot_of_rank),
            "slots_of_rank": [list(slots) for slots in self.slots_of_rank],
            "components": comps,
            **({"critic_ranks": list(self.critic_ranks)} if self.critic_ranks else {}),
            **({"reward_ranks": list(self.reward_ranks)} if self.reward_ranks else {}),
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
        per_node = data.get("slots_per_node")
        slots_of = data.get("slots_of_rank")
        if not _is_int(num_slots) or num_slots <= max(slot_of_rank):
            issues.append(ConfigIssue(f"{key}.num_slots", num_slots, "an int above every slot index"))
        if not _is_int(num_nodes) or num_nodes < 1 or (
                per_node is None and _is_int(num_slots) and num_slots % num_nodes):
            issues.append(ConfigIssue(f"{key}.num_nodes", num_nodes, "a positive int dividing num_slots"))
        if per_node is not None and (
            not isinstance(per_node, list) or not all(_is_int(n) and n >= 1 for n in per_node)
            or len(per_node) != num_nodes or sum(per_node) != num_slots
        ):
            issues.append(ConfigIssue(f"{key}.slots_per_node", per_node,
                                      "a list of num_nodes positive ints summing to num_slots"))
        if slots_of is not None and (
            not isinstance(slots_of, list) or len(slots_of) != world
            or not all(isinstance(g, list) and g and all(_is_int(x) and x >= 0 for x in g)
                       and g[0] == s for g, s in zip(slots_of, slot_of_rank))
        ):
            issues.append(ConfigIssue(f"{key}.slots_of_rank", slots_of,
                                      f"a list of {world} non-empty slot lists, each starting with slot_of_rank"))
        comps_raw = data.get("components")
        if not isinstance(comps_raw, Mapping):
            issues.append(ConfigIssue(f"{key}.components", comps_raw, "a mapping of component to ranks"))
        if issues:
            raise ConfigError(issues)
        base = cls(num_slots, world, {}, tuple(slot_of_rank), num_nodes,
                   None if slots_of is None else tuple(tuple(g) for g in slots_of),
                   None if per_node is None else tuple(per_node))
        ranks = {n: (v.get("ranks") if isinstance(v, Mapping) else v) for n, v in comps_raw.items()}
        shared = {
            n: tuple(v.get("shared_with", ())) for n, v in comps_raw.items() if isinstance(v, Mapping)
        }
        groups = {n: v.get("node_group") for n, v in comps_raw.items() if isinstance(v, Mapping)}
        built = _build_from_ranks(ranks, base, key, shared, groups)
        critic = data.get("critic_ranks", [])
        if not isinstance(critic, list) or not all(_is_int(r) and 0 <= r < world and not built.roles_of(r) for r in critic):
            raise ConfigError([ConfigIssue(f"{key}.critic_ranks", critic, "a list of idle ranks of the world")])
        reward = data.get("reward_ranks", [])
        if not isinstance(reward, list) or not all(_is_int(r) and 0 <= r < world for r in reward):
            raise ConfigError([ConfigIssue(f"{key}.reward_ranks", reward, "a list of ranks of the world")])
        return dataclasses.replace(built, critic_ranks=tuple(critic), reward_ranks=tuple(sorted(reward)))


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


def parse_slot_ranges(text: str) -> list[int] | None:
    """``"a-b,c,d-e"`` (ranges in ascending order, each slot once) -> the slots; None if malformed."""
    out: list[int] = []
    for part in text.split(","):
        slots = _parse_range(part, None)
        if slots is None or (out and slots[0] <= out[-1]):
            return None
        out.extend(slots)
    return out


def _parse_spec(
    spec: str, num_slots: int, where: str, scope: str = "the allocation"
) -> tuple[list[tuple[int, ...]], list[str]]:
    """Parse one placement string into the slots each process owns (process-rank order).

    Slots are indices ``0..num_slots-1`` of the numbering the entry uses (its node group's, or the
    allocation's). Returns ``(slots_by_process, problems)``; each problem is an "allowed" text.
    """
    if not spec.strip():
        return [], [PLACEMENT_FORMS]
    procs_slots: list[tuple[int, ...]] = []
    last = -1
    for segment in spec.split(","):
        res_text, sep, proc_text = segment.partition(":")
        resources = _parse_range(res_text, num_slots)
        if resources is None:
            return [], [PLACEMENT_FORMS]
        if resources[0] <= last:
            return [], [f"resource ranks in ascending order (segment {segment.strip()!r} starts at "
                        f"{resources[0]}, after {last})"]
        last = resources[-1]
        if not sep:
            procs_slots.extend((r,) for r in resources)
            continue
        procs = _parse_range(proc_text, None)
        if procs is None:
            return [], [PLACEMENT_FORMS]
        if procs[0] != len(procs_slots):
            return [], [
                "process ranks contiguous from 0 across the segments of one entry "
                f"(segment {segment.strip()!r} starts at process {procs[0]}, expected {len(procs_slots)})"]
        n_res, n_proc = len(resources), len(procs)
        if n_proc % n_res == 0:  # k processes on each resource
            procs_slots.extend((r,) for r in resources for _ in range(n_proc // n_res))
        elif n_res % n_proc == 0:  # each process owns k consecutive resources
            per = n_res // n_proc
            procs_slots.extend(tuple(resources[i:i + per]) for i in range(0, n_res, per))
        else:
            return [], [
                "processes spread evenly: one of the resource and process counts divides the other "
                f"({segment.strip()!r} puts {n_proc} processes on {n_res} resources)"]
    if last >= num_slots:
        return procs_slots, [f"slots 0-{num_slots - 1} ({where}); slot {last} is outside {scope}"]
    return procs_slots, []


@dataclass
class _Entry:
    key: str
    names: tuple[str, ...]
    spec: Any
    node_group: str | None
    procs: list[tuple[int, ...]]  # global slots of each process, in process order

    @property
    def slots(self) -> set[int]:
        return {s for p in self.procs for s in p}


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


def slot_numbering(
    num_nodes: int, slots_per_node: Sequence[int], node_groups: Mapping[str, Sequence[int]] | None = None
) -> dict[str, tuple[int, ...]]:
    """Global slots of each node group, in the group's own numbering (its nodes in order)."""
    first = [sum(slots_per_node[:n]) for n in range(num_nodes)]
    return {label: tuple(first[n] + i for n in nodes for i in range(slots_per_node[n]))
            for label, nodes in (node_groups or {}).items()}


def parse_placement(
    raw: Mapping[str, Any],
    num_slots: int,
    key: str = "cluster.component_placement",
    auto_scheduler: bool = False,
    num_nodes: int = 1,
    world: Placement | None = None,
    slots_per_node: Sequence[int] | None = None,
    node_groups: Mapping[str, Sequence[int]] | None = None,
) -> Placement:
    """Parse an RLinf ``component_placement`` mapping over ``num_slots`` accelerator slots.

    ``slots_per_node`` gives each node's slot count (default: equal shares); ``node_groups`` maps
    a group label to its nodes' indices: an entry ``{node_group: g, placement: "0"}`` numbers the
    slots of group ``g``'s nodes from 0. Without ``node_groups`` a label is only recorded (the
    group of all nodes). With ``world`` given, the processes of that placement define the (fixed)
    world and the new placement must fit in it; otherwise the world is derived from ``raw``.
    Raises :class:`ConfigError` listing every problem.
    """
    issues: list[ConfigIssue] = []
    per_node = tuple(slots_per_node) if slots_per_node is not None else (num_slots // num_nodes,) * num_nodes
    uniform = len(set(per_node)) == 1
    where = f"num_nodes*gpus_per_node = {num_slots}" if uniform else (
        f"{num_slots} slots on {num_nodes} nodes ({'+'.join(map(str, per_node))})")
    group_slots = slot_numbering(num_nodes, per_node, node_groups)
    node_of = [n for n, count in enumerate(per_node) for _ in range(count)]
    if not isinstance(raw, Mapping):
        raise ConfigError([ConfigIssue(key, raw, "a mapping of component names to placements")])
    entries: list[_Entry] = []
    placed_by: dict[str, str] = {}
    beside_rollout: list[_Entry] = []  # the entries naming the reward: together they cover the rollout's slots
    own_critic: _Entry | None = None  # 'critic: 4-5': ranks that train the critic only
    for raw_key, value in raw.items():
        entry_key = f"{key}.{raw_key}"
        names = tuple(n.strip() for n in str(raw_key).split(","))
        ok_names = True
        for name in names:
            if name in WITH_ROLLOUT:
                continue
            if name in WITH_ACTOR and "actor" not in names and names != (name,):
                ok_names = False
                issues.append(ConfigIssue(entry_key, name, (
                    f"{name!r} in the actor's entry (e.g. 'actor,{name}': it trains on the actor's ranks and "
                    f"moves with them) or alone on ranks of its own ('{name}: 4-5'); shared with "
                    f"{', '.join(n for n in names if n != name)} it is not supported")))
            elif name not in COMPONENTS + WITH_ACTOR:
                ok_names = False
                issues.append(ConfigIssue(entry_key, name, "component names among "
                                          f"{', '.join(COMPONENTS + WITH_ACTOR + WITH_ROLLOUT)} "
                                          "(comma-separated to share one entry)"))
            elif name in placed_by:
                ok_names = False
                issues.append(ConfigIssue(entry_key, name, "each component in one entry only "
                                          f"({name!r} is already placed by {placed_by[name]!r})"))
            else:
                placed_by[name] = str(raw_key)
        spec, text, group = _unwrap_entry(entry_key, value, issues)
        if text is None:
            continue
        numbering: Sequence[int] = range(num_slots)
        entry_where, scope = where, "the allocation"
        if group is not None and node_groups:
            if group not in group_slots:
                issues.append(ConfigIssue(f"{entry_key}.node_group", group, (
                    f"a node group defined in cluster.node_groups ({', '.join(sorted(group_slots))})")))
                continue
            numbering = group_slots[group]
            entry_where, scope = f"the {len(numbering)} slots of node group {group!r}", "the group"
        local, problems = _parse_spec(text, len(numbering), entry_where, scope)
        for problem in problems:
            issues.append(ConfigIssue(entry_key, spec, problem))
        if problems:
            continue
        procs = [tuple(numbering[s] for s in p) for p in local]
        split = next((p for p in procs if len({node_of[s] for s in p}) > 1), None)
        if split is not None:
            issues.append(ConfigIssue(entry_key, spec, (
                f"each process's slots on one node (a process would own slots {list(split)} on nodes "
                f"{sorted({node_of[s] for s in split})})")))
        elif ok_names:
            entry = _Entry(entry_key, tuple(n for n in names if n not in WITH_ACTOR + WITH_ROLLOUT), spec, group, procs)
            if set(names) & set(WITH_ROLLOUT):
                beside_rollout.append(entry)
            if entry.names:
                entries.append(entry)
            elif names == ("critic",):  # the critic on ranks of its own
                own_critic = _Entry(entry_key, names, spec, group, procs)
    for name in REQUIRED_COMPONENTS:
        if name not in placed_by:
            issues.append(ConfigIssue(f"{key}.{name}", MISSING_VALUE,
                                      f"a placement for each of {', '.join(REQUIRED_COMPONENTS)} "
                                      "(inference is optional)"))
    rollout_slots = {s for e in entries if "rollout" in e.names for s in e.slots}
    reward_slots = {s for e in beside_rollout for s in e.slots}
    # a reward that does not cover the rollout's slots runs apart: on the ranks of its slots (a rewards stage)
    apart = bool(beside_rollout) and not rollout_slots <= reward_slots
    used_slots = {s for e in entries for s in e.slots} | (own_critic.slots if own_critic else set())
    if apart and not reward_slots <= used_slots:
        first = beside_rollout[0]
        issues.append(ConfigIssue(first.key, first.spec, (
            f"slots of ranks that serve a component (the reward's worker processes run beside a rank: slots "
            f"{sorted(reward_slots - used_slots)} serve none); to score beside every rollout rank, cover the "
            "rollout's slots (e.g. 'rollout,reward' or 'reward: all')")))
    entries = _collocate(entries, issues)
    if own_critic is not None:
        clash = next((e for e in entries if e.slots & own_critic.slots), None)
        if clash is not None:
            issues.append(ConfigIssue(own_critic.key, own_critic.spec, (
                f"slots no other component uses (slot {min(clash.slots & own_critic.slots)} is also used by "
                f"{','.join(clash.names)!r}): a critic on ranks of its own serves nothing else; to share the "
                "actor's ranks name it in the actor's entry ('actor,critic')")))
    if auto_scheduler:
        issues.extend(_check_auto_order(entries, num_slots))
    if issues:
        raise ConfigError(issues)
    placement = _assign_ranks(entries + ([own_critic] if own_critic else []), num_slots, num_nodes, per_node, world,
                              issues)
    if not apart:
        return placement
    return dataclasses.replace(placement, reward_ranks=tuple(
        r for r, slots in enumerate(placement.slots_of_rank) if reward_slots & set(slots)))


def _collocate(entries: Sequence[_Entry], issues: list[ConfigIssue]) -> list[_Entry]:
    """Merge entries that place their components on identical slots with identical processes
    (RLinf's collocated mode in separate keys); report partial overlaps."""
    merged: list[_Entry] = []
    for entry in entries:
        same = next((m for m in merged if m.slots == entry.slots), None)
        if same is not None and same.procs == entry.procs:
            same.names = tuple(n for n in COMPONENTS if n in same.names + entry.names)
            continue
        if same is not None:
            issues.append(ConfigIssue(entry.key, entry.spec, (
                f"the same processes as {','.join(same.names)!r} on the same slots (collocated components "
                f"in separate entries must place the same processes; {same.spec!r} differs)")))
            continue
        clash = next((m for m in merged if m.slots & entry.slots), None)
        if clash is not None:
            slot = min(clash.slots & entry.slots)
            issues.append(ConfigIssue(entry.key, entry.spec, (
                f"slots not used by another entry, or exactly the same slots to collocate (slot {slot} is "
                f"also used by {','.join(clash.names)!r} with {clash.spec!r}); collocated components: "
                "'actor,rollout: 0-3', or 'actor: 0-3' and 'rollout: 0-3'")))
            continue
        merged.append(_Entry(entry.key, entry.names, entry.spec, entry.node_group, entry.procs))
    return merged


def _check_auto_order(entries: Sequence[_Entry], num_slots: int) -> list[ConfigIssue]:
    """RLinf auto-scheduler rules: contiguous blocks actor -> rollout -> inference that touch,
    the actor's starting at slot 0 and the last one ending at the last slot."""
    allowed = ("with cluster.auto_scheduler=true, each component on one contiguous block of slots, "
               "blocks in the order actor -> rollout -> inference, touching each other, "
               f"the actor's starting at slot 0 and the last ending at slot {num_slots - 1}")
    issues: list[ConfigIssue] = []
    blocks = sorted(entries, key=lambda e: min(COMPONENTS.index(n) for n in e.names))
    end = -1
    for entry in blocks:
        lo, hi = min(entry.slots), max(entry.slots)
        if len(entry.slots) != hi - lo + 1:
            issues.append(ConfigIssue(entry.key, entry.spec, f"{allowed} (slots {lo}-{hi} have a gap)"))
        elif lo != end + 1:
            why = "the actor starts at slot 0" if end < 0 else f"the previous block ends at slot {end}"
            issues.append(ConfigIssue(entry.key, entry.spec, f"{allowed} (starts at slot {lo}; {why})"))
        end = hi
    if blocks and not issues and end != num_slots - 1:
        issues.append(ConfigIssue(blocks[-1].key, blocks[-1].spec,
                                  f"{allowed} (ends at slot {end}, not at the last slot {num_slots - 1})"))
    return issues


def _assign_ranks(
    entries: Sequence[_Entry], num_slots: int, num_nodes: int, per_node: Sequence[int],
    world: Placement | None, issues: list[ConfigIssue],
) -> Placement:
    """Number ranks in the order of their (first) slot and build the :class:`Placement`.

    A process unit is the tuple of slots one process owns. Every slot belongs to one unit; a unit
    hosts as many processes as the entry placing the most there (one idle rank when none)."""
    if world is not None:
        units = list(world.slots_of_rank)
        for entry in entries:
            for unit in sorted(set(entry.procs)):
                need, have = entry.procs.count(unit), units.count(unit)
                if need > have:
                    where = f"slot {unit[0]}" if len(unit) == 1 else f"slots {list(unit)} (one process)"
                    issues.append(ConfigIssue(entry.key, entry.spec, (
                        f"at most {have} process(es) on {where}: the world is fixed by the initial placement")))
                    break
        if issues:
            raise ConfigError(issues)
    else:
        need: dict[tuple[int, ...], int] = {}
        for entry in entries:
            for unit in set(entry.procs):
                need[unit] = max(need.get(unit, 0), entry.procs.count(unit))
        covered = {s for unit in need for s in unit}
        need.update({(s,): 1 for s in range(num_slots) if s not in covered})
        units = [unit for unit in sorted(need) for _ in range(need[unit])]
    ranks_of_unit: dict[tuple[int, ...], list[int]] = {}
    for rank, unit in enumerate(units):
        ranks_of_unit.setdefault(unit, []).append(rank)
    comps: dict[str, ComponentPlacement] = {}
    for entry in entries:
        taken: dict[tuple[int, ...], int] = {}
        ranks: list[int] = []
        for unit in entry.procs:
            ranks.append(ranks_of_unit[unit][taken.get(unit, 0)])
            taken[unit] = taken.get(unit, 0) + 1
        for name in entry.names:
            comps[name] = ComponentPlacement(
                name=name, ranks=tuple(ranks), slots=tuple(sorted(entry.slots)),
                node_group=entry.node_group,
                shared_with=tuple(n for n in COMPONENTS if n in entry.names and n != name))
    critic = comps.pop("critic", None)  # ranks of its own: idle in every epoch
    return Placement(num_slots, len(units), comps, tuple(u[0] for u in units), num_nodes,
                     tuple(units), tuple(per_node), critic_ranks=critic.ranks if critic else ())



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
            slots=tuple(sorted({s for r in clean[name] for s in base.slots_of_rank[r]})),
            node_group=None if group is None else str(group), shared_with=mates)
    return Placement(base.num_slots, base.world_size, comps, base.slot_of_rank, base.num_nodes,
                     base.slots_of_rank, base.slots_per_node)


def placement_from_ranks(
    components: Mapping[str, Sequence[int]], base: Placement, key: str = "placement"
) -> Placement:
    """New placement over ``base``'s world with component ranks given directly.

    Validates component names, that rank lists are non-empty, distinct and inside the world, and
    that only components collocated in ``base`` share ranks. Raises :class:`ConfigError`.
    """
    return _build_from_ranks(components, base, key)
