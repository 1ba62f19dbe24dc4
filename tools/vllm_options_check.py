"""The vllm rollout engine with the rollout section's defaults on DEVICE (cuda: bf16 and CUDA graphs):
``python tools/vllm_options_check.py DEVICE`` prints one JSON line; exit 1 when a check fails.

Checks: the engine is built with the resolved options (dtype, enforce_eager; on cuda a CUDA-graph mode
other than none), greedy generation runs, its logprobs stay within bf16's precision of the fp32 hf
engine's, a weight sync changes the output. Run by tools/gpu_check.sh.
"""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace


def main(device: str) -> int:
    from slurm_rl.engines.model_config import ModelConfig
    from slurm_rl.engines.rollout import SamplingParams, make_rollout_engine
    from slurm_rl.engines.rollout.hf import build_hf_model
    from slurm_rl.rollout_config import resolve_engine_options

    cfg = ModelConfig(vocab_size=64, hidden_size=128, num_layers=2, num_attention_heads=4, max_position_embeddings=128)
    ro = SimpleNamespace(dtype=None, enforce_eager=None, max_model_len=None, enable_chunked_prefill=None,
                         enable_prefix_caching=True, max_num_seqs=None, max_num_batched_tokens=None,
                         gpu_memory_utilization=0.3, max_new_tokens=16)
    options = resolve_engine_options(ro, device, "bf16", 32, cfg.max_position_embeddings)
    t0 = time.perf_counter()
    engine = make_rollout_engine("vllm", cfg, device=device, seed=0, **options)
    out = {"device": device, "options": options, "start_s": round(time.perf_counter() - t0, 1)}
    vc = engine.llm.llm_engine.vllm_config
    out["built_dtype"] = str(vc.model_config.dtype)
    out["enforce_eager"] = bool(vc.model_config.enforce_eager)
    out["cudagraph_mode"] = str(getattr(vc.compilation_config, "cudagraph_mode", None))
    hf = make_rollout_engine("hf", cfg, device=device, seed=0)
    prompts = [[1, 5, 6, 7], [1, 8], [1, 9, 10, 11, 12]]
    greedy = SamplingParams(max_new_tokens=16, temperature=0)
    before = engine.generate(prompts, greedy)
    probe = [p + [3, 4, 5] for p in prompts]
    out["logprob_diff_vs_fp32"] = max(float((a.cpu() - b.cpu()).abs().max())
                                      for a, b in zip(engine.score(probe), hf.score(probe)))
    new = [(n, t.detach().clone()) for n, t in build_hf_model(cfg, 1).state_dict().items()]
    engine.update_weights(new, version=1)
    out["changed_by_update"] = [g.token_ids for g in engine.generate(prompts, greedy)] != [g.token_ids for g in before]
    want_dtype = "torch.bfloat16" if device == "cuda" else "torch.float32"
    graphs = device != "cuda" or (not out["enforce_eager"] and "NONE" not in out["cudagraph_mode"].upper())
    out["ok"] = (out["built_dtype"] == want_dtype and graphs and out["changed_by_update"]
                 and out["logprob_diff_vs_fp32"] < 0.05 and all(len(g.token_ids) == 16 for g in before))
    engine.close()
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "cuda"))
