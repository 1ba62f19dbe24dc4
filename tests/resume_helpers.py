"""Helpers of the checkpoint/resume tests: the run config per backend, and what an interrupted
run must reproduce (per-iteration samples, rewards, losses, final parameters)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from emulated_configs import emulated_config
from identity import assert_losses_match, assert_params_match
from shared_runs import cli, launch, runs_per_backend, shared_root, shared_run  # noqa: F401 (re-exported for the resume tests)
from slurm_rl.metrics import read_metrics
from slurm_rl.resume.stop import request_stop
from toy_data import TOY_DATA, TOY_REWARD, TOY_REWARD_WORKERS
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]
ITERATIONS = 4
BACKENDS = ["emulated", pytest.param("cpu", marks=pytest.mark.slow)]
# For a run that a test interrupts inside an iteration (a signal, a kill): the ranks poll every
# 0.25 s, not every 10 ms. A cpu iteration then takes ~1.8 s instead of ~0.3 s (measured), so the
# interruption lands iterations before the run's end: at the default poll, a USR1 sent inside
# iteration 0 stopped the run at the gate of iteration 3 of 4. Polling changes no result.
INTERRUPTIBLE = {"poll_interval_s": 0.25}
# Where a resumed run may put the actor: another DP size than the run started with.
RESUME_PLACEMENT = 'cluster.component_placement={actor: "0", rollout: "1-2", inference: "3"}'


def run_config(backend: str, run_dir: Path, *, reward_workers: int = TOY_REWARD_WORKERS, **runtime: Any) -> dict:
    """4 ranks, actor DP 2 | rollout | inference, static, mini-batches by index (reproducible);
    ``reward_workers``: reward.workers of the cpu run."""
    if backend == "emulated":
        cfg = emulated_config(run_dir, gpus_per_node=4, iterations=ITERATIONS, **runtime)
        cfg["scheduler"] = {"policy": "static"}
        cfg["emulated"]["rollout_s_per_token"] = 3.0e-5  # iterations long enough to be interrupted inside
    else:
        cfg = {
            "cluster": {"num_nodes": 1, "gpus_per_node": 4},
            "runtime": {"device": "cpu", "run_dir": str(run_dir), "wait_timeout_s": 300.0, "ack_timeout_s": 300.0,
                        "heartbeat_timeout_s": 120.0, "run_timeout_s": 900.0, **runtime},
            "train": {"num_iterations": ITERATIONS, "rollout_batch_size": 4, "group_size": 4,
                      "global_batch_size": 8, "micro_batch_size": 4},
            "scheduler": {"policy": "static"},
            "model": {"hidden_size": 64, "num_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
            "data": {"train_files": [str(TOY_DATA / "add_4.jsonl")]},
            "reward": {"fn": TOY_REWARD, "workers": reward_workers},
            "actor": {"lr": 1.0e-3},
            # the KL in the reward under an adaptive controller too: its coefficient is state that an
            # interrupted run must carry over (from metrics.jsonl) to end as the uninterrupted one does
            "algorithm": {"clip_eps": 0.2, "kl_coef": 0.05, "use_kl_in_reward": True,
                          "kl_ctrl": {"type": "adaptive", "kl_coef": 0.05, "target_kl": 0.001, "horizon": 16}},
            "rollout": {"backend": "hf", "max_new_tokens": 3},
        }
    cfg["cluster"]["component_placement"] = {"actor": "0-1", "rollout": "2", "inference": "3"}
    cfg["train"]["minibatch_order"] = "index"
    return cfg


def start_run(config: Path) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "run", str(config), "--no-inspect"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_until_stopped(config: Path, run_dir: Path, at_iteration: int, timeout: float = 900) -> str:
    """Start the run of ``config``, ask it to stop at the gate of ``at_iteration``; its output once it
    stopped there (exit code 3 asserted)."""
    proc = start_run(config)
    wait_until("the run dir", lambda: (run_dir / "control").is_dir())
    assert request_stop(run_dir, "test", at_iteration=at_iteration)
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 3, out  # EXIT_STOPPED
    return out


def wait_until(what: str, done, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for {what}")
        time.sleep(0.05)


def outcome(run_dir: Path) -> list[dict[str, Any]]:
    """What must not change when a run is interrupted: per iteration its prompts (data order), samples,
    mini-batches, rewards, consumed samples, the policy versions trained on and per-step losses (None on the
    emulated compute)."""
    keys = ("iteration", "prompts_digest", "samples", "minibatches", "reward_mean", "consumed_samples",
            "staleness/counts")
    return [{**{k: m.get(k) for k in keys}, "losses": m.get("losses"), "kl_coef": m.get("kl_ctrl/kl_coef"),
             "critic_losses": m.get("critic/vf_losses")} for m in read_metrics(run_dir)]


def assert_same_outcome(got: Path, ref: Path, iterations: int = ITERATIONS, params_rtol: float = 1e-6) -> None:
    a, b = outcome(got), outcome(ref)
    assert [m["iteration"] for m in a] == list(range(iterations)), a
    for x, y in zip(a, b):
        floats = ("losses", "kl_coef", "critic_losses")
        assert {k: v for k, v in x.items() if k not in floats} == {k: v for k, v in y.items() if k not in floats}
        # the adaptive kl_ctrl's coefficient (O(0.05)): carried over a resume, up to the float noise of its KL input
        assert x["kl_coef"] == (None if y["kl_coef"] is None else pytest.approx(y["kl_coef"], rel=1e-6))
        assert (x["losses"] is None) == (y["losses"] is None)
        assert_losses_match(x["losses"] or [], y["losses"] or [])
        assert (x["critic_losses"] is None) == (y["critic_losses"] is None)  # PPO's critic: its value losses too
        assert_losses_match(x["critic_losses"] or [], y["critic_losses"] or [])
    if (ref / "checkpoints" / "final" / "model.safetensors").exists():  # the real actor: final parameters too
        assert_params_match(got, ref, rtol=params_rtol)


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory):
    """One uninterrupted run per backend, made on first use (once per session, across xdist workers)."""
    return runs_per_backend(tmp_path_factory, "reference", run_config)


def without_kl(cfg: dict) -> dict:
    """``cfg`` (of :func:`run_config`) without a KL to the reference, in the loss or in the reward.

    For two runs whose log-probs come from different kernels (packed and padded rows). Where a step's advantages are
    all zero (iteration 0's first mini-batch here: its groups' rewards are equal), the KL is its whole gradient, and at
    iteration 0 (the policy is the reference) that gradient is the difference of two fp32 log-probs of the same
    weights: exactly zero where both are computed by the same kernel (padded), float noise (~1e-7) where not
    (packed). Adam divides a gradient by its own magnitude, so noise takes a step of up to ``lr``: measured on an AMD
    EPYC host, a packed collocated run's second loss -1.3e-5 against 0.0 and an embedding row 1.6e-3 of its tensor's
    largest entry apart (an Intel host had happened to agree). Without the KL, such a step's gradient is exactly
    zero on both paths, and every other step's is the advantages' (of order 1), where fp32 noise stays noise."""
    cfg["algorithm"] = {k: v for k, v in cfg["algorithm"].items() if k not in ("use_kl_in_reward", "kl_ctrl")}
    cfg["algorithm"]["kl_coef"] = 0.0
    return cfg


@pytest.fixture(scope="session")
def packed_reference(tmp_path_factory: pytest.TempPathFactory):
    """The padded reference of the packed runs (:func:`without_kl` of :func:`run_config`), once per session."""
    return runs_per_backend(tmp_path_factory, "reference-no-kl", lambda b, d: without_kl(run_config(b, d)))
