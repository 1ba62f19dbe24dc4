"""``slurm-rl simulate``: run the simulator on a validated config (placements parsed by config.py)."""

from __future__ import annotations

import json
import sys
from typing import Any

from slurm_rl.config import Config, ConfigError
from slurm_rl.scheduler.report import print_report
from slurm_rl.scheduler.simulate import SimulationSetupError, compare_modes, simulate


def run_simulation(cfg: Config, gpus: int | None, policy: str | None, as_json: bool, compare: bool = False) -> int:
    """Simulate ``cfg`` (optionally on ``gpus`` GPUs / under ``policy``; ``compare``: every mode, see
    :func:`~slurm_rl.scheduler.simulate.compare_modes`); print a table or JSON.

    Exit 2 for bad input only (a config or a setup the simulator cannot run); any other error
    is a bug and propagates."""
    try:
        result: Any = compare_modes(cfg, gpus=gpus) if compare else simulate(cfg, gpus=gpus, policy=policy)
    except (ConfigError, SimulationSetupError) as exc:
        print(f"error: cannot simulate {gpus or cfg.placement.world_size} GPUs: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(result if compare else result.as_dict(), indent=1))
    elif compare:
        print_modes(result)
    else:
        print_report(result)
    return 0


def print_modes(result: dict[str, Any]) -> None:
    """One row per mode (rich table), then each mode's overrides in full (they validate appended to the config's
    command line), and the fastest."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"modes on {result['gpus']} GPUs ({result['iterations']} iterations simulated)")
    for name in ("#", "mode", "policy", "s/iteration", "vs configured"):
        table.add_column(name, justify="right" if name in ("#", "s/iteration", "vs configured") else "left")
    for i, row in enumerate(result["modes"]):
        table.add_row(str(i), row["mode"], row["policy"], f"{row['mean_iteration_s']:.1f}",
                      f"{row['speedup_vs_configured']:.2f}x")
    Console().print(table)
    print("overrides of each mode (append them to the config's command line):")
    for i, row in enumerate(result["modes"]):
        print(f"  {i} ({row['what']}): {row['config']}")
    best = result["fastest"]
    print(f"fastest: {best['mode']} {best['policy']}: {best['config']}")
    skipped = result["not_compared"]
    if skipped["policies"]:
        print(f"not compared: {', '.join(skipped['policies'])} ({skipped['why']})")
    asynchronous = result.get("asynchronous", {})
    for row in asynchronous.get("rows", []):
        split = ", ".join(f"{c} {n}" for c, n in row["gpus"].items())
        partial = row.get("partial_rollout", False)
        print(f"asynchronous, staleness {row['max_staleness']}{', partial rollout' if partial else ''}: "
              f"{row['mean_iteration_s']:.1f} s/iteration ({row['steady_iteration_s']:.1f} after the first), "
              f"{row['vs_fastest_mode']:.2f}x the fastest mode, on {split} GPUs ({asynchronous['why']}):")
        where = ", ".join(f"{c}: \"{r}\"" for c, r in row.get("placement", {}).items())
        print(f"  algorithm.max_staleness={row['max_staleness']}{' rollout.partial_rollout=true' if partial else ''} "
              f"'cluster.component_placement={{{where}}}'")
