"""Single-process GRPO loop on the toy task: does a random-init tiny model learn?

Rollout with the hf engine, reference logprobs with ReferenceScorer, a megatron-core actor trained
with plain AdamW, and a megatron -> HF weight conversion + ``update_weights`` every iteration
(on-policy: iteration k samples with weight version k). Prints one JSON line per iteration and a
summary line at the end.

    .venv/bin/python tools/learn_check.py            # quickstart settings, stops at 0.9
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

import torch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="add")
    p.add_argument("--max-operand", type=int, default=4)
    p.add_argument("--length", type=int, default=2)
    p.add_argument("--alphabet", type=int, default=6)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=48)
    p.add_argument("--prompts", type=int, default=16, help="prompts per iteration")
    p.add_argument("--group", type=int, default=16, help="samples per prompt")
    p.add_argument("--micro-batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip-eps", type=float, default=0.2)
    p.add_argument("--kl-coef", type=float, default=0.05)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--iterations", type=int, default=600)
    p.add_argument("--time-limit", type=float, default=600.0, help="stop after this many s")
    p.add_argument("--target", type=float, default=0.9,
                   help="stop when the mean reward of the last 3 iterations reaches this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    from slurm_rl.engines.actor.model import (build_gpt_model, init_local_process_group,
                                              token_logprobs)
    from slurm_rl.engines.convert import megatron_to_hf
    from slurm_rl.engines.inference import ReferenceScorer
    from slurm_rl.engines.model_config import ModelConfig
    from slurm_rl.engines.rollout import SamplingParams, make_rollout_engine
    from slurm_rl.rl.grpo import group_advantages, grpo_loss, place_responses
    from slurm_rl.rl.tasks import TaskConfig, sample_problems, score_answer
    from slurm_rl.rl.tokenizer import CharTokenizer, pad_batch

    tok = CharTokenizer()
    task = TaskConfig(name=args.task, max_operand=args.max_operand, length=args.length,
                      alphabet=args.alphabet)
    cfg = ModelConfig(vocab_size=max(args.vocab, tok.vocab_size), hidden_size=args.hidden,
                      num_layers=args.layers, num_attention_heads=args.heads,
                      max_position_embeddings=64)
    init_local_process_group()
    actor = build_gpt_model(cfg, seed=args.seed)
    opt = torch.optim.AdamW(actor.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                            betas=(0.9, 0.99))
    engine = make_rollout_engine("hf", cfg, seed=args.seed)
    engine.update_weights(megatron_to_hf(actor.named_parameters(), cfg), version=0)
    ref = ReferenceScorer(cfg, actor.named_parameters())
    print(json.dumps({"settings": vars(args), "model": cfg.to_dict(), "task": asdict(task),
                      "parameters": cfg.num_parameters()}), flush=True)
    start = time.perf_counter()
    curve = []
    for it in range(args.iterations):
        t0 = time.perf_counter()
        problems = sample_problems(task, tok, args.seed, it, args.prompts)
        prompts = [p.prompt_ids for p in problems for _ in range(args.group)]
        targets = [p.target for p in problems for _ in range(args.group)]
        sampling = SamplingParams(max_new_tokens=task.max_new_tokens,
                                  temperature=args.temperature, seed=args.seed * 100003 + it,
                                  stop_token_ids=(tok.eos_id,))
        gens = engine.generate(prompts, sampling)
        assert all(g.weight_version == it for g in gens)
        rewards = torch.tensor([score_answer(g.token_ids, t, tok) for g, t in zip(gens, targets)])
        t1 = time.perf_counter()
        seqs = [g.prompt_ids + g.token_ids for g in gens]
        ref_lp = ref.score(seqs)
        t2 = time.perf_counter()
        adv = group_advantages(rewards, args.group)
        ids, attn = pad_batch(seqs, tok.pad_id)
        ids_t, attn_t = torch.tensor(ids), torch.tensor(attn)
        width = ids_t.shape[1] - 1
        prompt_lens = [len(g.prompt_ids) for g in gens]
        old, mask = place_responses(prompt_lens, [g.logprobs for g in gens], width)
        refm, _ = place_responses(prompt_lens, [r[n - 1:] for r, n in zip(ref_lp, prompt_lens)],
                                  width)
        n_tokens = int(mask.sum())
        opt.zero_grad(set_to_none=True)
        loss_sum = kl_sum = 0.0
        for lo in range(0, len(seqs), args.micro_batch):
            sl = slice(lo, lo + args.micro_batch)
            lp = token_logprobs(actor, ids_t[sl], attn_t[sl])
            parts = grpo_loss(lp, old[sl], adv[sl], mask[sl], n_tokens,
                              clip_eps=args.clip_eps, ref_logprobs=refm[sl],
                              kl_coef=args.kl_coef)
            parts.loss.backward()
            loss_sum += parts.loss.item()
            kl_sum += parts.kl_sum.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0).item()
        opt.step()
        t3 = time.perf_counter()
        engine.update_weights(megatron_to_hf(actor.named_parameters(), cfg), version=it + 1)
        t4 = time.perf_counter()
        exact = float((rewards == 1.0).float().mean())
        row = {"iteration": it, "reward": round(float(rewards.mean()), 4), "exact": exact,
               "kl": round(kl_sum / n_tokens, 5), "loss": round(loss_sum, 5),
               "grad_norm": round(grad_norm, 4), "tokens": n_tokens,
               "s_rollout": round(t1 - t0, 3), "s_ref": round(t2 - t1, 3),
               "s_train": round(t3 - t2, 3), "s_sync": round(t4 - t3, 4),
               "s_total": round(t4 - start, 2),
               "example": tok.decode(gens[0].prompt_ids) + tok.decode(gens[0].token_ids)}
        curve.append(row)
        print(json.dumps(row), flush=True)
        if t4 - start > args.time_limit:
            break
        if len(curve) >= 3 and sum(r["reward"] for r in curve[-3:]) / 3 >= args.target:
            break
    first = curve[0]["reward"]
    last3 = sum(r["reward"] for r in curve[-3:]) / min(3, len(curve))
    print(json.dumps({"summary": True, "first_reward": first, "last3_reward": round(last3, 4),
                      "iterations": len(curve), "seconds": curve[-1]["s_total"],
                      "learned": first <= 0.2 and last3 >= args.target}), flush=True)


if __name__ == "__main__":
    main()
