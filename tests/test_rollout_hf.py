"""The hf rollout backend: sampling, logprobs, stop tokens, weight updates, release/resume."""

from __future__ import annotations

import pytest
import torch

from slurm_rl.engines.model_config import ModelConfig
from slurm_rl.engines.rollout import SamplingParams, make_rollout_engine
from slurm_rl.engines.rollout.hf import HFRolloutEngine, build_hf_model

CFG = ModelConfig(vocab_size=40, hidden_size=64, num_layers=2, num_attention_heads=2,
                  max_position_embeddings=64)
PROMPTS = [[1, 5, 6, 7], [1, 8], [1, 9, 10, 11, 12, 13, 14]]


@pytest.fixture(scope="module")
def engine() -> HFRolloutEngine:
    torch.set_num_threads(1)
    return make_rollout_engine("hf", CFG, seed=0)


def _check_logprobs_match_score(engine: HFRolloutEngine, gens) -> None:
    scores = engine.score([g.prompt_ids + g.token_ids for g in gens])
    for g, s in zip(gens, scores):
        tail = s[len(g.prompt_ids) - 1:]
        assert len(tail) == len(g.token_ids) == len(g.logprobs)
        assert torch.allclose(tail, torch.tensor(g.logprobs), atol=1e-4)


def test_sampled_logprobs_are_raw_model_logprobs(engine: HFRolloutEngine) -> None:
    for sp in (SamplingParams(max_new_tokens=6, seed=1),
               SamplingParams(max_new_tokens=6, seed=1, temperature=0.5, top_p=0.8)):
        gens = engine.generate(PROMPTS, sp)
        assert [g.prompt_ids for g in gens] == PROMPTS
        assert all(g.finish_reason == "length" and len(g.token_ids) == 6 for g in gens)
        _check_logprobs_match_score(engine, gens)  # left padding handled, temperature ignored


def test_seeded_sampling_is_reproducible_and_greedy_is_argmax(engine: HFRolloutEngine) -> None:
    sp = SamplingParams(max_new_tokens=5, seed=7)
    a, b = engine.generate(PROMPTS, sp), engine.generate(PROMPTS, sp)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    group = engine.generate([PROMPTS[0]] * 8, sp)
    assert len({tuple(g.token_ids) for g in group}) > 1  # a group is not 8 copies
    greedy = engine.generate(PROMPTS, SamplingParams(max_new_tokens=5, temperature=0))
    for g in greedy:
        seq = list(g.prompt_ids)
        for tok in g.token_ids:
            with torch.no_grad():
                logits = engine.model(input_ids=torch.tensor([seq])).logits[0, -1]
            assert tok == int(logits.argmax())
            seq.append(tok)


def test_stop_tokens_end_generation(engine: HFRolloutEngine) -> None:
    free = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0))
    stop = free[0].token_ids[2]
    gens = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0,
                                                   stop_token_ids=(stop,)))
    first = gens[0]
    assert first.finish_reason == "stop" and first.token_ids[-1] == stop
    assert first.token_ids == free[0].token_ids[:first.token_ids.index(stop) + 1]
    for g, f in zip(gens, free):
        if stop not in f.token_ids:
            assert g.finish_reason == "length" and g.token_ids == f.token_ids
    _check_logprobs_match_score(engine, gens)


def test_update_weights_changes_outputs_and_version() -> None:
    engine = HFRolloutEngine(CFG, seed=0)
    seqs = [p + [3, 4] for p in PROMPTS]
    before = engine.score(seqs)
    other = build_hf_model(CFG, seed=1)
    engine.update_weights(other.named_parameters(), version=5)
    assert engine.weight_version == 5
    after = engine.score(seqs)
    assert not torch.allclose(before[0], after[0])
    gens = engine.generate(PROMPTS, SamplingParams(max_new_tokens=2, seed=0))
    assert all(g.weight_version == 5 for g in gens)
    twin = HFRolloutEngine(CFG, seed=1)
    for a, b in zip(after, twin.score(seqs)):
        assert torch.equal(a, b)
    with pytest.raises(KeyError, match="model.nope"):
        engine.update_weights([("model.nope", torch.zeros(1))], version=6)
    with pytest.raises(ValueError, match="model.norm.weight"):
        engine.update_weights([("model.norm.weight", torch.zeros(3))], version=6)


def test_release_blocks_use_until_resume() -> None:
    engine = HFRolloutEngine(CFG, seed=0)
    engine.release()
    with pytest.raises(RuntimeError, match="released"):
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))
    engine.resume()
    assert len(engine.generate(PROMPTS, SamplingParams(max_new_tokens=2))) == 3


def test_factory_and_sampling_validation() -> None:
    with pytest.raises(ValueError, match="rollout.backend"):
        make_rollout_engine("sglang", CFG)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)


TARGET = [1, 5, 6, 7]
OTHERS = [[1, 8], [1, 9, 10, 11, 12, 13, 14], [1, 20, 21, 22, 23, 24, 25, 26, 27], [3],
          [1, 2, 3, 4, 5]]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.8), (0.0, 1.0)])
def test_per_request_seeds_are_batch_invariant(engine: HFRolloutEngine, temperature: float,
                                               top_p: float) -> None:
    sp = dict(max_new_tokens=10, temperature=temperature, top_p=top_p)
    alone = engine.generate([TARGET], SamplingParams(seeds=(42,), **sp))[0]
    batch = OTHERS[:3] + [TARGET] + OTHERS[3:]  # other lengths -> other padding, other slot
    inside = engine.generate(batch, SamplingParams(seeds=(1, 2, 3, 42, 4, 5), **sp))
    assert inside[3].token_ids == alone.token_ids and inside[3].prompt_ids == TARGET
    assert torch.allclose(torch.tensor(inside[3].logprobs), torch.tensor(alone.logprobs),
                          atol=1e-5, rtol=0)
    for prompt, seed, g in zip(batch, (1, 2, 3, 42, 4, 5), inside):  # every row, not just one
        single = engine.generate([prompt], SamplingParams(seeds=(seed,), **sp))[0]
        assert g.token_ids == single.token_ids
    _check_logprobs_match_score(engine, inside)  # raw temperature-1 logprobs


def test_per_request_seeds_differ_and_stop(engine: HFRolloutEngine) -> None:
    sp = SamplingParams(max_new_tokens=8, seeds=tuple(range(6)))
    gens = engine.generate([TARGET] * 6, sp)
    assert len({tuple(g.token_ids) for g in gens}) > 1
    assert [g.token_ids for g in engine.generate([TARGET] * 6, sp)] == [g.token_ids for g in gens]
    stop = gens[0].token_ids[2]
    stopped = engine.generate([TARGET] * 6, SamplingParams(max_new_tokens=8, seeds=sp.seeds,
                                                           stop_token_ids=(stop,)))
    for g, s in zip(gens, stopped):  # stopping a row leaves its prefix (and the others) alone
        end = g.token_ids.index(stop) + 1 if stop in g.token_ids else len(g.token_ids)
        assert s.token_ids == g.token_ids[:end] and s.logprobs == g.logprobs[:end]
        assert s.finish_reason == ("stop" if stop in g.token_ids else "length")
    assert stopped[0].finish_reason == "stop"


def test_per_request_seeds_greedy_matches_hf_generate(engine: HFRolloutEngine) -> None:
    greedy = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0))
    seeded = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0,
                                                     seeds=(5, 6, 7)))
    assert [g.token_ids for g in seeded] == [g.token_ids for g in greedy]
    for a, b in zip(seeded, greedy):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_seeds_length_must_match_prompts(engine: HFRolloutEngine) -> None:
    with pytest.raises(ValueError, match="sampling.seeds"):
        engine.generate(PROMPTS, SamplingParams(seeds=(1, 2)))
    assert SamplingParams(seeds=[1, 2]).seeds == (1, 2)  # type: ignore[arg-type]
