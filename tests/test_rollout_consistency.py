"""The same sequences scored by the megatron-core actor, the hf rollout engine and the
reference scorer give token logprobs within 1e-3 (fp32); sampled logprobs agree too."""

from __future__ import annotations

import pytest
import torch

from slurm_rl.engines.model_config import ModelConfig

CFG = ModelConfig(vocab_size=48, hidden_size=64, num_layers=2, num_attention_heads=2,
                  num_query_groups=1, max_position_embeddings=64)


@pytest.mark.slow
def test_actor_hf_and_reference_logprobs_agree() -> None:
    from slurm_rl.engines.actor.model import (build_gpt_model, init_local_process_group,
                                              token_logprobs)
    from slurm_rl.engines.convert import megatron_to_hf
    from slurm_rl.engines.inference import ReferenceScorer
    from slurm_rl.engines.rollout import SamplingParams, make_rollout_engine
    from slurm_rl.rl.tokenizer import pad_batch

    torch.set_num_threads(1)
    init_local_process_group()
    actor = build_gpt_model(CFG, seed=11)
    engine = make_rollout_engine("hf", CFG, seed=0)
    engine.update_weights(megatron_to_hf(actor.named_parameters(), CFG), version=3)
    ref = ReferenceScorer(CFG, actor.named_parameters())  # megatron names accepted

    prompts = [[1, 5, 6, 7], [1, 8], [1, 9, 10, 11, 12, 13, 14]] * 2
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=7, seed=5, temperature=0.8,
                                                   stop_token_ids=(2,)))
    assert all(g.weight_version == 3 for g in gens)
    seqs = [g.prompt_ids + g.token_ids for g in gens]
    ids, mask = pad_batch(seqs, 0)
    with torch.no_grad():
        actor_lp = token_logprobs(actor, torch.tensor(ids), torch.tensor(mask))
    hf_lp, ref_lp = engine.score(seqs), ref.score(seqs)
    for i, (g, s) in enumerate(zip(gens, seqs)):
        a = actor_lp[i, : len(s) - 1]
        assert (a - hf_lp[i]).abs().max().item() < 1e-3
        assert (a - ref_lp[i]).abs().max().item() < 1e-3
        sampled = a[len(g.prompt_ids) - 1:]
        assert (sampled - torch.tensor(g.logprobs)).abs().max().item() < 1e-3
