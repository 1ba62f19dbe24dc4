"""Workload profiles for the simulator, in the shape of the run config.

Every profile keeps the disaggregated RLinf layout (actor : rollout : inference = 1 : 2 : 1) and
the cost laws of ``cost_model``; they differ in what the workload asks of each phase.

``math_rl``: GRPO on math prompts with a 7B-class model. Long-tailed responses (lognormal,
median about 1k tokens, clipped at 16k), group size 16, four optimizer steps per iteration, and the
disaggregated RLinf layout (actor : rollout : inference = 1 : 2 : 1, in that rank order so the
actor can grow into released rollout ranks). Costs per GPU: decode 3k tokens/s with 64 running
requests (47 tokens/s per request; a step is 30 % weight reads, so a lone request runs at about
150 tokens/s), training 5k tokens/s (forward, backward and the old-logprob pass), reference-logprob
inference 20k tokens/s, reshard at 12.5 GB/s.
"""

from __future__ import annotations

from typing import Any


def math_rl(gpus: int, num_iterations: int = 3) -> dict[str, Any]:
    """The math-RL profile for ``gpus`` GPUs (a multiple of 4), as a config dictionary."""
    if gpus < 4 or gpus % 4:
        raise ValueError(f"math_rl profile: gpus={gpus}, expected a multiple of 4 (>= 4)")
    q = gpus // 4
    samples = 128 * gpus
    group_size = 16
    return {
        "runtime": {"device": "emulated"},  # a workload of the cost model
        "cluster": {
            "num_nodes": max(1, gpus // 8),
            "gpus_per_node": min(gpus, 8),
            "auto_scheduler": False,
            "use_pre_process_policy": False,
            "use_wait_before_last_iter_policy": False,
            "component_placement": {
                "actor": f"0-{q - 1}",
                "rollout": f"{q}-{3 * q - 1}",
                "inference": f"{3 * q}-{gpus - 1}",
            },
        },
        "train": {
            "num_iterations": num_iterations,
            "rollout_batch_size": samples // group_size,
            "group_size": group_size,
            "global_batch_size": samples // 4,
            "micro_batch_size": 4,
        },
        "scheduler": {"policy": "static", "max_running_requests": 64,
                      "pre_process_threshold": 0.5},
        "emulated": {
            "rollout_s_per_token": 1.0 / 3000,
            "inference_s_per_token": 5e-5,
            "actor_s_per_token": 2e-4,
            "response_len_mean": 1649,
            "response_len_max": 16384,
            "response_len_dist": "lognormal",
            "response_len_sigma": 1.0,
            "decode_fixed_fraction": 0.3,
            "prompt_len": 256,
            "scaling": 0.95,
            "reshard_s_per_gb": 0.08,
            "model_params": 7_000_000_000,
        },
    }


def scaled_for_live(cfg: dict[str, Any], time_scale: float, token_scale: float) -> dict[str, Any]:
    """A copy of ``cfg`` for an emulated live run: every cost times ``time_scale`` (a 300 s
    iteration takes 300 * time_scale s), and responses/prompts ``token_scale`` times shorter with
    per-token costs ``token_scale`` times higher (the same seconds, smaller Arrow payloads). Give
    the simulator the same copy to compare the two on one workload."""
    import copy

    from slurm_rl.config import EmulatedConfig

    out = copy.deepcopy(cfg)
    emu = out["emulated"]
    for key in ("rollout_s_per_token", "inference_s_per_token", "actor_s_per_token"):
        emu[key] *= time_scale * token_scale
    for key in ("reshard_s_per_gb", "offload_s_per_gb"):
        emu[key] = emu.get(key, getattr(EmulatedConfig, key)) * time_scale
    for key in ("response_len_mean", "response_len_max", "prompt_len"):
        emu[key] = max(1, int(round(emu[key] / token_scale)))
    return out


def agentic(gpus: int, num_iterations: int = 3) -> dict[str, Any]:
    """Long-tailed agentic / multi-turn rollouts: trajectories of many turns (lognormal with
    sigma 1.3, mean 6k tokens, clipped at 32k), group size 8, a quarter of math-RL's samples per
    GPU; decode is slower per token (long contexts: 2k tokens/s per GPU at 64 requests, a step
    half weight reads). Rollout takes 3-6x the actor's time."""
    cfg = math_rl(gpus, num_iterations)
    samples = 32 * gpus
    cfg["train"].update(rollout_batch_size=samples // 8, group_size=8, global_batch_size=samples // 4)
    cfg["emulated"].update(rollout_s_per_token=1.0 / 2000, response_len_mean=6000,
                           response_len_max=32768, response_len_sigma=1.3,
                           decode_fixed_fraction=0.5, prompt_len=1024)
    return cfg


def train_heavy(gpus: int, num_iterations: int = 3) -> dict[str, Any]:
    """Training-heavy: moderate responses (lognormal sigma 0.8, mean 1k tokens, clipped at 8k)
    on a larger model whose training costs 4x math-RL's per token (a 30B-class actor, reshard
    moving 4x the state), so rollout takes about as long as training."""
    cfg = math_rl(gpus, num_iterations)
    cfg["emulated"].update(response_len_mean=1000, response_len_max=8192, response_len_sigma=0.8,
                           actor_s_per_token=8e-4, model_params=30_000_000_000)
    return cfg


def short_response(gpus: int, num_iterations: int = 3) -> dict[str, Any]:
    """Short responses (lognormal sigma 0.6, mean 300 tokens, clipped at 2k), e.g. classification
    or short-answer RL: twice math-RL's samples per GPU, the same per-token costs."""
    cfg = math_rl(gpus, num_iterations)
    samples = 256 * gpus
    cfg["train"].update(rollout_batch_size=samples // 16, global_batch_size=samples // 4)
    cfg["emulated"].update(response_len_mean=300, response_len_max=2048, response_len_sigma=0.6)
    return cfg


PROFILES = {"math_rl": math_rl, "agentic": agentic, "train_heavy": train_heavy,
            "short_response": short_response}
