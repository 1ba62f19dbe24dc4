"""The off-policy corrections of the actor's loss against the papers' formulas, written out (fixed tensors, fp64):
verl's rollout importance sampling (``rollout_is`` token and sequence, truncated at its threshold) and AReaL's
decoupled PPO loss (the ratio clipped against the proximal policy, each token weighted by the behaviour policy's
importance weight, tokens above ``behav_imp_weight_cap`` left out); and their config keys."""

from __future__ import annotations

import math

import pytest
import torch

from slurm_rl.config import config_from_mapping
from slurm_rl.data.actor_batch import behaviour_weights, importance_weights, rollout_is_weights
from slurm_rl.placement import ConfigError
from slurm_rl.rl.losses import PolicyLossConfig, policy_loss

# three responses of 4, 2 and 3 tokens: the policy being trained (theta), the proximal policy (the actor's weights
# before this update) and the behaviour policy (the rollout engine's, possibly older weights)
THETA = [[-1.10, -0.40, -2.30, -0.05], [-0.70, -1.90], [-0.20, -3.10, -0.90]]
PROX = [[-1.00, -0.55, -2.00, -0.10], [-0.90, -1.20], [-0.25, -2.60, -1.40]]
BEHAV = [[-1.30, -0.50, -2.90, -0.02], [-0.85, -2.80], [-0.10, -2.55, -0.60]]
ADV = [0.8, -1.3, 0.4]
EPS, C = 0.2, 3.0


def _written_ppo(theta: float, prox: float, adv: float) -> float:
    """PPO's clipped token loss with verl's dual clip, as the papers write it (ratio against the proximal policy)."""
    r = math.exp(theta - prox)
    clipped = max(-adv * r, -adv * min(max(r, 1 - EPS), 1 + EPS))
    return min(clipped, -adv * C) if adv < 0 else clipped


def _ours(theta: list[float], prox: list[float], adv: float, weights: list[float]) -> list[float]:
    t = torch.tensor([theta], dtype=torch.float64)
    p = torch.tensor([prox], dtype=torch.float64)
    a = torch.tensor([adv], dtype=torch.float64)
    loss, _ = policy_loss("vanilla")(t, p, a, PolicyLossConfig(EPS, EPS, C))
    return (loss[0] * torch.tensor(weights, dtype=torch.float64)).tolist()


def test_token_and_sequence_weights_are_verls_truncated_importance_sampling() -> None:
    """verl: token ``min(exp(old - rollout), threshold)``; sequence ``min(exp(sum_t (old_t - rollout_t)), threshold)``
    on every token of the response."""
    for cap in (2.0, 1.3):
        token = importance_weights(PROX, BEHAV, "token", cap, "truncate")
        seq = importance_weights(PROX, BEHAV, "sequence", cap, "truncate")
        for p, b, wt, ws in zip(PROX, BEHAV, token, seq):
            assert wt.tolist() == pytest.approx([min(math.exp(x - y), cap) for x, y in zip(p, b)], abs=1e-9)
            s = min(math.exp(sum(p) - sum(b)), cap)
            assert ws.tolist() == pytest.approx([s] * len(p), abs=1e-9)
    assert max(max(w) for w in importance_weights(PROX, BEHAV, "token", 1.3, "truncate")) == pytest.approx(1.3)
    # the column the actor reads: the same weights in fp32
    got = rollout_is_weights(PROX, BEHAV, 2.0, "sequence")
    assert [w[0] for w in got] == pytest.approx([min(math.exp(sum(p) - sum(b)), 2.0) for p, b in zip(PROX, BEHAV)],
                                                rel=1e-6)


def test_rollout_is_weighs_each_tokens_policy_loss() -> None:
    """verl's corrected policy term: ``w * pg_loss`` per token (the weights detached data, not a function of theta)."""
    for level in ("token", "sequence"):
        weights = importance_weights(PROX, BEHAV, level, 2.0, "truncate")
        for th, p, b, a, w in zip(THETA, PROX, BEHAV, ADV, weights):
            written = [wt * _written_ppo(x, y, a) for x, y, wt in zip(th, p, w.tolist())]
            assert _ours(th, p, a, w.tolist()) == pytest.approx(written, abs=1e-9)


def test_decoupled_loss_is_areals() -> None:
    """AReaL (arXiv 2505.24298, eq. 5): ``-(pi_prox / pi_behav) * min(u A, clip(u, 1 - eps, 1 + eps) A)`` with
    ``u = pi_theta / pi_prox``; with ``behav_imp_weight_cap`` the tokens whose weight is above it are left out (weight
    0), without it none is."""
    for cap in (None, 1.5):
        weights = behaviour_weights(PROX, BEHAV, cap)
        exact = importance_weights(PROX, BEHAV, "token", cap, "mask")
        left_out = 0
        for th, p, b, a, w in zip(THETA, PROX, BEHAV, ADV, exact):
            written = []
            for x, y, z in zip(th, p, b):
                beh = math.exp(y - z)
                keep = cap is None or beh <= cap
                left_out += not keep
                written.append(beh * _written_ppo(x, y, a) if keep else 0.0)
            assert _ours(th, p, a, w.tolist()) == pytest.approx(written, abs=1e-9)
        assert [len(w) for w in weights] == [len(p) for p in PROX]
        assert (left_out > 0) == (cap is not None)  # the cap of 1.5 leaves some of these tokens out


def test_on_policy_data_makes_every_correction_the_identity() -> None:
    """Where the rollout sampled from the actor's own weights (behaviour = proximal) every weight is 1."""
    for level in ("token", "sequence"):
        assert all(w.tolist() == [1.0] * len(w) for w in importance_weights(PROX, PROX, level, 2.0, "truncate"))
    assert all(w == [1.0] * len(w) for w in behaviour_weights(PROX, PROX, 1.5))


def _config(**algorithm: object) -> dict:
    return {"cluster": {"num_nodes": 1, "gpus_per_node": 4,
                        "component_placement": {"actor": "0-1", "rollout": "2", "inference": "3"}},
            "runtime": {"device": "emulated", "run_dir": "/tmp/unused"},
            "train": {"num_iterations": 1, "rollout_batch_size": 2, "group_size": 2, "global_batch_size": 4,
                      "micro_batch_size": 2},
            "algorithm": dict(algorithm)}


def test_config_keys_and_their_refusals() -> None:
    cfg = config_from_mapping(_config(use_decoupled_loss=True, behav_imp_weight_cap=5.0))
    assert cfg.algorithm.use_decoupled_loss and cfg.algorithm.behav_imp_weight_cap == 5.0
    assert config_from_mapping(_config(rollout_is="sequence", rollout_is_cap=3.0)).algorithm.rollout_is == "sequence"
    cases = [
        (dict(behav_imp_weight_cap=5.0), "algorithm.behav_imp_weight_cap", "null while algorithm.use_decoupled_loss"),
        (dict(use_decoupled_loss=True, behav_imp_weight_cap=0.9), "algorithm.behav_imp_weight_cap", "a number > 1"),
        (dict(use_decoupled_loss=True, rollout_is="token"), "algorithm.rollout_is", "none with algorithm.use_decoupled"),
        (dict(use_decoupled_loss=True, old_logprobs="rollout"), "algorithm.use_decoupled_loss",
         "false while algorithm.old_logprobs is rollout"),
        (dict(rollout_is="geometric"), "algorithm.rollout_is", "one of none, token, sequence, truncated"),
    ]
    for algorithm, key, allowed in cases:
        with pytest.raises(ConfigError) as err:
            config_from_mapping(_config(**algorithm))
        assert any(i.key == key and allowed in i.allowed for i in err.value.issues), (algorithm, err.value.issues)


def test_verls_rollout_correction_keys_translate() -> None:
    from slurm_rl.dialects import translate
    from slurm_rl.dialects.verl import VERL

    doc = {"trainer": {"total_training_steps": 2},
           "algorithm": {"rollout_correction": {"rollout_is": "sequence", "rollout_is_threshold": 3.0}}}
    out = translate(VERL, doc, [], "<test>")
    assert out.ours["algorithm"]["rollout_is"] == "sequence" and out.ours["algorithm"]["rollout_is_cap"] == 3.0


def test_the_actor_batch_carries_the_weights_the_loss_multiplies() -> None:
    """``make_actor_batch`` puts the correction's weights in ``rollout_is_weights`` (the column the actor's loss
    multiplies each token's policy term by): truncated token or sequence weights for ``rollout_is``, masked
    behaviour weights for the decoupled loss, none otherwise."""
    import pyarrow as pa

    from slurm_rl.config import AlgorithmSection
    from slurm_rl.data.actor_batch import make_actor_batch
    from slurm_rl.data.emulated import make_fake_inference, make_fake_prompts, make_fake_rollouts

    inference = make_fake_inference(make_fake_rollouts(make_fake_prompts(2, 3, (4, 9), seed=0), 2, (2, 6), seed=1))
    sampled = inference.column("sampled_logprobs").to_pylist()
    proximal = [[x - 0.3 * (i % 3) + 0.1 for i, x in enumerate(row)] for row in sampled]  # the actor's scores
    inference = inference.set_column(inference.schema.get_field_index("old_logprobs"), "old_logprobs",
                                     pa.array(proximal, pa.list_(pa.float32())))
    proximal = inference.column("old_logprobs").to_pylist()  # as fp32, as the batch reads them

    def weights(**algorithm: object) -> list:
        return make_actor_batch(inference, AlgorithmSection(**algorithm)).column("rollout_is_weights").to_pylist()

    assert weights() == [None] * inference.num_rows
    for level in ("token", "sequence"):
        assert weights(rollout_is=level, rollout_is_cap=1.2) == rollout_is_weights(proximal, sampled, 1.2, level)
    assert weights(rollout_is="truncated") == rollout_is_weights(proximal, sampled, 2.0, "token")
    assert weights(use_decoupled_loss=True, behav_imp_weight_cap=1.05) == behaviour_weights(proximal, sampled, 1.05)


def test_the_corrections_under_the_emulated_device_are_a_warning() -> None:
    from slurm_rl.config_warnings import config_warnings

    said = config_warnings(config_from_mapping(_config(use_decoupled_loss=True)))
    assert any(w.startswith("algorithm.use_decoupled_loss: True has no effect under runtime.device emulated")
               for w in said), said
    said = config_warnings(config_from_mapping(_config(rollout_is="sequence")))
    assert any(w.startswith("algorithm.rollout_is: sequence has no effect") for w in said), said
    assert not [w for w in config_warnings(config_from_mapping(_config())) if w.startswith("algorithm.")]
