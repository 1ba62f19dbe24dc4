"""The group file of a co-execution group: jobs sharing a rollout pool and a training pool.

```yaml
group:
  dir: runs/mux-${now:%Y%m%d-%H%M%S}   # group directory: control/ (grants), jobs/<name>/ (run dirs)
  pools: {rollout: 0-3, train: 4-7}      # accelerator slots of the allocation, disjoint
  tail_fraction: 0.8                     # long-tail migration once this share of responses is done (1: off)
  tail_slots: 1                          # rollout slots the tail keeps
  poll_interval_s: 0.02
  timeout_s: 3600                        # the whole group (launcher)
  park_s: 0.0                            # emulated jobs: seconds of one warm switch (park or resume)
  host_memory_gb: null                   # per node: parked state must fit (admission); null: unchecked
  gpus_per_node: 8                       # slots per node
  schedule: round_robin                  # or work_conserving: a pool serves the next ready job
jobs:                                    # round-robin order = this order
  a: {config: a.yaml, slo: 1.5, max_response_length: 1024, overrides: [train.num_iterations=3]}
  b: {config: b.yaml, slo: 2.0}
```

Each job is an ordinary run config (placement over its own ranks 0..W-1, ``scheduler.policy:
static``). Its rollout ranks sit, in order, on the rollout pool's slots; its actor and inference
ranks on the training pool's slots. ``load_group`` validates everything (each job's config too)
and raises one :class:`ConfigError` listing every problem with its key path; nothing is created.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from omegaconf import OmegaConf

from slurm_rl.config import Config, ConfigError, ConfigIssue, load_config
from slurm_rl.control.grants import JOB_NAME_CHARS
from slurm_rl.mux.group_state import GROUP_JSON
from slurm_rl.placement import parse_slot_ranges

POOLS = ("rollout", "train")
GROUP_KEYS = ("dir", "pools", "tail_fraction", "tail_slots", "poll_interval_s", "timeout_s", "park_s",
              "host_memory_gb", "gpus_per_node", "schedule")
SCHEDULES = ("round_robin", "work_conserving")
JOB_KEYS = ("config", "slo", "max_response_length", "overrides")


@dataclass(frozen=True)
class GroupJob:
    """One member: its validated config and where its ranks sit."""

    name: str
    config_path: Path
    overrides: tuple[str, ...]
    slo: float
    max_response_length: int | None
    cfg: Config
    rank_slots: Mapping[int, tuple[str, int]]  # rank -> (pool, slot)

    def slots(self, pool: str) -> tuple[int, ...]:
        return tuple(sorted(s for p, s in self.rank_slots.values() if p == pool))


@dataclass(frozen=True)
class GroupSpec:
    """A validated group file."""

    source: Path
    dir: Path
    pools: Mapping[str, tuple[int, ...]]
    jobs: tuple[GroupJob, ...]
    tail_fraction: float = 0.8
    tail_slots: int = 1
    poll_interval_s: float = 0.02
    timeout_s: float = 3600.0
    park_s: float = 0.0
    host_memory_gb: float | None = None  # per node: residency limit of parked state (None: unchecked)
    gpus_per_node: int = 8  # slots per node (which node a slot's parked state lives on)
    schedule: str = "round_robin"  # rotation: round_robin (strict order) | work_conserving
    raw: Mapping[str, Any] = field(default_factory=dict)

    def job(self, name: str) -> GroupJob:
        return next(j for j in self.jobs if j.name == name)

    @property
    def slots(self) -> tuple[int, ...]:
        return tuple(sorted(s for p in POOLS for s in self.pools[p]))

    def to_json(self) -> dict[str, Any]:
        """The resolved group (``GROUP_DIR/group.json``): what the group scheduler and ranks read."""
        return {
            "dir": str(self.dir), "pools": {p: list(s) for p, s in self.pools.items()},
            "members": [j.name for j in self.jobs],  # the round-robin order (JSON objects are written sorted)
            "tail_fraction": self.tail_fraction, "tail_slots": self.tail_slots,
            "poll_interval_s": self.poll_interval_s, "timeout_s": self.timeout_s, "park_s": self.park_s,
            "gpus_per_node": self.gpus_per_node, "host_memory_gb": self.host_memory_gb,
            "schedule": self.schedule, "jobs": {j.name: job_json(j) for j in self.jobs},
        }


def job_json(j: GroupJob) -> dict[str, Any]:
    """One member's entry of ``group.json``'s ``jobs`` (what the scheduler and its ranks read)."""
    return {"slo": j.slo, "max_response_length": j.max_response_length, "iterations": j.cfg.train.num_iterations,
            "samples": j.cfg.train.rollout_batch_size * j.cfg.train.group_size,
            "world_size": j.cfg.placement.world_size, "device": j.cfg.runtime.device,
            "slot_capacity": j.cfg.scheduler.max_running_requests * j.cfg.scheduler.rollout_ranks_per_instance,
            "rank_slots": {str(r): list(ps) for r, ps in j.rank_slots.items()}}


def spec_from_json(group_dir: Path, group: Mapping[str, Any], members: Sequence[str]) -> GroupSpec:
    """The group as it runs (``group.json`` as :func:`~slurm_rl.mux.group_state.read_group_json` reads it), as a
    :class:`GroupSpec` of ``members`` (each from its RUN_DIR's config): the inverse of :meth:`GroupSpec.to_json`."""
    jobs = []
    for name in members:
        doc = group["jobs"][name]
        path = Path(doc["run_dir"]) / "config.yaml"
        slots = {int(r): (ps[0], int(ps[1])) for r, ps in doc["rank_slots"].items()}
        jobs.append(GroupJob(name, path, (), float(doc["slo"]), doc.get("max_response_length"), load_config(path),
                             slots))
    return GroupSpec(source=Path(group_dir) / GROUP_JSON, dir=Path(group_dir),
                     pools={p: tuple(group["pools"][p]) for p in POOLS}, jobs=tuple(jobs),
                     tail_fraction=float(group["tail_fraction"]), tail_slots=int(group["tail_slots"]),
                     poll_interval_s=float(group["poll_interval_s"]), timeout_s=float(group["timeout_s"]),
                     park_s=float(group["park_s"]), host_memory_gb=group.get("host_memory_gb"),
                     gpus_per_node=int(group["gpus_per_node"]), schedule=group.get("schedule", "round_robin"))


def _slots(text: Any, key: str, issues: list[ConfigIssue]) -> tuple[int, ...]:
    """A pool's slots from ``'0-3'`` / ``'0-1,4-5'`` (placement.py's range parser) or one int."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return (text,)
    slots = parse_slot_ranges(text) if isinstance(text, str) else None
    if not slots:
        issues.append(ConfigIssue(key, text, "slot ranges in ascending order such as '0-3' or '0-1,4-5'"))
        return ()
    return tuple(slots)


def _number(value: Any, key: str, issues: list[ConfigIssue], lo: float, hi: float | None, what: str,
            integer: bool = False) -> Any:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (not integer or isinstance(value, int))
    if not ok or value < lo or (hi is not None and value > hi):
        issues.append(ConfigIssue(key, value, what))
        return None
    return value


def _unknown(doc: Mapping[str, Any], prefix: str, allowed: Sequence[str], issues: list[ConfigIssue]) -> None:
    for key in doc:
        if key not in allowed:
            issues.append(ConfigIssue(f"{prefix}{key}", doc[key], f"a known key ({', '.join(allowed)})"))


def _place(name: str, cfg: Config, config_path: Path, pools: Mapping[str, tuple[int, ...]],
           issues: list[ConfigIssue]) -> dict[int, tuple[str, int]]:
    """Rollout ranks -> rollout slots, actor/inference ranks -> train slots, in order."""
    key = f"jobs.{name}.config"
    comps = {c: set(p.ranks) for c, p in cfg.placement.components.items()}
    rollout = sorted(comps.get("rollout", set()))
    train = sorted(comps.get("actor", set()) | comps.get("inference", set()))
    both = sorted(set(rollout) & set(train))
    idle = sorted(set(range(cfg.placement.world_size)) - set(rollout) - set(train))
    problems = []
    if not rollout or "actor" not in comps:
        problems.append("a rollout and an actor component")
    if both:
        problems.append(f"rollout ranks disjoint from actor/inference ranks (ranks {both} serve both: "
                        "a group's pools are disaggregated)")
    if idle:
        problems.append(f"every rank in rollout or actor/inference (ranks {idle} are idle)")
    if len(rollout) > len(pools["rollout"]):
        problems.append(f"at most {len(pools['rollout'])} rollout ranks (group.pools.rollout), got {len(rollout)}")
    if len(train) > len(pools["train"]):
        problems.append(f"at most {len(pools['train'])} actor/inference ranks (group.pools.train), got {len(train)}")
    if cfg.scheduler.policy != "static":
        problems.append(f"scheduler.policy static (got {cfg.scheduler.policy!r}): the group decides when a job runs")
    for p in problems:
        issues.append(ConfigIssue(key, str(config_path), p))
    if problems:
        return {}
    out = {r: ("rollout", pools["rollout"][i]) for i, r in enumerate(rollout)}
    out.update({r: ("train", pools["train"][i]) for i, r in enumerate(train)})
    return out


def load_group(path: str | Path, overrides: Sequence[str] = ()) -> GroupSpec:
    """Read, resolve and validate a group file (and every job's config); ``ConfigError`` lists all."""
    source = Path(path)
    issues: list[ConfigIssue] = []
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([ConfigIssue("group file", str(source), f"a readable YAML file ({exc.strerror})")]) from None
    try:
        root = OmegaConf.create(text)
        for item in overrides:
            k, _, v = item.partition("=")
            OmegaConf.update(root, k.strip(), yaml.safe_load(v) if v else v, force_add=True)
        from slurm_rl.config import _register_resolvers  # the ${now:...} resolver of run configs

        _register_resolvers()
        doc = OmegaConf.to_container(root, resolve=True)
    except Exception as exc:  # YAML or interpolation error: name the file
        raise ConfigError([ConfigIssue(str(source), type(exc).__name__, f"valid YAML ({exc})")]) from None
    if not isinstance(doc, dict):
        raise ConfigError([ConfigIssue(str(source), doc, "a mapping with 'group' and 'jobs'")])
    _unknown(doc, "", ("group", "jobs"), issues)
    g = doc.get("group")
    if not isinstance(g, dict):
        issues.append(ConfigIssue("group", g, "a mapping (dir, pools, ...)"))
        g = {}
    _unknown(g, "group.", GROUP_KEYS, issues)
    pools_doc = g.get("pools")
    pools: dict[str, tuple[int, ...]] = {}
    if not isinstance(pools_doc, dict):
        issues.append(ConfigIssue("group.pools", pools_doc, "a mapping {rollout: slots, train: slots}"))
    else:
        _unknown(pools_doc, "group.pools.", POOLS, issues)
        for p in POOLS:
            if p not in pools_doc:
                issues.append(ConfigIssue(f"group.pools.{p}", None, "slot ranges such as '0-3' (required)"))
            else:
                pools[p] = _slots(pools_doc[p], f"group.pools.{p}", issues)
        if all(pools.get(p) for p in POOLS) and set(pools["rollout"]) & set(pools["train"]):
            issues.append(ConfigIssue("group.pools.train", pools_doc["train"],
                                      f"slots disjoint from group.pools.rollout ({pools_doc['rollout']})"))
    gdir = g.get("dir", "runs/mux")
    if not isinstance(gdir, str) or not gdir.strip():
        issues.append(ConfigIssue("group.dir", gdir, "a non-empty path"))
    tail_fraction = _number(g.get("tail_fraction", 0.8), "group.tail_fraction", issues, 0.05, 1.0,
                            "a number in [0.05, 1] (1 turns long-tail migration off)")
    tail_slots = _number(g.get("tail_slots", 1), "group.tail_slots", issues, 1, None, "a positive int", integer=True)
    if tail_slots is not None and pools.get("rollout") and tail_slots >= len(pools["rollout"]) and (tail_fraction or 1) < 1:
        issues.append(ConfigIssue("group.tail_slots", tail_slots,
                                  f"fewer than the rollout pool's {len(pools['rollout'])} slots"))
    poll = _number(g.get("poll_interval_s", 0.02), "group.poll_interval_s", issues, 1e-4, None, "a positive number")
    timeout = _number(g.get("timeout_s", 3600.0), "group.timeout_s", issues, 1e-3, None, "a positive number")
    park_s = _number(g.get("park_s", 0.0), "group.park_s", issues, 0.0, None, "a non-negative number")
    host_gb = g.get("host_memory_gb")
    if host_gb is not None:
        host_gb = _number(host_gb, "group.host_memory_gb", issues, 1e-9, None, "a positive number of GB (or null)")
    gpn = _number(g.get("gpus_per_node", 8), "group.gpus_per_node", issues, 1, None, "a positive int", integer=True)
    schedule = g.get("schedule", "round_robin")
    if schedule not in SCHEDULES:
        issues.append(ConfigIssue("group.schedule", schedule, " | ".join(SCHEDULES)))

    jobs_doc = doc.get("jobs")
    jobs: list[GroupJob] = []
    if not isinstance(jobs_doc, dict) or not jobs_doc:
        issues.append(ConfigIssue("jobs", jobs_doc, "a non-empty mapping name -> {config, slo, ...}"))
        jobs_doc = {}
    for name, spec in jobs_doc.items():
        prefix = f"jobs.{name}"
        if not isinstance(name, str) or not name or not set(name) <= JOB_NAME_CHARS:
            issues.append(ConfigIssue(prefix, name, "a job name of lower-case letters, digits, '_' and '-'"))
            continue
        if not isinstance(spec, dict):
            issues.append(ConfigIssue(prefix, spec, "a mapping {config, slo, max_response_length, overrides}"))
            continue
        _unknown(spec, prefix + ".", JOB_KEYS, issues)
        slo = _number(spec.get("slo", 2.0), f"{prefix}.slo", issues, 1.0, None,
                      "a number >= 1 (tolerated slowdown versus running alone)")
        max_len = spec.get("max_response_length")
        if max_len is not None:
            max_len = _number(max_len, f"{prefix}.max_response_length", issues, 1, None, "a positive int", integer=True)
        ovr = spec.get("overrides", [])
        if not isinstance(ovr, list) or not all(isinstance(o, str) and "=" in o for o in ovr):
            issues.append(ConfigIssue(f"{prefix}.overrides", ovr, "a list of key=value strings"))
            ovr = []
        cpath = spec.get("config")
        if not isinstance(cpath, str):
            issues.append(ConfigIssue(f"{prefix}.config", cpath, "the path of a run config (relative to the group file)"))
            continue
        config_path = (source.parent / cpath).resolve()
        try:
            cfg = load_config(config_path, list(ovr))
        except ConfigError as err:
            issues.extend(ConfigIssue(f"{prefix}.config: {i.key}", i.value, i.allowed) for i in err.issues)
            continue
        if len(pools) != len(POOLS) or not all(pools.values()):
            continue
        rank_slots = _place(name, cfg, config_path, pools, issues)
        if rank_slots:
            jobs.append(GroupJob(name, config_path, tuple(ovr), float(slo or 1.0), max_len, cfg, rank_slots))
    devices = {j.cfg.runtime.device for j in jobs}
    if len(devices) > 1:
        issues.append(ConfigIssue("jobs", sorted(devices), "one runtime.device for every job of a group"))
    if issues:
        raise ConfigError(issues)
    return GroupSpec(source=source, dir=Path(gdir).absolute(), pools=pools, jobs=tuple(jobs),
                     tail_fraction=float(tail_fraction), tail_slots=int(tail_slots), poll_interval_s=float(poll),
                     timeout_s=float(timeout), park_s=float(park_s),
                     host_memory_gb=None if host_gb is None else float(host_gb), gpus_per_node=int(gpn),
                     schedule=str(schedule), raw=doc)
