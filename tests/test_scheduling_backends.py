"""Scheduling behaviours of the one iteration protocol, each test parametrised over both computes.

``emulated`` runs 8 ranks with the cost model; ``cpu`` runs 4 ranks with the real engines
(megatron-core actor, hf rollout, reference scorer over gloo). The assertions are the same: where
a placement changed, which mini-batch trained on which ranks, and that every sample id was
produced once by rollout and trained once by the actor.
"""

from __future__ import annotations

import math
import json
from collections import Counter
from pathlib import Path

import pytest

from slurm_rl.control.acks import read_reshards
from slurm_rl.control.epochs import Epoch, EpochStore
from slurm_rl.control.events import read_events
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.progress import read_all_progress
from slurm_rl.data.migration import pending_dir
from slurm_rl.data.reader import StageReader
from slurm_rl.inspect.report import read_metrics
from slurm_rl.rl.tokenizer import CharTokenizer
from identity import assert_losses_match, assert_params_match
from test_live_scheduling import _run as run, live_config
from toy_data import TOY_DATA, TOY_REWARD, TOY_REWARD_WORKERS

BACKENDS = ["emulated", "cpu"]


def cpu_config(run_dir: Path, policy: str, iterations: int = 2, **cluster) -> dict:
    """4 real ranks (actor 0, rollout 1-2, inference 3), 128 samples and 4 mini-batches per
    iteration; valid actor DP sizes 1, 2, 4; 32 running requests per rollout instance, so auto
    releases one rollout rank (and grows the actor) while a quarter of the requests is left."""
    return {
        "cluster": {"num_nodes": 1, "gpus_per_node": 4, "auto_scheduler": policy in ("auto", "plan"),
                    "component_placement": {"actor": "0", "rollout": "1-2", "inference": "3"}, **cluster},
        "runtime": {"device": "cpu", "run_dir": str(run_dir), "wait_timeout_s": 120.0, "ack_timeout_s": 120.0,
                    "heartbeat_timeout_s": 60.0, "run_timeout_s": 600.0},
        "train": {"num_iterations": iterations, "rollout_batch_size": 32, "group_size": 4, "global_batch_size": 32,
                  "micro_batch_size": 8, "minibatch_order": "index"},
        "scheduler": {"policy": policy, "max_running_requests": 32},
        "model": {"hidden_size": 64, "num_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
        "data": {"train_files": [str(TOY_DATA / "copy_6.jsonl")]},
        "reward": {"fn": TOY_REWARD, "workers": TOY_REWARD_WORKERS},
        "actor": {"lr": 1.0e-3},
        "algorithm": {"clip_eps": 0.2, "kl_coef": 0.05},
        "rollout": {"backend": "hf", "sub_batch": 4, "max_new_tokens": 7},
    }


def config(device: str, run_dir: Path, policy: str, iterations: int = 2, **cluster) -> dict:
    if device == "cpu":
        return cpu_config(run_dir, policy, iterations, **cluster)
    return live_config(run_dir, policy, iterations, **cluster)


def samples_per_iteration(cfg: dict) -> int:
    return cfg["train"]["rollout_batch_size"] * cfg["train"]["group_size"]


def stage_ids(run_dir: Path, k: int, stage: str, producers: list[int] | None) -> Counter:
    table = StageReader(run_dir, k, stage, producers, timeout_s=5).read_all()
    return Counter(table.column("sample_id").to_pylist())


def check_every_sample_once(run_dir: Path, cfg: dict, leader: int = 0) -> None:
    """Every sample id of every iteration was produced once by rollout and trained once."""
    n = samples_per_iteration(cfg)
    for k in range(cfg["train"]["num_iterations"]):
        expected = {k * 10**9 + i for i in range(n)}
        rollouts = stage_ids(run_dir, k, "rollouts", None)
        assert set(rollouts) == expected and max(rollouts.values()) == 1, k
        trained = stage_ids(run_dir, k, "actor_batch", [leader])
        assert set(trained) == expected and max(trained.values()) == 1, k


def plans(run_dir: Path, k: int) -> list[dict]:
    return json.loads((run_dir / "data" / f"iter-{k:06d}" / "actor_batch" / "plan.json").read_text())["minibatches"]


def epochs_of(run_dir: Path) -> list[Epoch]:
    return EpochStore(RunPaths(run_dir)).all()


# emulated, auto's two mid-iteration decisions lie ~0.2 s apart in the rollout's tail: a coordinator starved
# of CPU by the rest of the suite (load 12-19 on 2 cores) saw the tail only once it had ended (one decision)
@pytest.mark.slow
@pytest.mark.parametrize("device", [pytest.param("emulated", marks=pytest.mark.serial(seconds=4)), "cpu"])
def test_auto_grows_the_actor_at_a_minibatch_boundary(tmp_path: Path, device: str) -> None:
    """auto changes placement at least twice inside an iteration; the actor grows at a stamped
    mini-batch boundary, in place (reshard records with bytes), and shrinks back at the gate. The placement is
    RLinf's dynamic example's: ``reward: all`` beside the disaggregated actor, rollout and inference."""
    cfg = config(device, tmp_path / "run", "auto")
    cfg["cluster"]["component_placement"] = {**cfg["cluster"]["component_placement"], "reward": "all"}
    run_dir = run(tmp_path, "auto", cfg)
    paths = RunPaths(run_dir)
    decisions = read_events(paths, "decision")
    epochs = {e.epoch: e for e in epochs_of(run_dir)}
    initial_actor = epochs[0].ranks_of("actor")
    grew_inside = 0
    for k in range(2):
        mid = [d for d in decisions if d["iteration"] == k and d["mid_iteration"]]
        assert len(mid) >= 2, decisions
        plan = plans(run_dir, k)
        dps = [p["dp"] for p in plan]
        # the actor trained a later mini-batch of the iteration on more ranks than an earlier one
        if any(b > a for a, b in zip(dps, dps[1:])) or dps[0] > len(initial_actor):
            grew_inside += 1
        for p in plan:  # each mini-batch trained on the actor ranks of the epoch it was stamped with
            assert p["dp"] == len(epochs[p["epoch"]].ranks_of("actor"))
    assert grew_inside == 2, [plans(run_dir, k) for k in range(2)]
    grown = [e for e in epochs.values() if e.boundary == "minibatch" and len(e.ranks_of("actor")) > len(initial_actor)]
    assert grown
    moved = [r["figures"] for e in grown for r in read_reshards(paths, e.epoch)]
    assert moved and sum(f["bytes_received"] for f in moved) > 0  # joiners received the state in place
    starts = [e for e in epochs.values() if e.boundary == "iteration" and e.epoch > 0]
    assert starts and all(e.ranks_of("actor") == initial_actor for e in starts)
    check_every_sample_once(run_dir, cfg)
    metrics = read_metrics(run_dir)
    assert [m["samples"] for m in metrics] == [samples_per_iteration(cfg)] * 2
    if device == "cpu":  # the real actor trained every mini-batch: four optimizer steps per iteration
        assert [len(m["losses"]) for m in metrics] == [4, 4]
        assert [m["consumed_samples"] for m in metrics] == [128.0, 256.0]


@pytest.mark.slow
@pytest.mark.parametrize("device", BACKENDS)
def test_pre_process_lends_actor_ranks_to_rollout(tmp_path: Path, device: str) -> None:
    """With ``use_pre_process_policy`` every iteration starts with rollout on the actor's ranks
    too (no actor); the actor gets its ranks back once enough requests finished."""
    cfg = config(device, tmp_path / "run", "auto", use_pre_process_policy=True)
    cfg["scheduler"]["pre_process_threshold"] = 0.5
    run_dir = run(tmp_path, "pre", cfg)
    epochs = epochs_of(run_dir)
    actor0 = epochs[0].ranks_of("actor")
    starts = [e for e in epochs if e.boundary == "iteration" and e.epoch > 0]
    assert len(starts) == 2
    for start in starts:
        assert start.ranks_of("actor") == [] and set(actor0) <= set(start.ranks_of("rollout"))
    for k in range(2):
        returned = [e for e in epochs if e.iteration == k and e.boundary == "minibatch"
                    and set(actor0) <= set(e.ranks_of("actor"))]
        assert returned, [(e.epoch, e.iteration, e.placement) for e in epochs]
        assert all(p["dp"] >= len(actor0) for p in plans(run_dir, k))
    check_every_sample_once(run_dir, cfg, leader=actor0[0])
    # the cutter counted the complete groups it received (the actor's data, ``actor_ready``),
    # also while the actor held no ranks: at the end, every sample of the last iteration
    last = read_all_progress(RunPaths(run_dir), [actor0[0]])[actor0[0]]
    assert last.iteration == 1, last
    assert last.counters.actor_ready == last.counters.actor_received == samples_per_iteration(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("device", BACKENDS)
def test_wait_before_last_iter_gives_the_actor_every_rank(tmp_path: Path, device: str) -> None:
    """With ``use_wait_before_last_iter_policy`` the last mini-batch of each iteration trains on
    the whole allocation once rollout and inference finished."""
    cfg = config(device, tmp_path / "run", "auto", use_wait_before_last_iter_policy=True)
    run_dir = run(tmp_path, "wait", cfg)
    world = cfg["cluster"]["gpus_per_node"]
    epochs = {e.epoch: e for e in epochs_of(run_dir)}
    for k in range(2):
        last = plans(run_dir, k)[-1]
        assert last["dp"] == world and epochs[last["epoch"]].ranks_of("actor") == list(range(world))
    check_every_sample_once(run_dir, cfg)


@pytest.mark.slow
@pytest.mark.parametrize("device", BACKENDS)
def test_rollout_shrinks_mid_iteration_with_exact_sample_accounting(tmp_path: Path, device: str) -> None:
    """A scripted epoch in the rollout phase releases rollout ranks while they generate: they hand
    their unfinished requests back, the others claim them, and every sample is produced once."""
    cfg = config(device, tmp_path / "run", "scripted", iterations=1)
    before = cfg["cluster"]["component_placement"]
    keep = "2-3" if device == "emulated" else "1"
    cfg["scheduler"]["script"] = [{"at_iteration": 0, "at_phase": "rollout", "at_rollout_fraction": 0.25,
                                   "placement": {**before, "rollout": keep}}]
    run_dir = run(tmp_path, "shrink", cfg)
    epochs = epochs_of(run_dir)
    assert len(epochs) == 2 and epochs[1].boundary == "now" and epochs[1].iteration == 0
    released = sorted(set(epochs[0].ranks_of("rollout")) - set(epochs[1].ranks_of("rollout")))
    tickets = [json.loads(p.read_text()) for p in pending_dir(run_dir, 0).glob("claimed-*.json")]
    migrated = [sid for t in tickets for sid in t["sample_ids"]]
    assert migrated and len(migrated) == len(set(migrated))
    assert {t["from_rank"] for t in tickets} <= set(released)
    assert list(pending_dir(run_dir, 0).glob("pending-*.json")) == []  # every handed-back request was claimed
    acked = sum(json.loads(RunPaths(run_dir).ack(1, r).read_text())["figures"].get("migrated_requests", 0)
                for r in released)
    assert acked == len(migrated)
    check_every_sample_once(run_dir, cfg)


@pytest.mark.slow
def test_training_is_identical_with_and_without_scaling(tmp_path: Path) -> None:
    """RLinf's consistency claim, tested: a real run under auto (several mid-iteration epochs, the
    actor's DP changing inside iterations) gives the same per-step losses and final parameters as
    the static run of the same config (fp32, same seeds, ``train.minibatch_order: index``).

    The runs use the options whose terms span the data parallel ranks (every other real run here
    uses GRPO with a token mean): PPO with a critic, whose GAE advantages (gamma 0.9, lambda 0.95: one per
    token) are whitened over each mini-batch, each sequence's token mean averaged over the step's
    sequences, clip-higher, the k2 KL loss and the entropy bonus (its mean entropy recorded per
    iteration). The critic trains on the actor's ranks and changes DP with it: its value losses and final
    weights match too. (The advantages themselves are computed by the cutter on whole mini-batches before
    any DP split, whatever the estimator: ``test_rl_algorithms`` checks each against verl's formulas.)"""
    results = {}
    for policy in ("static", "auto", "auto-packed"):
        cfg = cpu_config(tmp_path / policy, policy.split("-")[0], iterations=3)
        cfg["algorithm"] |= {"adv_estimator": "gae", "gamma": 0.9, "lam": 0.95, "loss_agg_mode": "seq-mean-token-mean",
                             "clip_ratio_high": 0.28, "kl_loss_type": "k2", "entropy_coeff": 0.01}
        cfg["cluster"]["component_placement"] = {"actor,critic": "0", "rollout": "1-2", "inference": "3"}
        if policy == "auto-packed":  # packed micro-batches (actor, critic, scorers) in bins of 64 tokens, DP-balanced
            cfg["train"] |= {"use_remove_padding": True, "max_tokens_per_microbatch": 64, "balance_batch": True}
        results[policy] = run(tmp_path, policy, cfg)
    dps = {policy: [[p["dp"] for p in m["plan"]] for m in read_metrics(d)] for policy, d in results.items()
           if policy != "auto-packed"}
    assert all(len(set(it)) > 1 for it in dps["auto"]), dps  # the actor's DP changed inside every iteration
    assert dps["static"] == [[1] * 4] * 3
    losses = {policy: [x for m in read_metrics(d) for x in m["losses"]] for policy, d in results.items()
              if policy != "auto-packed"}
    assert len(losses["static"]) == 12
    assert_losses_match(losses["auto"], losses["static"])
    critic = {policy: [x for m in read_metrics(d) for x in m["critic/vf_losses"]] for policy, d in results.items()
              if policy != "auto-packed"}
    assert len(critic["static"]) == 12
    assert_losses_match(critic["auto"], critic["static"])
    assert (results["auto"] / "checkpoints" / "final" / "critic" / "model.safetensors").exists()
    assert_params_match(results["auto"], results["static"], rtol=1e-5)  # the actor's and the critic's
    # packed and balanced, scaled: the same steps as the padded static run within the same float noise
    assert all(len({p["dp"] for p in m["plan"]}) > 1 for m in read_metrics(results["auto-packed"]))
    assert_losses_match([x for m in read_metrics(results["auto-packed"]) for x in m["losses"]], losses["static"])
    assert_losses_match([x for m in read_metrics(results["auto-packed"]) for x in m["critic/vf_losses"]],
                        critic["static"])
    # packing reshapes every matmul (one row per bin, not padded rows): fp32 rounding of every log-prob, not only
    # of the DP reduction; after 12 Adam steps measured 1.4e-5 of the largest entry (fc2), 3e-5 allowed
    assert_params_match(results["auto-packed"], results["static"], rtol=3e-5)
    entropy = {policy: [m["entropy"] for m in read_metrics(d)] for policy, d in results.items()}
    vocab = CharTokenizer().vocab_size  # the random model's vocabulary
    assert all(0 < e < math.log(vocab) for e in entropy["static"]), entropy  # nats, below a uniform distribution's
    assert entropy["auto"] == pytest.approx(entropy["static"], abs=1e-4), entropy
