"""``slurm-rl simulate``: build a simulation from a validated run :class:`~slurm_rl.config.Config`.

The simulation reads the config's placement (``cfg.placement``, with ``cluster.gpus_per_node``
and node groups resolved by ``config.py``), ``train``, ``scheduler`` (``policy``, the scripted
steps' resolved placements, the policy knobs, ``switch_latency_s``, ``tick_s``, ``seed``,
``iteration_overhead_s``), the RLinf options ``cluster.use_pre_process_policy`` /
``use_wait_before_last_iter_policy`` and the ``emulated`` cost model. A config document built in
code goes through :func:`~slurm_rl.config.config_from_mapping` first, so it is validated exactly
like a YAML file.
"""

from __future__ import annotations

import shlex

import dataclasses
import math
from typing import Mapping, Sequence

from slurm_rl.config import Config, actor_offloads, critic_tp
from slurm_rl.scheduler.collocated import HYBRID, MODE as COLLOCATED
from slurm_rl.scheduler.collocated import actor_holds_every_rank, rank_components
from slurm_rl.scheduler.cost_model import CostModel
from slurm_rl.scheduler.lengths import LengthModel
from slurm_rl.scheduler.live_state import policy_config, time_slicing_problems
from slurm_rl.scheduler.policies import POLICIES, make_policy
from slurm_rl.scheduler.report import SimReport
from slurm_rl.scheduler.simulator import Simulation, SimulationSetupError, SimSetup
from slurm_rl.scheduler.state import BatchSpec, PolicyConfig, RankMap, normalize_placement
from slurm_rl.rules import compress_ranks

__all__ = ["MODES", "POLICY_OPTIONS", "SimulationSetupError", "build_setup", "compare_modes", "parse_policy",
           "scale_placement", "simulate"]

#: Policy-name suffixes that switch the RLinf options on: ``auto+pre_process``, ...
POLICY_OPTIONS = {"pre_process": "use_pre_process_policy",
                  "wait_before_last_iter": "use_wait_before_last_iter_policy"}
#: ``plan+disaggregated``: plan with ``scheduler.time_slicing: false`` (every iteration disaggregated)
DISAGGREGATED = "disaggregated"


def scale_placement(placement: RankMap, world_from: int, world_to: int,
                    cfg: PolicyConfig) -> RankMap:
    """The same layout (the order and shares of each set of ranks that serve the same components) on
    ``world_to`` GPUs; raises :class:`SimulationSetupError` when a set would get no GPU."""
    if world_from == world_to:
        return dict(placement)
    sets: dict[tuple[str, ...], list[int]] = {}
    for rank, comps in rank_components(normalize_placement(placement), tuple(range(world_from))).items():
        if comps:
            sets.setdefault(comps, []).append(rank)
    order = sorted(sets, key=lambda comps: min(sets[comps]))
    out: dict[str, list[int]] = {c: [] for c in placement}
    start = 0
    for i, comps in enumerate(order):
        unit = math.lcm(*(cfg.rollout_ranks_per_instance if c == "rollout"
                          else cfg.actor_ranks_per_instance if c == "actor" else 1 for c in comps))
        if i == len(order) - 1:
            n = world_to - start
        else:
            n = max(unit, round(len(sets[comps]) * world_to / world_from / unit) * unit)
        if n < 1 or start + n > world_to:
            layout = ", ".join(f"{','.join(c)}: {len(sets[c])}" for c in order)
            raise SimulationSetupError(
                f"gpus: {world_to} GPUs cannot hold the configured layout of {world_from} ({layout}); "
                f"{','.join(comps)} would get {max(0, min(n, world_to - start))}")
        for c in comps:
            out[c].extend(range(start, start + n))
        start += n
    return {c: tuple(r) for c, r in out.items()}


def parse_policy(name: str) -> tuple[str, dict[str, bool]]:
    """``auto+pre_process+wait_before_last_iter`` -> (``auto``, options switched on); ``collocated``:
    the configured components time-sliced on every GPU (``scheduler.collocated``), ``collocated+offload``
    with the actor's state parked in host memory between phases whatever ``actor.offload_*`` say;
    ``plan+disaggregated``: plan without running iterations collocated (``scheduler.time_slicing: false``)."""
    base, *opts = name.split("+")
    if base == COLLOCATED and opts == ["offload"]:  # the actor parked in host memory between phases
        return base, {}
    if base == "plan" and opts == [DISAGGREGATED]:
        return base, {"time_slicing": False}
    if base not in (*POLICIES, COLLOCATED):
        raise SimulationSetupError(f"policy: got {base!r}, allowed {(*POLICIES, COLLOCATED)} "
                                   f"with options {sorted(POLICY_OPTIONS)} joined by '+'")
    flags = {}
    for opt in opts:
        if opt not in POLICY_OPTIONS or base == COLLOCATED:
            raise SimulationSetupError(f"policy option: got {opt!r}, allowed {sorted(POLICY_OPTIONS)} "
                                       f"(the policies), or offload alone ({COLLOCATED}+offload), or "
                                       f"{DISAGGREGATED} alone (plan+{DISAGGREGATED})")
        flags[POLICY_OPTIONS[opt]] = True
    return base, flags


def _config(cfg: Config) -> Config:
    """``cfg`` itself; a plain mapping is refused (build it with ``config_from_mapping``)."""
    if not isinstance(cfg, Config):
        raise TypeError(f"simulate takes a validated Config (load_config / config_from_mapping), "
                        f"got {type(cfg).__name__}")
    return cfg


def build_setup(cfg: Config, gpus: int | None = None, policy: str | None = None,
                placement: Mapping[str, Sequence[int]] | None = None,
                seed: int | None = None) -> tuple[SimSetup, str]:
    """A ``SimSetup`` and the policy name from a validated config (see the module docstring).

    ``gpus`` (default: the config's slots) rescales the configured placement with
    :func:`scale_placement`; ``policy`` (default ``scheduler.policy``) may carry ``+option``
    suffixes; ``placement`` replaces the configured one (rank tuples per component). ``collocated``
    puts every configured component on every GPU, time-sliced; ``static`` on a placement whose ranks
    serve several components (collocated or hybrid) time-slices those ranks
    (:mod:`slurm_rl.scheduler.collocated`), and so does ``auto``, which pins them (see
    :mod:`slurm_rl.scheduler.policies.auto`); the other policies move whole ranks and take a
    disaggregated placement."""
    cfg = _config(cfg)
    world_cfg = cfg.placement.world_size
    world = int(gpus) if gpus is not None else world_cfg
    name = policy if policy is not None else cfg.scheduler.policy
    base, flags = parse_policy(name)
    pcfg = dataclasses.replace(policy_config(cfg), time_slicing=base == "plan" and not time_slicing_problems(cfg))
    pcfg = dataclasses.replace(pcfg, **flags)
    if world != world_cfg:  # the configured node of each rank does not describe another world
        pcfg = dataclasses.replace(pcfg, rank_nodes=())
    if base == COLLOCATED:
        placement = {name: tuple(range(world)) for name in cfg.placement.components}
    elif placement is None:
        placement = {name: tuple(comp.ranks) for name, comp in cfg.placement.components.items()}
        placement = scale_placement(placement, world_cfg, world, pcfg)
    placement = normalize_placement(placement)
    comps_of = rank_components(placement, tuple(range(world)))
    shared = [r for r, comps in comps_of.items() if len(comps) > 1]
    if shared and base not in ("static", COLLOCATED, "auto"):
        raise SimulationSetupError(f"policy: {base} moves whole ranks between components; ranks {shared[:8]} serve "
                                   f"several (time-sliced): simulate this placement with static or auto (which "
                                   f"pins them), or a disaggregated one with {base}")
    if shared and base == "auto" and actor_holds_every_rank(placement):
        raise SimulationSetupError(f"policy: auto grows the actor into ranks the other components free up, and the "
                                   f"actor holds every rank already (ranks {shared[:8]} serve several, "
                                   f"time-sliced): simulate this placement with static")
    time_sliced = bool(shared)
    if time_sliced and base == "static":
        placed = [c for c in placement if placement[c]]
        base = COLLOCATED if all(len(comps) == len(placed) for comps in comps_of.values()) else HYBRID
    t, s, e = cfg.train, cfg.scheduler, cfg.emulated
    cost = CostModel.from_config(dataclasses.asdict(e))
    offloads = actor_offloads(cfg) or name.endswith("+offload")
    may_share = time_sliced or pcfg.time_slicing
    setup = SimSetup(
        gpus=world, initial=placement,
        batch=BatchSpec(t.global_batch_size, t.micro_batch_size, t.rollout_batch_size * t.group_size,
                        cfg.actor.ppo_epochs),
        group_size=t.group_size, num_iterations=t.num_iterations, prompt_len=e.prompt_len,
        lengths=LengthModel(mean=float(e.response_len_mean), max_len=e.response_len_max,
                            dist=e.response_len_dist, sigma=e.response_len_sigma, alpha=e.response_len_alpha),
        cost=cost, policy_cfg=pcfg,
        switch_latency_s=s.switch_latency_s, tick_s=s.tick_s,
        seed=seed if seed is not None else s.seed, iteration_overhead_s=s.iteration_overhead_s,
        collocated=time_sliced,
        phase_switch_s=cost.offload_seconds(cfg.actor.tensor_parallel) if may_share and offloads else 0.0,
        offloads=offloads,
        critic_dp=len(cfg.placement.critic_ranks) // critic_tp(cfg),
    )
    return setup, base


def simulate(cfg: Config, gpus: int | None = None, policy: str | None = None,
             placement: Mapping[str, Sequence[int]] | None = None,
             seed: int | None = None) -> SimReport:
    """Simulate a validated config on ``gpus`` GPUs (default: the config's) under ``policy``
    (default: ``scheduler.policy``). ``placement`` overrides the configured placement (rank
    tuples per component). Raises :class:`SimulationSetupError` for a setup the simulator cannot
    run (bad input); any other error is a bug."""
    setup, base = build_setup(cfg, gpus, policy, placement, seed)
    # a shared placement's ranks time-slice under the static policy (the simulator switches their phases)
    fn = make_policy("static" if base in (COLLOCATED, HYBRID) else base, setup.policy_cfg)
    return Simulation(setup, fn, policy_name=base).run()


#: The modes ``simulate --compare-modes`` sets side by side: (mode, policy, what it is; the overrides that run it
#: come from :func:`mode_overrides`).
MODES = (("disaggregated", "static", "static placement"),
         ("disaggregated", "auto", "auto scheduler"),
         ("disaggregated", f"plan+{DISAGGREGATED}", "plan, never collocated"),
         ("per iteration", "plan", "plan (iterations collocated where measured faster)"),
         ("collocated", COLLOCATED, "every component on every rank"),
         ("collocated", f"{COLLOCATED}+offload", "every component on every rank, actor parked between phases"))


def mode_overrides(cfg: Config, policy: str) -> list[str]:
    """The ``key=value`` overrides that make ``cfg`` run under ``policy`` (a row of :data:`MODES`): each
    validates when appended to the config's command line (RLinf's switch ``cluster.auto_scheduler`` set to
    match the policy; a collocated run places every configured component on every rank, statically)."""
    dynamic = policy in ("auto", "plan", f"plan+{DISAGGREGATED}")
    out = [] if cfg.cluster.auto_scheduler == dynamic else [f"cluster.auto_scheduler={str(dynamic).lower()}"]
    if policy.startswith(COLLOCATED):
        every = ",".join(cfg.placement.components)
        out += [f'cluster.component_placement={{"{every}": all}}', "scheduler.policy=static"]
        if policy.endswith("+offload"):
            out.append("actor.offload_weight=true")
        elif actor_offloads(cfg):
            out += [f"actor.{k}=false" for k in ("offload_weight", "offload_grad", "offload_optimizer")]
        if cfg.scheduler.time_slicing is not None:
            out.append("scheduler.time_slicing=null")
        return out
    out.append(f"scheduler.policy={policy.split('+')[0]}")
    if policy == f"plan+{DISAGGREGATED}":
        out.append("scheduler.time_slicing=false")
    elif cfg.scheduler.time_slicing is not None and policy != "plan":
        out.append("scheduler.time_slicing=null")
    return out


def compare_modes(cfg: Config, gpus: int | None = None, seed: int | None = None) -> dict[str, object]:
    """The config's run against every mode it could run in (see :data:`MODES`) on the same GPUs, data and
    cost model: seconds per iteration, and the fastest. The disaggregated policies run the config's placement
    where it is disaggregated; on a hybrid one only ``auto`` runs, its shared ranks pinned (the others, and
    ``auto`` where the actor holds every rank, are left out, and the reason given); its own run (hybrid
    included) is the first row."""
    cfg = _config(cfg)
    own = simulate(cfg, gpus=gpus, seed=seed)
    rows = [{"mode": cfg.placement.mode, "policy": own.policy, "what": "as configured", "overrides": [],
             "config": "as configured", "mean_iteration_s": round(own.mean_iteration_s, 3)}]
    skipped = []
    sliced = not time_slicing_problems(cfg)
    configured = {"plan": own.policy == "plan" and sliced,  # which row the config's own run is
                  f"plan+{DISAGGREGATED}": own.policy == "plan" and not sliced,
                  COLLOCATED: own.policy == COLLOCATED and not actor_offloads(cfg)}
    pinned = cfg.placement.mode == HYBRID and not actor_holds_every_rank(
        {name: tuple(comp.ranks) for name, comp in cfg.placement.components.items()})
    for mode, policy, how in MODES:
        if pinned and policy == "auto":  # auto runs a hybrid placement with its shared ranks pinned
            mode, how = HYBRID, "auto scheduler (the shared ranks pinned)"
        elif mode != "collocated" and cfg.placement.mode != "disaggregated":
            skipped.append(policy)
            continue
        if configured.get(policy, policy == own.policy):
            continue  # the configured run itself
        report = simulate(cfg, gpus=gpus, policy=policy, seed=seed)
        overrides = mode_overrides(cfg, policy)
        rows.append({"mode": mode, "policy": policy, "what": how, "overrides": overrides,
                     "config": shlex.join(overrides), "mean_iteration_s": round(report.mean_iteration_s, 3)})
    base = rows[0]["mean_iteration_s"]
    for row in rows:
        row["speedup_vs_configured"] = round(base / row["mean_iteration_s"], 3) if row["mean_iteration_s"] else None
    best = min(rows, key=lambda r: r["mean_iteration_s"])
    why = "the configured placement shares ranks: give a disaggregated one to compare them" if skipped else None
    return {"gpus": own.gpus, "iterations": len(own.iterations), "modes": rows, "fastest": best,
            "not_compared": {"policies": skipped, "why": why},
            "asynchronous": _async_rows(cfg, gpus, seed, best["mean_iteration_s"])}


#: the staleness bounds ``compare_modes`` simulates (``algorithm.max_staleness``)
ASYNC_STALENESS = (1, 2)


def _async_rows(cfg: Config, gpus: int | None, seed: int | None, fastest_s: float) -> dict[str, object]:
    """The config run asynchronously with each of :data:`ASYNC_STALENESS` on its best split, the rollout on GPUs of
    its own (a live run takes it with that placement and ``scheduler.policy: static``): the rollout waiting at the gates
    (:mod:`~slurm_rl.scheduler.async_pipeline`), then with partial rollout (its requests carried over the gates:
    :mod:`~slurm_rl.scheduler.async_stream`; ``steady_iteration_s``: after the first iteration, which fills the
    pipeline)."""
    from omegaconf import OmegaConf

    from slurm_rl.scheduler.async_pipeline import simulate_async

    if cfg.placement.mode != "disaggregated" or (gpus is not None and gpus != cfg.num_slots):
        return {"rows": [], "why": "needs the config's own GPUs on a disaggregated placement"}
    doc = OmegaConf.to_container(cfg.raw, resolve=True)
    rows = []
    for partial in (False, True):  # the rollout waiting at the gates, then its requests carried over them
        reports = simulate_async(doc, ASYNC_STALENESS, seed=seed, partial=partial)
        rows += [{"max_staleness": k, "partial_rollout": partial, "mean_iteration_s": round(r.mean_iteration_s, 3),
                  "steady_iteration_s": round(r.steady_iteration_s, 3),
                  "vs_fastest_mode": round(fastest_s / r.mean_iteration_s, 3) if r.mean_iteration_s else None,
                  "gpus": {c: len(ranks) for c, ranks in r.placement.items()},
                  "placement": {c: compress_ranks(sorted(ranks)) for c, ranks in r.placement.items()},
                  "staleness": [it.staleness for it in r.iterations]} for k, r in sorted(reports.items())]
    return {"rows": rows, "why": "live: the row's overrides, under scheduler.policy static"}
