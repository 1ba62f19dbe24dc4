"""PPO with a critic (``algorithm.adv_estimator: gae``, the critic on the actor's ranks or on its own)
through whole runs on both computes: the actor batches carry GAE of the critic's values, and a run stopped
at iteration 2 and resumed ends as the uninterrupted one (the critic's value losses and, on cpu, its final
weights included), with the critic on a rank of its own as with the critic on the actor's. The critic's DP
changing inside iterations: ``test_scheduling_backends``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from identity import assert_losses_match
from resume_helpers import BACKENDS, assert_same_outcome, cli, launch, outcome, run_config, run_until_stopped
from shared_runs import runs_per_backend
from slurm_rl.control.activity import read_spans
from slurm_rl.control.paths import RunPaths
from slurm_rl.data.actor_batch import kl_per_token
from slurm_rl.data.reader import StageReader
from slurm_rl.metrics import read_metrics
from slurm_rl.rl.advantages import compute_gae, token_level_rewards
from slurm_rl.worker.protocol import critic_marker, trained_marker

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
    return runs_per_backend(tmp_path_factory, "ppo", ppo_config)


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


# The critic with the actor (the reference's placement), and on a rank of its own: rank 2 trains only the critic,
# the actor keeps ranks 0-1 and the rollout has one rank
OWN_CRITIC = {"actor": "0-1", "critic": "2", "rollout": "3"}
OWN_CRITIC_RESUMED = {"actor": "0", "critic": "1-2", "rollout": "3"}


@pytest.mark.slow
@pytest.mark.parametrize("critic", ["with-actor", "own-ranks"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_ppo_run_stopped_and_resumed_ends_as_the_uninterrupted_one(backend: str, critic: str, ppo_reference,
                                                                   tmp_path: Path) -> None:
    """The critic's state (weights, Adam moments, LR schedule) is in the run checkpoint: the resumed run
    has the same rewards, actor and critic losses and (cpu) final actor and critic weights. With the critic
    on a rank of its own the run trains exactly as with the critic on the actor's ranks (the reference): its
    rank trains every mini-batch and nothing else, and sends its weights to the rank that scores the values."""
    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    cfg = ppo_config(backend, run_dir)
    if critic == "own-ranks":
        cfg["cluster"]["component_placement"] = OWN_CRITIC
    config.write_text(yaml.safe_dump(cfg))
    run_until_stopped(config, run_dir, at_iteration=2)
    if backend == "cpu":
        assert (run_dir / "checkpoints" / "iter-000002" / "critic" / "model.safetensors").exists()
    # with the critic on its own ranks the resumed run moves it to two ranks, the actor to one (any DP loads)
    moved = [f"cluster.component_placement={json.dumps(OWN_CRITIC_RESUMED)}"] if critic == "own-ranks" else []
    resumed = cli("run", "--resume", str(run_dir), *moved, "--no-inspect")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    if critic == "own-ranks":
        for m in read_metrics(run_dir):
            k = m["iteration"]
            want = ([0, 1], [2]) if k < 2 else ([0], [1, 2])
            for i in range(m["minibatches"]):
                actor = json.loads(trained_marker(run_dir, k, i).read_text())
                own = json.loads(critic_marker(run_dir, k, i).read_text())
                assert (actor["ranks"], own["ranks"]) == want, (k, actor, own)
                assert ("critic/loss" in own) == (backend == "cpu") and "critic/loss" not in actor
        spans = {r: read_spans(RunPaths(run_dir), r) for r in range(4)}
        critic_steps = {r: sorted({s["iteration"] for s in spans[r] if s["kind"] == "critic"}) for r in range(4)}
        assert critic_steps == {0: [], 1: [2, 3], 2: [0, 1, 2, 3], 3: []}, critic_steps
        assert {"critic", "sync"} <= {s["kind"] for s in spans[2]} <= {"critic", "sync", "checkpoint"}
        assert any(s["kind"] == "sync" for s in spans[0])  # the actor's leader scores the values
        shown = cli("inspect", str(run_dir), "--json")  # its ranks' time is the critic's, not idle
        assert shown.returncode == 0, shown.stderr
        components = json.loads(shown.stdout)["components"]
        assert components["critic"]["busy_s"] > 0 and "idle" not in components, components
    # The critic's values come from a transformers copy scoring the responses in the shards they arrive in: the
    # shards' make-up follows the decoders' timing, and fp32 results move by ~1e-7 with a batch's shape. GAE
    # passes the values on one to one (not damped by a coefficient, as the reference's KL is), so the final
    # weights of two runs agree to ~1e-5 of their largest entry (measured: 8e-7 on 0.078), the tolerance of
    # the auto-versus-static identity; rewards and per-step losses are held as for every resume.
    assert_same_outcome(run_dir, ppo_reference(backend), params_rtol=1e-5)


def test_critic_placement_and_keys_are_checked(tmp_path: Path) -> None:
    """A critic on ranks the actor uses, or sharing its own with the rollout, a critic on ranks of its own under
    auto, a critic without gae, a bad cliprange, a critic TP size on the actor's ranks or one its ranks cannot
    hold, a critic warmup without a critic: exit 2, each naming its key; a critic on ranks of its own validates."""
    from emulated_configs import write_config

    cases = [
        ({"cluster": {"component_placement": {"actor": "0-1", "critic": "1-2", "rollout": "3"}}},
         "slot 1 is also used by 'actor'"),
        ({"cluster": {"component_placement": {"actor": "0-1", "critic,rollout": "2-3"}}},
         "'critic' in the actor's entry"),
        ({"cluster": {"component_placement": OWN_CRITIC, "auto_scheduler": True}, "scheduler": {"policy": "auto"}},
         "scheduler.policy: got 'auto'"),
        ({"algorithm": {"adv_estimator": "grpo"}}, "no critic unless algorithm.adv_estimator is gae"),
        ({"cluster": {"component_placement": {"actor": "0-1", "rollout": "2-3"}}}, "a critic in cluster.component_placement"),
        ({"critic": {"cliprange_value": -1}}, "critic.cliprange_value"),
        ({"critic": {"tensor_parallel": 2}}, "critic.tensor_parallel: got 2; allowed: null with the critic on the actor's"),
        ({"cluster": {"component_placement": OWN_CRITIC}, "critic": {"tensor_parallel": 2}},
         "a rank count that is a multiple of the critic's tensor-parallel size 2"),
        ({"algorithm": {"adv_estimator": "grpo"}, "train": {"critic_warmup": 2},
          "cluster": {"component_placement": {"actor": "0-1", "rollout": "2-3"}}}, "train.critic_warmup: got 2"),
    ]
    ok = cli("validate", str(write_config(tmp_path / "ok.yaml", ppo_config("emulated", tmp_path / "ok"))))
    assert ok.returncode == 0 and "critic     on the actor's ranks" in ok.stdout, ok.stdout + ok.stderr
    own = ppo_config("emulated", tmp_path / "own")
    own["cluster"]["component_placement"] = OWN_CRITIC
    ok = cli("validate", str(write_config(tmp_path / "own.yaml", own)))
    assert ok.returncode == 0 and "critic     ranks 2            of its own, TP 1" in ok.stdout, ok.stdout + ok.stderr
    assert "    ranks 2            critic\n" in ok.stdout, ok.stdout
    for i, (change, message) in enumerate(cases):
        cfg = ppo_config("emulated", tmp_path / f"run{i}")
        for section, values in change.items():
            cfg[section] = {**cfg.get(section, {}), **values}
        proc = cli("validate", str(write_config(tmp_path / f"c{i}.yaml", cfg)))
        assert proc.returncode == 2 and message in proc.stderr, (change, proc.stdout + proc.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("critic", ["with-actor", "with-actor-tp-2-to-1", "own-ranks", "own-ranks-critic-tp-2"])
def test_ppo_at_actor_tp_2_trains_as_at_tp_1(critic: str, ppo_reference, tmp_path: Path) -> None:
    """The actor at TP 2 with the critic on its ranks (the critic at TP 2 too, its value head replicated over
    TP; in one run a scripted epoch turns both to TP 1 at iteration 2, resharding the critic's state in place),
    or on a rank of its own (the critic at TP 1 there); or the actor at TP 1 and the critic at TP 2 on ranks
    2-3 of its own (``critic.tensor_parallel``, 5 ranks): the same samples, rewards, actor and critic losses as
    the TP 1 reference (a critic state resharded wrong would move the later value losses far beyond float
    noise), and on its own rank at TP 1 the same final critic. Final weights trained at TP 2 are not
    compared with TP 1's: TP 2 sums the row-parallel products in another order and six Adam steps carry that
    on (measured 4e-5 of the largest entry; the TP identities are test_actor_tp_runs')."""
    from safetensors.torch import load_file

    run_dir = tmp_path / "run"
    cfg = ppo_config("cpu", run_dir)
    if critic == "own-ranks":
        cfg["cluster"]["component_placement"] = OWN_CRITIC
    cfg["actor"] = {**cfg.get("actor", {}), "tensor_parallel": 2}
    if critic == "own-ranks-critic-tp-2":
        cfg["cluster"].update(gpus_per_node=5, component_placement={"actor": "0-1", "critic": "2-3", "rollout": "4"})
        cfg["actor"]["tensor_parallel"] = 1
        cfg["critic"] = {**cfg["critic"], "tensor_parallel": 2}
    if critic == "with-actor-tp-2-to-1":
        cfg["actor"]["tensor_parallel_choices"] = [1, 2]
        cfg["scheduler"] = {**cfg.get("scheduler", {}), "policy": "scripted", "script": [
            {"at_iteration": 2, "placement": {"actor": "0-1", "rollout": "2-3"}, "actor_tp": 1, "reason": "TP 2 -> 1"}]}
    launch(tmp_path / "c.yaml", cfg, "--no-inspect")
    got, want = outcome(run_dir), outcome(ppo_reference("cpu"))
    strip = ("losses", "kl_coef", "critic_losses")
    assert [{k: v for k, v in m.items() if k not in strip} for m in got] == [
        {k: v for k, v in m.items() if k not in strip} for m in want]
    for a, b in zip(got, want):
        assert_losses_match(a["losses"], b["losses"])
        assert_losses_match(a["critic_losses"], b["critic_losses"])
    tps = {"with-actor-tp-2-to-1": [2, 2, 1, 1], "own-ranks-critic-tp-2": [1] * 4}.get(critic, [2] * 4)
    assert [m["actor_tp"] for m in read_metrics(run_dir)] == [[tp] for tp in tps]
    final = Path("checkpoints") / "final" / "critic" / "model.safetensors"
    mine, ref = load_file(str(run_dir / final)), load_file(str(ppo_reference("cpu") / final))
    assert mine.keys() == ref.keys()  # at TP 2 the critic checkpoints whole, as at TP 1
    if critic == "own-ranks":
        for name, tensor in ref.items():
            assert float((mine[name] - tensor).abs().max()) <= 1e-5 * (float(tensor.abs().max()) or 1.0), name
