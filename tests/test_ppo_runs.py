"""PPO with a critic (``algorithm.adv_estimator: gae``, the critic on the actor's ranks) through whole
runs on both computes: the actor batches carry GAE of the critic's values, and a run stopped at
iteration 2 and resumed ends as the uninterrupted one (the critic's value losses and, on cpu, its
final weights included). The critic's DP changing inside iterations: ``test_scheduling_backends``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from resume_helpers import BACKENDS, assert_same_outcome, cli, launch, run_config, run_until_stopped, shared_root, shared_run
from slurm_rl.data.actor_batch import kl_per_token
from slurm_rl.data.reader import StageReader
from slurm_rl.metrics import read_metrics
from slurm_rl.rl.advantages import compute_gae, token_level_rewards

GAE = {"adv_estimator": "gae", "gamma": 0.99, "lam": 0.95}


def ppo_config(backend: str, run_dir: Path) -> dict:
    cfg = run_config(backend, run_dir, keep_iterations=10)
    cfg["algorithm"] = {**cfg.get("algorithm", {}), **GAE}
    # no inference ranks: the actor's leader scores the critic's values (and the reference); the inference
    # ranks' copy of the critic: the one-GPU PPO run of test_collocated and test_scheduling_backends' gae run
    cfg["cluster"]["component_placement"] = {"actor,critic": "0-1", "rollout": "2-3"}
    if backend == "cpu":
        cfg["critic"] = {"lr": 2.0e-3, "cliprange_value": 0.5}
        cfg["train"] = {**cfg.get("train", {}), "critic_warmup": 2}  # verl's: iteration 0 trains the critic only
    return cfg


@pytest.fixture(scope="session")
def ppo_reference(tmp_path_factory: pytest.TempPathFactory):
    """One uninterrupted PPO run per backend, made on first use (once per session, across xdist workers)."""
    root = shared_root(tmp_path_factory)

    def get(backend: str) -> Path:
        return shared_run(root, f"ppo-{backend}", lambda base: (
            base / "run", launch(base / "c.yaml", ppo_config(backend, base / "run"), "--no-inspect")))[0]

    return get


@pytest.mark.slow  # whole runs: the suite's, not the quick loop's (the keys check below is quick)
@pytest.mark.parametrize("backend", BACKENDS)
def test_actor_batches_carry_gae_of_the_critics_values(backend: str, ppo_reference) -> None:
    """Every mini-batch's per-token advantages and returns are GAE (gamma 0.99, lambda 0.95) of its own
    token-level rewards (the KL in the reward, at the iteration's coefficient, on cpu) and the critic's
    values, whitened over the mini-batch; on cpu the critic trained every step and its values moved."""
    run_dir = ppo_reference(backend)
    metrics = read_metrics(run_dir)
    assert len(metrics) == 4
    for k, m in enumerate(metrics):
        table = StageReader(run_dir, k, "actor_batch", [0], timeout_s=5).read_all()
        per = m["samples"] // m["minibatches"]
        assert table.column("values").null_count == 0 and table.num_rows == m["samples"]
        for start in range(0, table.num_rows, per):
            batch = table.slice(start, per).to_pylist()
            lengths = np.array([len(r["response_ids"]) for r in batch])
            kl, coef = None, 0.0
            if m.get("kl_ctrl/kl_coef") is not None:  # cpu: the KL in the reward, per token
                kl = kl_per_token([r["old_logprobs"] for r in batch], [r["ref_logprobs"] for r in batch], "kl")
                coef = m["kl_ctrl/kl_coef"]
            rewards = token_level_rewards(np.array([r["reward"] for r in batch]), lengths, kl, coef)
            adv, ret = compute_gae(rewards, [np.array(r["values"], np.float64) for r in batch], 0.99, 0.95)
            for row, a, r in zip(batch, adv, ret):  # float32 columns of O(1) values
                assert np.allclose(row["token_advantages"], a, atol=1e-4), (k, row["sample_id"])
                assert np.allclose(row["returns"], r, atol=1e-4), (k, row["sample_id"])
    if backend == "cpu":
        assert all(len(m["critic/vf_losses"]) == m["minibatches"] and m["critic/lr"] == 2.0e-3 for m in metrics)
        assert all(0.0 <= m["critic/vf_clipfrac"] <= 1.0 for m in metrics)
        # train.critic_warmup 2: no actor step in iteration 0, one per mini-batch after it, with verl's metrics
        assert metrics[0]["losses"] == [] and "actor/pg_clipfrac" not in metrics[0]
        for m in metrics[1:]:
            assert len(m["losses"]) == m["minibatches"] and 0.0 <= m["actor/pg_clipfrac"] <= 1.0
            assert 0.0 <= m["actor/pg_clipfrac_lower"] <= 1.0 and np.isfinite(m["actor/ppo_kl"])
        # so iteration 1 samples from the initial weights: its old log-probs (the rollout engine's, whose weights
        # the actor synced; no inference ranks) are the reference's (the initial policy's) to fp32 noise
        # (measured 5e-7); iteration 2's are not (0.26)
        def gap(k: int) -> float:
            rows = StageReader(run_dir, k, "actor_batch", [0], timeout_s=5).read_all().to_pylist()
            return max(abs(a - b) for r in rows for a, b in zip(r["old_logprobs"], r["ref_logprobs"]))
        assert gap(1) < 1e-4 < 1e-2 < gap(2), (gap(1), gap(2))
        first = StageReader(run_dir, 0, "actor_batch", [0], timeout_s=5).read_all().column("values").to_pylist()
        last = StageReader(run_dir, 3, "actor_batch", [0], timeout_s=5).read_all().column("values").to_pylist()
        assert np.mean([abs(v) for vs in first for v in vs]) != pytest.approx(np.mean([abs(v) for vs in last for v in vs]))
        assert (run_dir / "checkpoints" / "final" / "critic" / "model.safetensors").exists()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_ppo_run_stopped_and_resumed_ends_as_the_uninterrupted_one(backend: str, ppo_reference,
                                                                   tmp_path: Path) -> None:
    """The critic's state (weights, Adam moments, LR schedule) is in the run checkpoint: the resumed run
    has the same rewards, actor and critic losses and (cpu) final actor and critic weights."""
    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(ppo_config(backend, run_dir)))
    run_until_stopped(config, run_dir, at_iteration=2)
    if backend == "cpu":
        assert (run_dir / "checkpoints" / "iter-000002" / "critic" / "model.safetensors").exists()
    resumed = cli("run", "--resume", str(run_dir), "--no-inspect")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # The critic's values come from a transformers copy scoring the responses in the shards they arrive in: the
    # shards' make-up follows the decoders' timing, and fp32 results move by ~1e-7 with a batch's shape. GAE
    # passes the values on one to one (not damped by a coefficient, as the reference's KL is), so the final
    # weights of two runs agree to ~1e-5 of their largest entry (measured: 8e-7 on 0.078), the tolerance of
    # the auto-versus-static identity; rewards and per-step losses are held as for every resume.
    assert_same_outcome(run_dir, ppo_reference(backend), params_rtol=1e-5)


def test_critic_placement_and_keys_are_checked(tmp_path: Path) -> None:
    """A critic on ranks of its own, a critic without gae, gae at actor TP 2, a bad cliprange, a critic warmup
    without a critic: exit 2, each naming its key."""
    from emulated_configs import write_config

    cases = [
        ({"cluster": {"component_placement": {"actor": "0-1", "critic": "0-1", "rollout": "2", "inference": "3"}}},
         "'critic' in the actor's entry"),
        ({"algorithm": {"adv_estimator": "grpo"}}, "no critic unless algorithm.adv_estimator is gae"),
        ({"cluster": {"component_placement": {"actor": "0-1", "rollout": "2-3"}}}, "a critic in cluster.component_placement"),
        ({"actor": {"tensor_parallel": 2}}, "actor.tensor_parallel"),
        ({"critic": {"cliprange_value": -1}}, "critic.cliprange_value"),
        ({"algorithm": {"adv_estimator": "grpo"}, "train": {"critic_warmup": 2},
          "cluster": {"component_placement": {"actor": "0-1", "rollout": "2-3"}}}, "train.critic_warmup: got 2"),
    ]
    ok = cli("validate", str(write_config(tmp_path / "ok.yaml", ppo_config("emulated", tmp_path / "ok"))))
    assert ok.returncode == 0 and "critic     on the actor's ranks" in ok.stdout, ok.stdout + ok.stderr
    for i, (change, message) in enumerate(cases):
        cfg = ppo_config("emulated", tmp_path / f"run{i}")
        for section, values in change.items():
            cfg[section] = {**cfg.get(section, {}), **values}
        proc = cli("validate", str(write_config(tmp_path / f"c{i}.yaml", cfg)))
        assert proc.returncode == 2 and message in proc.stderr, (change, proc.stdout + proc.stderr)
