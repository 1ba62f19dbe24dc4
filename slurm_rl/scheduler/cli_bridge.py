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
    """One row per mode (rich table), the fastest named with what the config says for it."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"modes on {result['gpus']} GPUs ({result['iterations']} iterations simulated)")
    for name in ("mode", "policy", "s/iteration", "vs configured", "config"):
        table.add_column(name, justify="right" if name in ("s/iteration", "vs configured") else "left")
    for row in result["modes"]:
        table.add_row(row["mode"], row["policy"], f"{row['mean_iteration_s']:.1f}",
                      f"{row['speedup_vs_configured']:.2f}x", row["config"])
    best = result["fastest"]
    skipped = result["not_compared"]
    table.caption = f"fastest: {best['mode']} {best['policy']} ({best['config']})" + (
        f"\nnot compared: {', '.join(skipped['policies'])} ({skipped['why']})" if skipped["policies"] else "")
    Console().print(table)
