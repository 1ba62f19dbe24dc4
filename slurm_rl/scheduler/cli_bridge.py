"""``slurm-rl simulate``: run the simulator on a validated config (placements parsed by config.py)."""

from __future__ import annotations

import json
import sys

from slurm_rl.config import Config, ConfigError
from slurm_rl.scheduler.report import print_report
from slurm_rl.scheduler.simulate import SimulationSetupError, simulate


def run_simulation(cfg: Config, gpus: int | None, policy: str | None, as_json: bool) -> int:
    """Simulate ``cfg`` (optionally on ``gpus`` GPUs / under ``policy``); print a table or JSON.

    Exit 2 for bad input only (a config or a setup the simulator cannot run); any other error
    is a bug and propagates."""
    try:
        report = simulate(cfg, gpus=gpus, policy=policy)
    except (ConfigError, SimulationSetupError) as exc:
        print(f"error: cannot simulate {gpus or cfg.placement.world_size} GPUs: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        print_report(report)
    return 0
