"""Small emulated configs for runtime tests (written to a temp dir by each test)."""

from __future__ import annotations

from pathlib import Path

import yaml

FAST_COSTS = {
    "rollout_s_per_token": 1.0e-6,
    "inference_s_per_token": 1.0e-7,
    "actor_s_per_token": 3.0e-7,
    "response_len_mean": 64,
    "response_len_max": 256,
    "prompt_len": 16,
    "model_params": 10_000_000,
    "reshard_s_per_gb": 0.5,
}


def emulated_config(run_dir: Path, nodes: int = 1, gpus_per_node: int = 8, iterations: int = 3, **runtime) -> dict:
    """actor | rollout | inference split 1:2:1 with a scripted schedule of two changes."""
    n = nodes * gpus_per_node
    a, r = n // 4, n // 4 + n // 2
    rt = {"device": "emulated", "run_dir": str(run_dir), "heartbeat_timeout_s": 20.0, "ack_timeout_s": 60.0,
          "wait_timeout_s": 120.0, "run_timeout_s": 600.0}
    rt.update(runtime)
    return {
        "cluster": {
            "num_nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "component_placement": {"actor": f"0-{a - 1}", "rollout": f"{a}-{r - 1}", "inference": f"{r}-{n - 1}"},
        },
        "runtime": rt,
        "train": {"num_iterations": iterations, "rollout_batch_size": 16, "group_size": 4,
                  "global_batch_size": 32, "micro_batch_size": 4},
        "scheduler": {
            "policy": "scripted",
            "script": [
                {"at_iteration": 1, "placement": {"actor": f"0-{n // 2 - 1}", "rollout": f"{n // 2}-{n - 1}"}},
                {"at_iteration": 2, "placement": {"actor": f"0-{a - 1}", "rollout": f"{a}-{r - 1}", "inference": f"{r}-{n - 1}"}},
            ],
        },
        "emulated": dict(FAST_COSTS),
    }


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path
