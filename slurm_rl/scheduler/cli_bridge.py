"""``slurm-rl simulate``: run the simulator on a resolved config (placements parsed by config.py)."""

from __future__ import annotations

import json
import sys

from omegaconf import OmegaConf

from slurm_rl.config import Config
from slurm_rl.scheduler.live_state import policy_config
from slurm_rl.scheduler.report import print_report
from slurm_rl.scheduler.simulate import scale_placement, simulate


def run_simulation(cfg: Config, gpus: int | None, policy: str | None, as_json: bool) -> int:
    """Simulate ``cfg`` (optionally on ``gpus`` GPUs / under ``policy``); print a table or JSON."""
    doc = OmegaConf.to_container(cfg.raw, resolve=True)
    assert isinstance(doc, dict)
    pcfg = policy_config(cfg)
    doc["scheduler"]["script"] = list(pcfg.script)  # parsed steps (RLinf forms resolved to ranks)
    world = cfg.placement.world_size
    placement = {name: tuple(comp.ranks) for name, comp in cfg.placement.components.items()}
    if gpus is not None and gpus != world:
        placement = scale_placement(placement, world, gpus, pcfg)
    try:
        report = simulate(doc, gpus=gpus, policy=policy, placement=placement)
    except (ValueError, RuntimeError) as exc:  # a setup the model cannot run: bad input, exit 2
        print(f"error: cannot simulate {gpus or world} GPUs: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        print_report(report)
    return 0
