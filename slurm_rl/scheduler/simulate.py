"""``slurm-rl simulate``: build a simulation from a run config and run it.

Config keys read (missing ones take ``scheduler.defaults``):
``cluster.{num_nodes, gpus_per_node, auto_scheduler, use_pre_process_policy,
use_wait_before_last_iter_policy, component_placement}``,
``train.{num_iterations, rollout_batch_size, group_size, global_batch_size, micro_batch_size}``,
``scheduler.{policy, script, max_running_requests, pre_process_threshold,
rollout_ranks_per_instance, actor_ranks_per_instance, switch_latency_s, tick_s, seed,
iteration_overhead_s}``,
``emulated.{rollout_s_per_token, inference_s_per_token, actor_s_per_token, response_len_mean,
response_len_max, response_len_dist, response_len_sigma, response_len_alpha, prompt_len,
scaling, reshard_s_per_gb, model_params, decode_fixed_fraction}``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from slurm_rl.scheduler import defaults
from slurm_rl.scheduler.cost_model import SimCostModel
from slurm_rl.scheduler.lengths import LengthModel
from slurm_rl.scheduler.policies import POLICIES, make_policy
from slurm_rl.scheduler.report import SimReport
from slurm_rl.scheduler.simulator import Simulation, SimSetup
from slurm_rl.scheduler.state import BatchSpec, Placement, PolicyConfig, normalize_placement

#: Policy-name suffixes that switch the RLinf options on: ``auto+pre_process``, ...
POLICY_OPTIONS = {"pre_process": "use_pre_process_policy",
                  "wait_before_last_iter": "use_wait_before_last_iter_policy"}


def _as_dict(cfg: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.asdict(cfg)
    if isinstance(cfg, Mapping):
        return {k: _as_dict(v) if isinstance(v, Mapping) else v for k, v in cfg.items()}
    try:
        from omegaconf import OmegaConf
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except Exception as exc:  # noqa: BLE001 - report what we got
        raise TypeError(f"simulate: cannot read a config of type {type(cfg).__name__}") from exc


def parse_ranks(spec: Any, world: int) -> tuple[int, ...]:
    """Ranks of an RLinf placement value: ``3``, ``"0-3"``, ``"0-1,4-5"``, ``"all"`` or a list."""
    if isinstance(spec, int):
        return (spec,)
    if isinstance(spec, Sequence) and not isinstance(spec, str):
        return tuple(r for item in spec for r in parse_ranks(item, world))
    text = str(spec).strip()
    if text == "all":
        return tuple(range(world))
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def parse_placement(spec: Mapping[str, Any], world: int) -> Placement:
    """``cluster.component_placement`` (simple forms) as sorted rank tuples per component."""
    out: dict[str, tuple[int, ...]] = {}
    for key, value in spec.items():
        ranks = parse_ranks(value, world)
        for comp in str(key).split(","):
            comp = comp.strip()
            if comp in out:
                raise ValueError(f"cluster.component_placement: {comp} is placed twice")
            out[comp] = ranks
    return normalize_placement(out)


def scale_placement(placement: Placement, world_from: int, world_to: int,
                    cfg: PolicyConfig) -> Placement:
    """The same layout (component order and shares) on ``world_to`` GPUs."""
    if world_from == world_to:
        return dict(placement)
    order = sorted((c for c in placement if placement[c]), key=lambda c: min(placement[c]))
    out: dict[str, tuple[int, ...]] = {c: () for c in placement}
    start = 0
    for i, comp in enumerate(order):
        unit = (cfg.rollout_ranks_per_instance if comp == "rollout"
                else cfg.actor_ranks_per_instance if comp == "actor" else 1)
        if i == len(order) - 1:
            n = world_to - start
        else:
            n = max(unit, round(len(placement[comp]) * world_to / world_from / unit) * unit)
        out[comp] = tuple(range(start, start + n))
        start += n
    return out


def parse_policy(name: str) -> tuple[str, dict[str, bool]]:
    """``auto+pre_process+wait_before_last_iter`` -> (``auto``, options switched on)."""
    base, *opts = name.split("+")
    if base not in POLICIES:
        raise ValueError(f"policy: got {base!r}, allowed {POLICIES} "
                         f"with options {sorted(POLICY_OPTIONS)} joined by '+'")
    flags = {}
    for opt in opts:
        if opt not in POLICY_OPTIONS:
            raise ValueError(f"policy option: got {opt!r}, allowed {sorted(POLICY_OPTIONS)}")
        flags[POLICY_OPTIONS[opt]] = True
    return base, flags


def build_setup(cfg: Any, gpus: int | None = None, policy: str | None = None,
                placement: Mapping[str, Sequence[int]] | None = None,
                seed: int | None = None) -> tuple[SimSetup, str]:
    """A ``SimSetup`` and the policy name from a run config (see the module docstring)."""
    c = _as_dict(cfg)
    cluster, train = c.get("cluster", {}), c["train"]
    sched, emu = c.get("scheduler", {}) or {}, c["emulated"]
    world_cfg = int(cluster.get("num_nodes", 1)) * int(cluster.get("gpus_per_node", 8))
    world = int(gpus) if gpus is not None else world_cfg
    if policy is None:
        policy = sched.get("policy") or ("auto" if cluster.get("auto_scheduler") else
                                         defaults.POLICY)
    base, flags = parse_policy(policy)
    pcfg = PolicyConfig(
        max_running_requests=int(sched.get("max_running_requests",
                                           defaults.MAX_RUNNING_REQUESTS)),
        rollout_ranks_per_instance=int(sched.get("rollout_ranks_per_instance",
                                                 defaults.RANKS_PER_INSTANCE)),
        actor_ranks_per_instance=int(sched.get("actor_ranks_per_instance",
                                               defaults.RANKS_PER_INSTANCE)),
        pre_process_threshold=float(sched.get("pre_process_threshold",
                                              defaults.PRE_PROCESS_THRESHOLD)),
        use_pre_process_policy=flags.get("use_pre_process_policy", bool(cluster.get(
            "use_pre_process_policy", defaults.USE_PRE_PROCESS_POLICY))),
        use_wait_before_last_iter_policy=flags.get("use_wait_before_last_iter_policy", bool(
            cluster.get("use_wait_before_last_iter_policy",
                        defaults.USE_WAIT_BEFORE_LAST_ITER_POLICY))),
        script=tuple(sched.get("script") or ()),
    )
    if placement is None:
        placement = parse_placement(cluster["component_placement"], world_cfg)
        placement = scale_placement(placement, world_cfg, world, pcfg)
    samples = int(train["rollout_batch_size"]) * int(train["group_size"])
    setup = SimSetup(
        gpus=world, initial=normalize_placement(placement),
        batch=BatchSpec(int(train["global_batch_size"]), int(train["micro_batch_size"]), samples),
        group_size=int(train["group_size"]), num_iterations=int(train["num_iterations"]),
        prompt_len=int(emu.get("prompt_len", 0)),
        lengths=LengthModel(mean=float(emu["response_len_mean"]),
                            max_len=int(emu["response_len_max"]),
                            dist=str(emu.get("response_len_dist", defaults.RESPONSE_LEN_DIST)),
                            sigma=float(emu.get("response_len_sigma",
                                                defaults.RESPONSE_LEN_SIGMA)),
                            alpha=float(emu.get("response_len_alpha", defaults.PARETO_ALPHA))),
        cost=SimCostModel.from_config(emu), policy_cfg=pcfg,
        switch_latency_s=float(sched.get("switch_latency_s", defaults.SWITCH_LATENCY_S)),
        tick_s=float(sched.get("tick_s", defaults.TICK_S)),
        seed=int(seed if seed is not None else sched.get("seed", defaults.SEED)),
        iteration_overhead_s=float(sched.get("iteration_overhead_s", 0.0)),
    )
    return setup, base


def simulate(cfg: Any, gpus: int | None = None, policy: str | None = None,
             placement: Mapping[str, Sequence[int]] | None = None,
             seed: int | None = None) -> SimReport:
    """Simulate a run config on ``gpus`` GPUs (default: the config's) under ``policy``
    (default: ``scheduler.policy``, else ``auto`` when ``cluster.auto_scheduler``). ``placement``
    overrides ``cluster.component_placement`` (rank tuples per component)."""
    setup, base = build_setup(cfg, gpus, policy, placement, seed)
    fn = make_policy(base, setup.policy_cfg)
    return Simulation(setup, fn, policy_name=base).run()
