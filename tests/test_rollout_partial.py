"""Weights landing while requests decode (partial rollout, the hf engine): each row is split at the token
boundary where the new version landed, every token's log-prob is that of the version that drew it, the
continuation is the new weights' own (the KV cache recomputed), and no request is lost or doubled."""

from __future__ import annotations

import pytest
import torch

from slurm_rl.engines.model_config import ModelConfig
from slurm_rl.engines.rollout import SamplingParams
from slurm_rl.engines.rollout.hf import HFRolloutEngine, build_hf_model

CFG = ModelConfig(vocab_size=40, hidden_size=64, num_layers=2, num_attention_heads=2,
                  max_position_embeddings=64)
PROMPTS = [[1, 5, 6, 7], [1, 8], [1, 9, 10, 11, 12, 13, 14]]  # left padding of different widths
SEEDS = (11, 12, 13)
NEW = 8


def _weights(seed: int) -> list[tuple[str, torch.Tensor]]:
    return list(build_hf_model(CFG, seed=seed).named_parameters())


def _stage_at(engine: HFRolloutEngine, at: dict[int, tuple[int, int]]):
    """A ``between_tokens`` hook that stages the weights of seed ``s`` as version ``v`` after ``step`` tokens."""
    def hook(step: int) -> None:
        if step in at:
            seed, version = at[step]
            engine.stage_weights(_weights(seed), version)
    return hook


def _scored_tail(engine: HFRolloutEngine, gen) -> torch.Tensor:
    return engine.score([gen.prompt_ids + gen.token_ids])[0][len(gen.prompt_ids) - 1:]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_weights_landing_mid_generation_split_each_row_at_that_token(temperature: float) -> None:
    land = 3
    engine = HFRolloutEngine(CFG, seed=0)
    sampling = SamplingParams(max_new_tokens=NEW, temperature=temperature, seeds=SEEDS)
    old = HFRolloutEngine(CFG, seed=0).generate(PROMPTS, sampling)  # the uninterrupted run on version 0
    gens = engine.generate(PROMPTS, sampling, between_tokens=_stage_at(engine, {land: (1, 1)}))
    assert engine.weight_version == 1
    assert [g.prompt_ids for g in gens] == PROMPTS  # one completion per request, in order
    new_engine = HFRolloutEngine(CFG, seed=1)
    for g, o in zip(gens, old):
        assert len(g.token_ids) == len(g.logprobs) == len(g.token_versions) == NEW
        assert g.token_versions == [0] * land + [1] * (NEW - land)
        assert (g.weight_version, g.last_version) == (0, 1)
        assert g.token_ids[:land] == o.token_ids[:land]  # the old version's tokens are kept as drawn
        logprobs = torch.tensor(g.logprobs)
        # each token's log-prob is that of the version that drew it (the behaviour policy's)
        assert torch.allclose(logprobs[:land], _scored_tail(HFRolloutEngine(CFG, seed=0), g)[:land], atol=1e-4)
        assert torch.allclose(logprobs[land:], _scored_tail(new_engine, g)[land:], atol=1e-4)
        assert not torch.allclose(logprobs[land:], torch.tensor(o.logprobs[land:]), atol=1e-4)
    if temperature == 0:  # the continuation is the new weights' own from the kept prefix (KV cache recomputed)
        for g in gens:
            cont = new_engine.generate([g.prompt_ids + g.token_ids[:land]],
                                       SamplingParams(max_new_tokens=NEW - land, temperature=0, seeds=(0,)))
            assert g.token_ids[land:] == cont[0].token_ids


def test_two_versions_landing_in_one_call_are_each_recorded() -> None:
    engine = HFRolloutEngine(CFG, seed=0)
    sampling = SamplingParams(max_new_tokens=NEW, seeds=SEEDS)
    gens = engine.generate(PROMPTS, sampling, between_tokens=_stage_at(engine, {2: (1, 1), 5: (2, 2)}))
    for g in gens:
        assert g.token_versions == [0, 0, 1, 1, 1, 2, 2, 2]
        logprobs = torch.tensor(g.logprobs)
        for seed, (a, b) in ((0, (0, 2)), (1, (2, 5)), (2, (5, NEW))):
            assert torch.allclose(logprobs[a:b], _scored_tail(HFRolloutEngine(CFG, seed=seed), g)[a:b], atol=1e-4)
    assert engine.weight_version == 2


def test_without_partial_rollout_running_requests_finish_on_the_old_weights() -> None:
    engine = HFRolloutEngine(CFG, seed=0, partial_rollout=False)
    sampling = SamplingParams(max_new_tokens=NEW, seeds=SEEDS)
    old = HFRolloutEngine(CFG, seed=0).generate(PROMPTS, sampling)
    gens = engine.generate(PROMPTS, sampling, between_tokens=_stage_at(engine, {3: (1, 1)}))
    assert [g.token_ids for g in gens] == [o.token_ids for o in old]
    assert [g.logprobs for g in gens] == [o.logprobs for o in old]
    assert all(g.token_versions == [0] * NEW and g.last_version == 0 for g in gens)
    assert engine.weight_version == 1  # landed when the call returned
    after = engine.generate(PROMPTS, sampling)
    twin = HFRolloutEngine(CFG, seed=1).generate(PROMPTS, sampling)
    assert [g.token_ids for g in after] == [t.token_ids for t in twin]
    assert all(g.token_versions == [1] * NEW for g in after)


def test_staging_outside_a_call_lands_at_once_and_bad_weights_are_refused_when_staged() -> None:
    engine = HFRolloutEngine(CFG, seed=0)
    engine.stage_weights(_weights(1), version=4)
    assert engine.weight_version == 4
    seqs = [p + [3, 4] for p in PROMPTS]
    for a, b in zip(engine.score(seqs), HFRolloutEngine(CFG, seed=1).score(seqs)):
        assert torch.equal(a, b)
    with pytest.raises(KeyError, match="model.nope"):
        engine.stage_weights([("model.nope", torch.zeros(1))], version=5)
    with pytest.raises(ValueError, match="model.norm.weight"):
        engine.stage_weights([("model.norm.weight", torch.zeros(3))], version=5)
    assert engine.weight_version == 4
    with pytest.raises(ValueError, match="between_tokens needs sampling.seeds"):
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=2, seed=0), between_tokens=lambda step: None)
