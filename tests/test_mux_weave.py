"""The weave trace: RL jobs drawn from the RollMux paper's published statistics (mux.trace_weave)."""

from __future__ import annotations

import random
import statistics

import pytest

from cli_command import tool

from slurm_rl.mux.trace_weave import (BUDGETS, MEAN_GENERATED, WEAVE_SIZES, WeaveSpec, capped_mean,
                                      generate_weave, generated_tokens, mu_for_capped_mean, statistics_table)


@pytest.fixture(scope="module")
def jobs():
    return generate_weave(WeaveSpec(seed=0))


def test_capped_lognormal_mean_is_solved_and_sampled() -> None:
    mu = mu_for_capped_mean(0.788 * 8192, 1.0, 8192)
    assert capped_mean(mu, 1.0, 8192) == pytest.approx(0.788 * 8192, rel=1e-9)
    rng = random.Random(0)
    draws = [min(8192.0, rng.lognormvariate(mu, 1.0)) for _ in range(20000)]
    assert statistics.mean(draws) == pytest.approx(0.788 * 8192, rel=0.02)  # 20k draws: ~0.3 % s.e.
    with pytest.raises(ValueError, match="must be in"):
        mu_for_capped_mean(9000, 1.0, 8192)


def test_weave_trace_has_the_papers_statistics(jobs) -> None:
    assert len(jobs) == 200
    span_days = (jobs[-1].arrival_s - jobs[0].arrival_s) / 86400
    assert 10 < span_days < 18  # Poisson: two weeks on average
    assert {j.model_b for j in jobs} == set(WEAVE_SIZES) and {j.max_response_len for j in jobs} == set(BUDGETS)
    gen = statistics.mean(generated_tokens(j) for j in jobs)
    assert gen == pytest.approx(MEAN_GENERATED, rel=0.05)
    ratios = [j.expected_rollout_s() / j.expected_train_s() for j in jobs if j.kind == "agentic"]
    assert ratios and all(3.0 - 1e-9 <= r <= 4.0 + 1e-9 for r in ratios)
    assert {j.kind for j in jobs} == {"reasoning", "agentic"} and all(1.0 <= j.slo <= 2.0 for j in jobs)
    rows = {r["quantity"]: r for r in statistics_table(jobs)}
    assert rows["jobs"]["paper"] == 200 and rows["mean generated tokens"]["ours"] == round(gen)


def test_weave_trace_is_deterministic_per_seed(jobs) -> None:
    again = generate_weave(WeaveSpec(seed=0, jobs=5))
    assert [(j.name, j.arrival_s, j.iterations, j.response_s) for j in again] == \
        [(j.name, j.arrival_s, j.iterations, j.response_s) for j in jobs[:5]]
    assert generate_weave(WeaveSpec(seed=1, jobs=5))[0].arrival_s != jobs[0].arrival_s


@pytest.mark.slow  # three bench_mux processes (the weave jobs run ~100 iterations each)
def test_bench_mux_weave_prints_ratios_mix_and_the_arrival_table() -> None:
    import json
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([*tool("bench_mux.py"), "--trace", "weave", "--jobs", "3",
                           "--seeds", "0"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)["runs"][0]
    assert {"mux/solo", "mux/colocated", "mux/gavel_plus", "hybrid/colocated"} <= set(run["ratios"])
    assert sum(run["placement_mix"]["mux"].values()) == 3 and run["placement_mix"]["mux"]["new"] >= 1
    assert run["usd_per_h_over_solo_span"]["solo"] > 0 and "mean generated tokens" in proc.stderr
    proc = subprocess.run([*tool("bench_mux.py"), "--jobs", "3", "--seeds", "0",
                           "--arrivals", "mux"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split()[:3] == ["job", "t_h", "kind"] and lines[2].split()[0] == "job000"
    assert "no group" in lines[2] and "decision -> binding constraint" in proc.stdout
    bad = subprocess.run([*tool("bench_mux.py"), "--arrivals", "nope"], cwd=repo,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--arrivals: got 'nope'" in bad.stderr
