"""``scheduler.policy: plan`` for an asynchronous run: the schedule chosen once, at launch, by the simulator.

``plan`` moves ranks between components inside a synchronous iteration; an asynchronous run's rollout decodes
iterations ahead on ranks of its own, which such moves would take from it mid-draw. So for
``algorithm.max_staleness`` >= 1 ``plan`` weighs, with the cost model (``emulated.*``: the simulator's, fitted to a
live run by ``slurm-rl simulate --calibrate RUN_DIR``), the split that runs fastest with the config's bound and
partial-rollout switch (:func:`~slurm_rl.scheduler.async_pipeline.simulate_async`: the rollout on GPUs of its own;
with partial rollout the inference may share the actor's) against its own synchronous schedule on the configured
placement, per iteration after the first (a long run's figure):

- asynchrony pays: the run keeps that split (``scheduler.policy: static`` from the launch on);
- it does not: the run is synchronous under ``plan`` (``algorithm.max_staleness: 0``): plan never raises the bound,
  and may lower it.

Either way the choice is written into ``RUN_DIR/config.yaml``, so that a resume keeps it.
"""

from __future__ import annotations

from typing import Any

from slurm_rl.config import Config, config_from_mapping

#: iterations each candidate is simulated for: an async run's steady figure leaves out the first and the last
#: ``k`` (its pipeline filling and draining) and alternates between long and short iterations where the tail binds,
#: so it needs several whatever the config's count; a synchronous one's settles after its first
ASYNC_ITERATIONS, SYNC_ITERATIONS = 8, 4


def plans_async(cfg: Config) -> bool:
    """Whether the launch chooses the placement of an asynchronous run (``plan`` with a staleness bound)."""
    return cfg.scheduler.policy == "plan" and int(cfg.algorithm.max_staleness) >= 1


def plan_async(cfg: Config) -> tuple[list[str], dict[str, Any]]:
    """The overrides that run ``cfg`` on the schedule the simulator finds fastest (module docstring), and what was
    chosen: the bound, the placement, the simulated seconds per iteration after the first of it and of the other
    candidate (``synchronous_plan_s``, ``async_s``)."""
    from omegaconf import OmegaConf

    from slurm_rl.rules import compress_ranks
    from slurm_rl.scheduler.async_pipeline import simulate_async
    from slurm_rl.scheduler.simulate import simulate

    k = int(cfg.algorithm.max_staleness)
    doc = OmegaConf.to_container(cfg.raw, resolve=True)
    assert isinstance(doc, dict)
    partial = bool(cfg.rollout.partial_rollout)
    doc["train"]["num_iterations"] = ASYNC_ITERATIONS
    best = simulate_async(doc, [k], seed=cfg.scheduler.seed, partial=partial)[k]
    doc["train"]["num_iterations"] = SYNC_ITERATIONS  # plan's own synchronous schedule on the configured placement
    sync = simulate(config_from_mapping(doc), seed=cfg.scheduler.seed)
    later = [it.time_s for it in sync.iterations[1:]] or [it.time_s for it in sync.iterations]
    sync_s, async_s = sum(later) / len(later), best.steady_iteration_s
    figures = {"synchronous_plan_s": round(sync_s, 3), "async_s": round(async_s, 3)}
    if sync_s <= async_s:
        overrides = ["algorithm.max_staleness=0", *(["rollout.partial_rollout=false"] if partial else [])]
        placement = {c: compress_ranks(sorted(p.ranks)) for c, p in cfg.placement.components.items()}
        return overrides, {"max_staleness": 0, "partial_rollout": False, "placement": placement,
                           "policy": "plan", **figures}
    placement = {c: compress_ranks(sorted(ranks)) for c, ranks in best.placement.items()}
    entries = ", ".join(f'"{c}": "{r}"' for c, r in placement.items())
    overrides = [f"cluster.component_placement={{{entries}}}", "scheduler.policy=static",
                 "cluster.auto_scheduler=false"]
    return overrides, {"max_staleness": k, "partial_rollout": partial, "placement": placement, "policy": "static",
                       **figures}
