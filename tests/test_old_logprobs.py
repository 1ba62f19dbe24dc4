"""Old log-probs recomputed with the actor's weights (``algorithm.old_logprobs: actor``, the default
with an inference component), the rollout/actor mismatch reported every iteration, and the
truncated importance-sampling correction (``algorithm.rollout_is: truncated``), on real cpu runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from resume_helpers import run_config
from slurm_rl.data.reader import StageReader
from slurm_rl.inspect.summary import metric_summary
from slurm_rl.inspect.tensorboard import scalars
from slurm_rl.metrics import read_metrics
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_inference_ranks_score_each_iterations_actor_weights(reference) -> None:
    """fp32 everywhere: the inference rank's copy of the actor gives the rollout's log-probs of the
    sampled tokens up to float noise in every iteration, while the policy moves away from the
    reference (a copy left at the initial weights would show that KL as mismatch)."""
    run_dir = reference("cpu")
    metrics = read_metrics(run_dir)
    assert len(metrics) == 4
    for m in metrics:
        assert 0.0 <= m["mismatch/kl"] <= 1e-9 and m["mismatch/max_abs"] <= 1e-5, m
    assert metrics[-1]["kl"] > 1e-3
    # what inspect and TensorBoard show of it
    assert metric_summary(metrics)["mismatch/max_abs"]["n"] == 4
    tags = {tag for tag, *_ in scalars(run_dir)}
    assert {"mismatch/kl", "mismatch/max_abs", "train/kl"} <= tags


@pytest.mark.slow
def test_bf16_actor_mismatch_is_reported_and_truncated_is_weights_reach_the_actor(tmp_path: Path) -> None:
    """A bf16 actor against the fp32 hf rollout engine: a real mismatch, measured each iteration; each
    actor batch carries min(pi_actor / pi_rollout, cap) per token. The same run shapes overlong rewards."""
    run_dir = tmp_path / "run"
    cfg = run_config("cpu", run_dir, keep_iterations=10)
    cfg["actor"]["precision"] = "bf16"
    cfg["algorithm"].update(rollout_is="truncated", rollout_is_cap=1.0005)
    # DAPO's overlong shaping on the same run: responses past 1 of the 3 new tokens lose 0.5 per token
    cfg["reward"] = {**cfg["reward"], "overlong_buffer": {"enable": True, "len": 2, "penalty_factor": 1.0}}
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([*CLI, "run", str(config), "--no-inspect"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    for m in metrics:  # bf16 rounding of ~1e-3 in log-probs of O(1), far from fp32's ~1e-7
        assert 1e-5 < m["mismatch/max_abs"] < 0.1 and m["mismatch/kl"] > 0.0, m
    truncated, shaped = 0, []
    for k in range(len(metrics)):
        scored = StageReader(run_dir, k, "inference", None, timeout_s=5).read_all()
        for ids, reward in zip(scored.column("response_ids").to_pylist(), scored.column("reward").to_pylist()):
            penalty = min(-(len(ids) - 1) / 2, 0.0)
            assert -1e-6 <= reward - penalty <= 1 + 1e-6  # the toy reward is in [0, 1]
            shaped.append(reward)
        sampled = dict(zip(scored.column("sample_id").to_pylist(), scored.column("sampled_logprobs").to_pylist()))
        batch = StageReader(run_dir, k, "actor_batch", [0], timeout_s=5).read_all()  # cut by the leader, rank 0
        assert batch.num_rows == len(sampled)
        for sid, old, w in zip(batch.column("sample_id").to_pylist(), batch.column("old_logprobs").to_pylist(),
                               batch.column("rollout_is_weights").to_pylist()):
            assert old != sampled[sid] or not old  # the actor's log-probs, not the rollout's
            want = np.minimum(np.exp(np.asarray(old, np.float64) - np.asarray(sampled[sid], np.float64)), 1.0005)
            assert np.allclose(w, want, atol=1e-6)
            truncated += int(np.sum(np.isclose(w, 1.0005)))
    assert truncated > 0  # the cap bit on some tokens
    assert min(shaped) < 0  # only the shaping makes a reward negative
