"""Rollout throughput, hf vs vllm, on the quickstart model: prints one JSON line per case.

    .venv/bin/python tools/bench_rollout.py --backends hf,vllm --threads 1
    .venv/bin/python tools/bench_rollout.py --vs-transformers --hidden 256 --layers 4 --heads 4 --long 64
    .venv/bin/python tools/bench_rollout.py --vs-vllm --device cuda --hidden 896 --layers 24 --heads 14 --long 256

Two cases per backend: the quickstart workload (toy-task prompts, answers of up to
``max_new_tokens`` with a stop token) and a decode-heavy one (``--long`` new tokens, no stop).
Throughput counts generated tokens only; the first (warm-up) round is not timed.
``--vs-transformers``: the hf engine against ``transformers``' own ``generate`` with a static cache on
the same batch (greedy, no stop), the ratio of their tokens/s. ``--vs-vllm``: the vllm engine against
``vllm.LLM.generate`` of the same engine on the same prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="hf,vllm")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=48)
    p.add_argument("--prompts", type=int, default=256, help="sequences per round")
    p.add_argument("--long", type=int, default=32, help="new tokens in the decode-heavy case")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--sync-ranks", type=int, default=3, help="ranks in the weight-sync bench")
    p.add_argument("--vs-transformers", action="store_true",
                   help="only: the hf engine against transformers' generate with a static cache on the same batch")
    p.add_argument("--vs-vllm", action="store_true",
                   help="only: the vllm engine against its own vllm.LLM.generate on the same prompts")
    p.add_argument("--batch", type=int, default=32, help="--vs-transformers / --vs-vllm: sequences per call")
    p.add_argument("--dtype", default=None, help="--vs-vllm: rollout.dtype (null: the device's default)")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    if args.vs_transformers:
        bench_vs_transformers(args)
        return
    if args.vs_vllm:
        bench_vs_vllm(args)
        return
    from slurm_rl.engines.model_config import ModelConfig
    from slurm_rl.engines.rollout import SamplingParams, make_rollout_engine
    from slurm_rl.rl.tokenizer import CharTokenizer
    from slurm_rl.toy.tasks import task_rows

    tok = CharTokenizer()
    cfg = ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                      num_attention_heads=args.heads, max_position_embeddings=128)
    prompts = [tok.encode(r["prompt"]) for r in task_rows("add", rows=args.prompts, max_operand=4)]
    cases = {"quickstart": SamplingParams(max_new_tokens=3,
                                          stop_token_ids=(tok.eos_id,)),
             "decode": SamplingParams(max_new_tokens=args.long)}
    for backend in args.backends.split(","):
        t0 = time.perf_counter()
        engine = make_rollout_engine(backend, cfg, device=args.device, seed=0)
        start_s = time.perf_counter() - t0
        for case, sp in cases.items():
            engine.generate(prompts, sp)  # warm-up
            tokens, t0 = 0, time.perf_counter()
            for r in range(args.rounds):
                gens = engine.generate(prompts, SamplingParams(**{**sp.__dict__, "seed": r}))
                tokens += sum(len(g.token_ids) for g in gens)
            sec = time.perf_counter() - t0
            print(json.dumps({"backend": backend, "case": case, "sequences": args.prompts,
                              "rounds": args.rounds, "tokens": tokens,
                              "seconds": round(sec, 3), "tokens_per_s": round(tokens / sec, 1),
                              "engine_start_s": round(start_s, 1), "threads": args.threads,
                              "parameters": cfg.num_parameters()}), flush=True)
        named = [(n, t.detach().clone()) for n, t in
                 make_rollout_engine("hf", cfg, seed=1).model.named_parameters()]
        t0 = time.perf_counter()
        engine.update_weights(named, version=1)
        print(json.dumps({"backend": backend, "case": "update_weights",
                          "seconds": round(time.perf_counter() - t0, 4)}), flush=True)
        engine.close()
    if args.sync_ranks > 1:
        bench_sync(cfg, args.sync_ranks, args.rounds)


def bench_vs_transformers(args: argparse.Namespace) -> None:
    """The hf engine's ``generate`` (greedy, ``--long`` new tokens, no stop) against the same model's
    ``transformers`` ``generate`` with ``cache_implementation="static"`` on the same left-padded batch:
    rounds alternate the two, each timed alone; prints min and median tokens/s and their ratio."""
    import statistics

    import torch

    from slurm_rl.engines.model_config import ModelConfig
    from slurm_rl.engines.rollout import SamplingParams, make_rollout_engine
    from slurm_rl.rl.tokenizer import CharTokenizer, pad_batch
    from slurm_rl.toy.tasks import task_rows

    tok = CharTokenizer()
    cfg = ModelConfig(vocab_size=max(args.vocab, tok.vocab_size), hidden_size=args.hidden, num_layers=args.layers,
                      num_attention_heads=args.heads, max_position_embeddings=128)
    prompts = [tok.encode(r["prompt"]) for r in task_rows("add", rows=args.batch, max_operand=4)]
    engine = make_rollout_engine("hf", cfg, device=args.device, seed=0)
    model = engine.model
    sp = SamplingParams(max_new_tokens=args.long, temperature=0)
    ids, mask = pad_batch(prompts, engine.pad_id, left=True)
    input_ids = torch.tensor(ids, device=args.device)
    attn = torch.tensor(mask, device=args.device)
    from transformers import GenerationConfig

    ref_cfg = GenerationConfig(max_new_tokens=args.long, min_new_tokens=args.long, do_sample=False,
                               pad_token_id=engine.pad_id, bos_token_id=None, eos_token_id=None,
                               cache_implementation="static", use_cache=True)

    def ours() -> tuple[int, list[list[int]]]:
        gens = engine.generate(prompts, sp)
        return sum(len(g.token_ids) for g in gens), [g.token_ids for g in gens]

    @torch.no_grad()
    def reference() -> tuple[int, list[list[int]]]:
        out = model.generate(input_ids=input_ids, attention_mask=attn, generation_config=ref_cfg)
        new = out[:, input_ids.shape[1]:]
        return new.numel(), new.tolist()

    times: dict[str, list[float]] = {"hf_engine": [], "transformers_static": []}
    tokens: dict[str, int] = {}
    same = None
    for r in range(args.rounds + 1):
        for name, fn in (("hf_engine", ours), ("transformers_static", reference)):
            t0 = time.perf_counter()
            n, toks = fn()
            sec = time.perf_counter() - t0
            tokens[name] = n
            if r:  # round 0 warms up (the static cache is allocated then)
                times[name].append(sec)
            if name == "hf_engine":
                mine = toks
            else:
                same = mine == toks if same is None else same and mine == toks
    rates = {k: [tokens[k] / t for t in v] for k, v in times.items()}
    doc = {"case": "hf_vs_transformers_static", "batch": args.batch, "new_tokens": args.long,
           "rounds": args.rounds, "threads": args.threads, "parameters": cfg.num_parameters(),
           "hidden": args.hidden, "layers": args.layers, "greedy_tokens_equal": same}
    for k, v in rates.items():
        doc[f"{k}_tokens_per_s_max"] = round(max(v), 1)
        doc[f"{k}_tokens_per_s_median"] = round(statistics.median(v), 1)
    doc["ratio_best"] = round(max(rates["hf_engine"]) / max(rates["transformers_static"]), 3)
    doc["ratio_median"] = round(statistics.median(rates["hf_engine"]) / statistics.median(rates["transformers_static"]), 3)
    print(json.dumps(doc), flush=True)


def _rates(times: list[float], tokens: int) -> dict[str, float]:
    import statistics

    rates = [tokens / t for t in times]
    return {"max": max(rates), "median": statistics.median(rates)}


def bench_vs_vllm(args: argparse.Namespace) -> None:
    """The vllm rollout engine's ``generate`` (per-request params, logprobs, Generation rows) against
    ``vllm.LLM.generate`` of the same engine on the same prompts (greedy, ``--long`` new tokens, no
    stop), without and with logprobs, with the rollout section's defaults on ``--device`` (bf16 and CUDA
    graphs on cuda); rounds alternate them. Prints tokens/s (max, median) and the ratios."""
    from vllm import SamplingParams as VSP

    from types import SimpleNamespace

    from slurm_rl.engines.model_config import ModelConfig
    from slurm_rl.engines.rollout import SamplingParams, make_rollout_engine
    from slurm_rl.rollout_config import resolve_engine_options

    cfg = ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                      num_attention_heads=args.heads, max_position_embeddings=max(128, 2 * args.long))
    ro = SimpleNamespace(dtype=args.dtype, enforce_eager=None, max_model_len=None, enable_chunked_prefill=None,
                         enable_prefix_caching=True, max_num_seqs=None, max_num_batched_tokens=None,
                         gpu_memory_utilization=0.5, max_new_tokens=args.long)
    options = resolve_engine_options(ro, args.device, "bf16", 16, cfg.max_position_embeddings)
    t0 = time.perf_counter()
    engine = make_rollout_engine("vllm", cfg, device=args.device, seed=0, **options)
    start_s = time.perf_counter() - t0
    g = prompt_rng(0)
    prompts = [[1] + [int(x) for x in g.integers(3, args.vocab, size=int(n))]
               for n in g.integers(4, 16, size=args.batch)]
    sp = SamplingParams(max_new_tokens=args.long, temperature=0)
    raw = VSP(max_tokens=args.long, temperature=0.0, detokenize=False, ignore_eos=True)
    with_lp = VSP(max_tokens=args.long, temperature=0.0, detokenize=False, ignore_eos=True, logprobs=0)
    inputs = [{"prompt_token_ids": p} for p in prompts]

    def ours() -> int:
        return sum(len(x.token_ids) for x in engine.generate(prompts, sp))

    def reference(params: VSP) -> int:
        return sum(len(o.outputs[0].token_ids) for o in engine.llm.generate(inputs, params, use_tqdm=False))

    times: dict[str, list[float]] = {"engine": [], "vllm_generate": [], "vllm_generate_logprobs": []}
    tokens: dict[str, int] = {}
    for r in range(args.rounds + 1):
        for name, fn in (("engine", ours), ("vllm_generate", lambda: reference(raw)),
                         ("vllm_generate_logprobs", lambda: reference(with_lp))):
            engine.llm.reset_prefix_cache()  # each call computes its prompts afresh
            t0 = time.perf_counter()
            tokens[name] = fn()
            if r:
                times[name].append(time.perf_counter() - t0)
    mine, ref = _rates(times["engine"], tokens["engine"]), _rates(times["vllm_generate"], tokens["vllm_generate"])
    ref_lp = _rates(times["vllm_generate_logprobs"], tokens["vllm_generate_logprobs"])
    print(json.dumps({"case": "vllm_engine_vs_llm_generate", "device": args.device, "batch": args.batch,
                      "new_tokens": args.long, "rounds": args.rounds, "options": options,
                      "parameters": cfg.num_parameters(), "engine_start_s": round(start_s, 1),
                      "tokens": tokens, "engine_tokens_per_s_max": round(mine["max"], 1),
                      "engine_tokens_per_s_median": round(mine["median"], 1),
                      "vllm_tokens_per_s_max": round(ref["max"], 1),
                      "vllm_tokens_per_s_median": round(ref["median"], 1),
                      "ratio_best": round(mine["max"] / ref["max"], 3),
                      "ratio_median": round(mine["median"] / ref["median"], 3),
                      # the same work as the engine's: vLLM also returns each sampled token's logprob
                      "vllm_logprobs_tokens_per_s_max": round(ref_lp["max"], 1),
                      "ratio_vs_logprobs_best": round(mine["max"] / ref_lp["max"], 3)}), flush=True)
    engine.close()


def prompt_rng(seed: int):
    """A numpy generator for the prompts (their lengths and tokens)."""
    import numpy as np

    return np.random.default_rng(seed)


def _sync_worker(rank: int, world: int, store: str, cfg_dict: dict, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    from slurm_rl.engines.actor.model import build_gpt_model
    from slurm_rl.engines.convert import megatron_to_hf
    from slurm_rl.engines.model_config import ModelConfig
    from slurm_rl.engines.rollout import make_rollout_engine
    from slurm_rl.engines.weight_sync import broadcast_weights

    torch.set_num_threads(1)
    cfg = ModelConfig.from_dict(cfg_dict)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    if rank == 0:
        actor = build_gpt_model(cfg, seed=0)
    else:
        engine = make_rollout_engine("hf", cfg, seed=0)
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        if rank == 0:
            _, stats = broadcast_weights(megatron_to_hf(actor.named_parameters(), cfg), 0,
                                         dist.group.WORLD, what=f"weight sync v{r}")
        else:
            got, stats = broadcast_weights(None, 0, dist.group.WORLD, what=f"weight sync v{r}")
            engine.update_weights(got, version=r)
        if r:  # round 0 warms up
            print(json.dumps({"case": "weight_sync", "rank": rank, "world": world,
                              "bytes": stats.bytes, "buckets": stats.buckets,
                              "broadcast_s": round(stats.seconds, 4),
                              "total_s": round(time.perf_counter() - t0, 4)}), flush=True)
    dist.destroy_process_group()


def bench_sync(cfg, world: int, rounds: int) -> None:
    """Actor rank 0 -> rollout ranks 1.. over gloo: convert + broadcast + update_weights."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_sync_worker, args=(world, f"{tmp}/store", cfg.to_dict(), rounds),
                           nprocs=world, start_method="spawn", join=True)


if __name__ == "__main__":
    main()
