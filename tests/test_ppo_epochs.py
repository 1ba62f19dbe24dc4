"""``actor.ppo_epochs``: every pass over an iteration's mini-batches, on both computes. The later
passes retrain the first pass's mini-batches in order (same samples, advantages and old log-probs)
once it is done; the LR schedule and the data position count each sample once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from identity import assert_losses_match
from resume_helpers import ITERATIONS, launch, run_config
from slurm_rl.data.reader import StageReader
from slurm_rl.metrics import read_metrics
from test_scheduling_backends import plans, samples_per_iteration

PASSES = 2


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["emulated", "cpu"])
def test_later_passes_retrain_the_first_passs_minibatches(backend: str, reference, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = run_config(backend, run_dir, keep_iterations=10)  # every iteration's batches stay readable
    cfg.setdefault("actor", {})["ppo_epochs"] = PASSES
    launch(tmp_path / "c.yaml", cfg, "--no-inspect")
    n = samples_per_iteration(cfg)
    per_pass = n // cfg["train"]["global_batch_size"]
    metrics, solo = read_metrics(run_dir), read_metrics(reference(backend))
    assert [m["iteration"] for m in metrics] == list(range(ITERATIONS))
    for k, (m, one) in enumerate(zip(metrics, solo)):
        assert m["minibatches"] == PASSES * per_pass and m["samples"] == n
        assert m["consumed_samples"] == one["consumed_samples"]  # the schedule counts each sample once
        plan = plans(run_dir, k)
        assert [e["ppo_epoch"] for e in plan] == [i // per_pass for i in range(PASSES * per_pass)]
        batch = StageReader(run_dir, k, "actor_batch", [0], timeout_s=5).read_all()
        ids = batch.column("sample_id").to_pylist()
        first, later = ids[:n], ids[n:]
        assert sorted(first) == [k * 10**9 + i for i in range(n)] and later == first  # same order, every pass
        assert batch.column("advantage").to_pylist()[n:] == batch.column("advantage").to_pylist()[:n]
        assert Counter(ids) == Counter({i: PASSES for i in first})
    if backend == "cpu":
        # the first step is the one-pass run's; later passes train on (and move away from) the same data
        assert_losses_match(metrics[0]["losses"][:1], solo[0]["losses"][:1])
        assert len(metrics[0]["losses"]) == PASSES * per_pass
        assert metrics[-1]["losses"] != solo[-1]["losses"]
