"""``scheduler.policy: plan`` for an asynchronous run: the placement chosen once, at launch, by the simulator.

``plan`` moves ranks between components inside a synchronous iteration; an asynchronous run's rollout decodes
iterations ahead on ranks of its own, which such moves would take from it mid-draw. So for
``algorithm.max_staleness`` >= 1 ``plan`` chooses the disaggregated split that the cost model (``emulated.*``:
the simulator's, fitted to a live run by ``slurm-rl simulate --calibrate RUN_DIR``) runs fastest with the config's
bound and partial-rollout switch (:func:`~slurm_rl.scheduler.async_pipeline.simulate_async`), and the run keeps
it (``scheduler.policy: static`` from the launch on, written into ``RUN_DIR/config.yaml`` so that a resume keeps
it too). It never raises the bound above the config's.
"""

from __future__ import annotations

from typing import Any

from slurm_rl.config import Config


def plans_async(cfg: Config) -> bool:
    """Whether the launch chooses the placement of an asynchronous run (``plan`` with a staleness bound)."""
    return cfg.scheduler.policy == "plan" and int(cfg.algorithm.max_staleness) >= 1


def plan_async(cfg: Config) -> tuple[list[str], dict[str, Any]]:
    """The overrides that run ``cfg`` on the placement the simulator finds fastest for its bound (static from
    then on), and what was chosen: the placement, the simulated seconds per iteration on it and on the configured
    placement (None where that one cannot run asynchronously)."""
    from omegaconf import OmegaConf

    from slurm_rl.placement import ConfigError
    from slurm_rl.rules import compress_ranks
    from slurm_rl.scheduler.async_pipeline import simulate_async

    k = int(cfg.algorithm.max_staleness)
    doc = OmegaConf.to_container(cfg.raw, resolve=True)
    assert isinstance(doc, dict)
    partial = bool(cfg.rollout.partial_rollout)
    best = simulate_async(doc, [k], seed=cfg.scheduler.seed, partial=partial)[k]
    try:
        configured = simulate_async(doc, [k], seed=cfg.scheduler.seed, search=False, partial=partial)[k]
    except ConfigError:  # the configured placement shares the rollout's ranks
        configured = None
    placement = {c: compress_ranks(sorted(ranks)) for c, ranks in best.placement.items()}
    entries = ", ".join(f'"{c}": "{r}"' for c, r in placement.items())
    overrides = [f"cluster.component_placement={{{entries}}}", "scheduler.policy=static",
                 "cluster.auto_scheduler=false"]
    figure = "steady_iteration_s" if partial else "mean_iteration_s"
    chosen = {"max_staleness": k, "partial_rollout": partial, "placement": placement,
              "simulated_s_per_iteration": round(getattr(best, figure), 3),
              "configured_s_per_iteration": round(getattr(configured, figure), 3) if configured else None}
    return overrides, chosen
