"""Rollout throughput, hf vs vllm, on the quickstart model: prints one JSON line per case.

    .venv/bin/python tools/bench_rollout.py --backends hf,vllm --threads 1

Two cases per backend: the quickstart workload (toy-task prompts, answers of up to
``max_new_tokens`` with a stop token) and a decode-heavy one (``--long`` new tokens, no stop).
Throughput counts generated tokens only; the first (warm-up) round is not timed.
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
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
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
