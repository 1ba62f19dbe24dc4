"""The actor's training step against plain PyTorch training of the same model; one JSON line per configuration.

    .venv/bin/python tools/bench_step.py [--device cpu|cuda] [--models quickstart,qwen2.5-0.5b]
                                         [--precision fp32,bf16] [--attention sdpa[,local]] [--reps N] [--json]

Ours: :class:`slurm_rl.engines.actor.trainer.ActorTrainer` (megatron-core GPT, our flat-buffer AdamW with
the fp32 master, grad-norm clip, bf16 refresh), one DP rank, ``train.micro_batch_size`` micro-batches padded
to their longest row, the GRPO-style token-mean loss of the actor. Reference: ``transformers``' model of the
same configuration (SDPA attention) with ``torch.optim.AdamW`` (``fused`` on cuda, ``foreach`` on cpu) and
``clip_grad_norm_``, the same samples, micro-batches and loss, each step collating its samples into micro-batches
with the same collation as ours (a training loop's data step; ours collates inside ``train_step``), parameters
in the same precision (a bf16
reference trains its bf16 parameters directly, with no fp32 master: the usual plain-PyTorch baseline).

Samples: a prompt of ``--prompt-len`` tokens and a long-tailed response length (log-normal, median
``--response-median``, capped at ``--response-max``), as RL rollouts are. Rows with ``packing`` false pad each
micro-batch of ``--micro-batch`` samples to its longest row (``padding_fraction``: the share of the tokens computed
that are padding); rows with ``packing`` true concatenate first-fit-decreasing bins of at most ``--max-tokens``
tokens into one row each (``train.use_remove_padding`` with ``train.max_tokens_per_microbatch``), and the reference
trains the same bins as packed rows too (``position_ids`` restarting per sample, which ``transformers`` turns into
attention inside each sample).

Figures per line: ``ours_tokens_per_s`` / ``reference_tokens_per_s`` (real tokens, not padding, per second
of a whole step, best of ``--reps`` (default 10 for the quickstart shape, whose step takes ~0.1 s; 3 otherwise;
1 for the Qwen2.5 shape on cpu, whose step takes 25-40 s there) after a warm-up step, ours and the reference's
steps alternating so that both see the same load on a shared host), ``ratio`` = ours / reference, ``breakdown_s`` of
our step measured piece by piece on the same model (``forward``, ``backward``: forward+backward less
forward; ``optimizer``: clip + AdamW + refresh; ``host_syncs``: the step less the three), and on cuda
``mfu`` (6 x parameters x real tokens per second / the GPU's dense bf16 or fp32 peak, ``--peak-tflops``) and
peak memory; ``row_wall_s``: how long the row took to measure. ``peak_loss_bytes``: the memory the loss's log-probs and their backward take on ``--loss-tokens``
tokens at the model's vocabulary (hidden states to gradients; on cpu the rise of the process's peak resident
set, ``VmHWM`` reset through ``/proc/self/clear_refs``), ours from chunked logits against
``reference_peak_loss_bytes`` from the whole logits (what the reference and a plain user compute); on cpu in
fp32 rows only (bf16 matmuls at that size take many minutes without bf16 units). The
``qwen2.5-0.5b`` shapes keep Qwen2.5-0.5B's widths (896 hidden, 14 heads, 2 KV groups,
4864 FFN, 151936 vocabulary) with ``--cpu-layers`` layers on cpu (24 on cuda): a 24-layer cpu step takes
minutes. On cpu the default run leaves out that shape's bf16 rows: the reference's bf16 products of its output
layer fall to a scalar GEMM on a cpu without bf16 units (measured: 158 s a step for 47 tokens, ours 17.9 s;
``--precision bf16`` runs them).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from slurm_rl.engines.model_config import ModelConfig  # noqa: E402

QUICKSTART = dict(vocab_size=64, hidden_size=64, num_layers=2, num_attention_heads=2, num_query_groups=2,
                  ffn_hidden_size=256, max_position_embeddings=256)
"""The quickstart's model (``tools/make_toy_files.py`` defaults: llama, 64 wide, 2 layers, 2 heads)."""


def model_config(name: str, device: str, cpu_layers: int, max_len: int) -> ModelConfig:
    if name == "quickstart":
        return ModelConfig(**{**QUICKSTART, "max_position_embeddings": max(256, max_len)})
    if name == "qwen2.5-0.5b":
        return ModelConfig(architecture="qwen2", vocab_size=151936, hidden_size=896,
                           num_layers=24 if device == "cuda" else cpu_layers, num_attention_heads=14,
                           num_query_groups=2, ffn_hidden_size=4864, max_position_embeddings=max(4096, max_len),
                           qkv_bias=True, tie_word_embeddings=True, rotary_base=1e6, norm_epsilon=1e-6)
    raise SystemExit(f"--models: unknown model {name!r} (quickstart, qwen2.5-0.5b)")


def make_samples(n: int, vocab: int, prompt_len: int, median: int, cap: int, seed: int) -> list[dict[str, Any]]:
    """``n`` trainer samples: prompt + a log-normal response length, advantages +-1, the loss on the response."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(min(cap, max(1, round(math.exp(math.log(median) + 0.8 * float(torch.randn(1, generator=g)))))))
        ids = torch.randint(3, vocab, (prompt_len + length,), generator=g).tolist()
        width = len(ids) - 1
        mask = [0.0] * (prompt_len - 1) + [1.0] * length
        adv = 1.0 if i % 2 else -1.0
        out.append({"input_ids": ids, "loss_mask": mask, "old_logprobs": [0.0] * width, "advantages": [adv * m for m in mask]})
    return out


def padding_fraction(batches: list[dict[str, Any]]) -> float:
    """The share of the computed token positions of ``batches`` (collated micro-batches) that are padding."""
    computed = sum(int(b["input_ids"].numel()) for b in batches)
    real = sum(int(b["attention_mask"].sum()) if "attention_mask" in b else int(b["input_ids"].numel())
               for b in batches)
    return 1.0 - real / computed


def batch_config(samples: list[dict[str, Any]], micro: int, packing: bool, max_tokens: int) -> Any:
    from slurm_rl.engines.actor.microbatch import BatchConfig

    if packing:
        return BatchConfig(global_batch_size=len(samples), micro_batch_size=1, max_tokens_per_microbatch=max_tokens,
                           remove_padding=True)
    return BatchConfig(global_batch_size=len(samples), micro_batch_size=micro)


def micro_batches(samples: list[dict[str, Any]], batch_cfg: Any) -> list[dict[str, Any]]:
    from slurm_rl.engines.actor.microbatch import collate_for, split_microbatches

    return [collate_for(batch_cfg, mb) for mb in split_microbatches(samples, batch_cfg)]


def pg_loss(logprobs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The policy-gradient term of the actor's loss at ratio 1 (old log-probs = detached current ones)."""
    ratio = torch.exp(logprobs - logprobs.detach())
    return -batch["advantages"].to(logprobs.device) * ratio


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def best_of(fn, reps: int, device: str, warm_up: bool = True) -> float:
    if warm_up:
        fn()
    return min(timed(fn, device) for _ in range(reps))


def best_of_pair(a, b, reps: int, device: str) -> tuple[float, float]:
    """Best times of ``a`` and ``b`` over ``reps`` alternating runs (after a warm-up of each): on a shared host
    both see the same load, where timing one after the other would give each its own."""
    a(), b()
    best_a = best_b = math.inf
    for _ in range(reps):
        best_a = min(best_a, timed(a, device))
        best_b = min(best_b, timed(b, device))
    return best_a, best_b


def peak_of(fn, device: str) -> int | None:
    """Peak device memory of one call of ``fn`` (cuda; None elsewhere)."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def ours(cfg: ModelConfig, samples: list[dict[str, Any]], batch_cfg: Any, precision: str, attention: str,
         device: str, reps: int, ref_step) -> dict[str, Any]:
    """Our step timed against ``ref_step`` (runs alternating), with its breakdown."""
    from slurm_rl.engines.actor.groups import GroupCache
    from slurm_rl.engines.actor.logprobs import batch_logprobs
    from slurm_rl.engines.actor.model import init_local_process_group
    from slurm_rl.engines.actor.optimizer import OptimConfig
    from slurm_rl.engines.actor.trainer import ActorTrainer

    init_local_process_group()
    trainer = ActorTrainer(cfg, OptimConfig(lr=1e-6), batch_cfg, [0], GroupCache(), seed=0, device=device,
                           precision=precision, attention=attention)
    def step() -> None:
        trainer.train_step(samples, pg_loss)

    step_s, ref_s = best_of_pair(step, ref_step, reps, device)
    peak, ref_peak = peak_of(step, device), peak_of(ref_step, device)
    batches = micro_batches(samples, batch_cfg)
    model = trainer.model

    def forward() -> None:
        with torch.no_grad():
            for b in batches:
                batch_logprobs(model, b, device)

    def forward_backward() -> None:
        trainer.flat.zero_grad()
        for b in batches:
            lp, _ = batch_logprobs(model, b, device)
            (pg_loss(lp, b) * b["loss_mask"].to(device)).sum().backward()

    # the breakdown is a guide: fewer runs than the step's figure, and none to warm up where a step is long (the
    # steps above warmed the model up)
    pieces, warm = min(reps, 2), reps > 1
    fwd_s = best_of(forward, pieces, device, warm)
    fb_s = best_of(forward_backward, pieces, device, warm)
    opt_s = best_of(lambda: trainer.optimizer.step(1e-6), pieces, device, warm)
    return {"step_s": step_s, "reference_step_s": ref_s, "reference_peak_bytes": ref_peak,
            "params": sum(p.numel() for p in model.parameters()), "peak_bytes": peak,
            "micro_batches": len(batches), "padding_fraction": padding_fraction(batches),
            "breakdown_s": {"forward": fwd_s, "backward": max(0.0, fb_s - fwd_s), "optimizer": opt_s,
                            "host_syncs": max(0.0, step_s - fb_s - opt_s)}}


def reference(cfg: ModelConfig, samples: list[dict[str, Any]], batch_cfg: Any, precision: str, device: str):
    """The plain-PyTorch step of the same model, samples and micro-batches (a callable)."""
    from transformers import AutoModelForCausalLM

    from slurm_rl.engines.convert import hf_config

    torch.manual_seed(0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_config(hf_config(cfg), attn_implementation="sdpa").to(device=device, dtype=dtype)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, **({"fused": True} if device == "cuda" else {"foreach": True}))

    def inputs(b: dict[str, Any]) -> dict[str, Any]:
        if "position_ids" in b:  # a packed row: positions restart per sample, no cache
            return {"input_ids": b["input_ids"].to(device), "position_ids": b["position_ids"].to(device),
                    "use_cache": False}
        return {"input_ids": b["input_ids"].to(device), "attention_mask": b["attention_mask"].to(device)}

    def step() -> None:  # a training loop's step: the samples collated into micro-batches (the same collation as
        batches = micro_batches(samples, batch_cfg)  # ours), forward and backward of each, clip, AdamW
        tokens = sum(float(b["loss_mask"].sum()) for b in batches)
        opt.zero_grad(set_to_none=True)
        for b in batches:
            ids = b["input_ids"].to(device)
            logits = model(**inputs(b)).logits[:, :-1].float()
            lp = torch.gather(logits, -1, ids[:, 1:].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
            ((pg_loss(lp, b) * b["loss_mask"].to(device)).sum() / tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def loss_peak_bytes(cfg: ModelConfig, tokens: int, precision: str, device: str, chunked: bool) -> int:
    """Memory the next-token log-probs of ``tokens`` positions and their backward take, from the hidden states:
    chunked (ours) or from the whole logits (the reference's way)."""
    from slurm_rl.engines.actor.logprobs import chunked_logprobs, full_logprobs

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(tokens, cfg.hidden_size, generator=g) * 0.1).to(device=device, dtype=dtype).requires_grad_()
    weight = (torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g) * 0.02).to(device=device, dtype=dtype)
    weight.requires_grad_()
    targets = torch.randint(0, cfg.vocab_size, (tokens,), generator=g).to(device)

    def run() -> None:
        if chunked:
            lp, _ = chunked_logprobs(hidden, weight, targets)
        else:
            lp, _ = full_logprobs(hidden @ weight.t(), targets)
        lp.sum().backward()

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    base = _peak_rss()
    run()
    return _peak_rss() - base


def loss_peak_in_subprocess(name: str, args: argparse.Namespace, precision: str, chunked: bool) -> int:
    """:func:`loss_peak_bytes` in a fresh process (no memory freed earlier that the allocator could reuse)."""
    import subprocess

    spec = {"model": name, "device": args.device, "cpu_layers": args.cpu_layers, "tokens": args.loss_tokens,
            "max_len": args.prompt_len + args.response_max, "precision": precision, "chunked": chunked}
    proc = subprocess.run([sys.executable, __file__, "--loss-peak-of", json.dumps(spec)], capture_output=True,
                          text=True, check=True)
    return int(proc.stdout.strip().splitlines()[-1])


def precisions(given: str | None, model: str, device: str) -> list[str]:
    """The precisions of ``model``'s rows: ``--precision``, else fp32 and bf16 (the Qwen2.5 shape on cpu: fp32; its
    bf16 reference takes ~3 s a token there, so a default run would take well over ten minutes)."""
    if given:
        return given.split(",")
    if model.startswith("qwen") and device == "cpu":
        print(f"{model}: bf16 left out of the default cpu run (--precision bf16 runs it: ~7 min for 47 tokens)",
              file=sys.stderr)
        return ["fp32"]
    return ["fp32", "bf16"]


def default_reps(model: str, device: str) -> int:
    """Timed steps per row: many of the quickstart's ~0.1 s steps (best of 10 is steady on a shared host), one of
    the Qwen2.5 shape's on cpu (10-25 s each), 3 otherwise."""
    if model == "quickstart":
        return 10
    return 1 if model.startswith("qwen") and device == "cpu" else 3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--models", default="quickstart,qwen2.5-0.5b")
    p.add_argument("--precision", default=None, help="default fp32,bf16 (on cpu the Qwen2.5 shape in fp32 only: its "
                   "reference's bf16 steps take minutes, see the module's docstring)")
    p.add_argument("--attention", default="sdpa", help="sdpa and/or local (megatron-core's unfused attention)")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--packing", default="false,true", help="rows without and with packed micro-batches")
    p.add_argument("--max-tokens", type=int, default=1024, help="the packed rows' token budget per micro-batch")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--response-median", type=int, default=96)
    p.add_argument("--response-max", type=int, default=512)
    p.add_argument("--cpu-layers", type=int, default=2)
    p.add_argument("--reps", type=int, default=None,
                   help="default: 10 for the quickstart shape (a step of ~0.1 s), 3 else, 1 for the Qwen2.5 shape on cpu")
    p.add_argument("--loss-tokens", type=int, default=4096, help="tokens of the peak_loss_bytes measurement (0: skip)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense peak for the precision")
    p.add_argument("--json", action="store_true", help="JSON lines only (else also a line per row on stderr)")
    p.add_argument("--loss-peak-of", default=None, help=argparse.SUPPRESS)  # one peak_loss_bytes figure (JSON spec)
    args = p.parse_args(argv)
    if args.loss_peak_of:
        spec = json.loads(args.loss_peak_of)
        cfg = model_config(spec["model"], spec["device"], spec["cpu_layers"], spec["max_len"])
        print(loss_peak_bytes(cfg, spec["tokens"], spec["precision"], spec["device"], spec["chunked"]))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    for name in args.models.split(","):
        cfg = model_config(name, args.device, args.cpu_layers, args.prompt_len + args.response_max)
        samples = make_samples(args.samples, cfg.vocab_size, args.prompt_len, args.response_median,
                               args.response_max, seed=1)
        real = sum(sum(s["loss_mask"]) for s in samples)
        for precision in precisions(args.precision, name, args.device):
            peaks = {}
            # bf16 matmuls of 4K tokens x 152K vocabulary take many minutes on a cpu without bf16 units: there the
            # memory figure is fp32's only (bf16's logits are half its size; the chunk bound is the same)
            if args.loss_tokens and (args.device == "cuda" or precision == "fp32"):
                peaks = {chunked: loss_peak_in_subprocess(name, args, precision, chunked) for chunked in (True, False)}
            for packing in (v.strip().lower() == "true" for v in args.packing.split(",")):
                batch_cfg = batch_config(samples, args.micro_batch, packing, args.max_tokens)
                ref_step = reference(cfg, samples, batch_cfg, precision, args.device)
                for attention in args.attention.split(","):
                    if packing and attention == "local":
                        continue  # megatron-core's local attention has no packed form (validate refuses it)
                    t_row = time.perf_counter()
                    reps = args.reps or default_reps(name, args.device)
                    got = ours(cfg, samples, batch_cfg, precision, attention, args.device, reps, ref_step)
                    ref = {"step_s": got["reference_step_s"], "peak_bytes": got["reference_peak_bytes"]}
                    row = {"device": args.device, "model": name, "layers": cfg.num_layers, "params": got["params"],
                           "precision": precision, "attention": attention, "samples": len(samples),
                           "micro_batch_size": None if packing else args.micro_batch,
                           "max_tokens_per_microbatch": args.max_tokens if packing else None,
                           "micro_batches": got["micro_batches"], "tokens_per_step": real,
                           "packing": packing, "padding_fraction": round(got["padding_fraction"], 4),
                           "ours_step_s": round(got["step_s"], 4), "reference_step_s": round(ref["step_s"], 4),
                           "ours_tokens_per_s": round(real / got["step_s"], 1),
                           "reference_tokens_per_s": round(real / ref["step_s"], 1),
                           "ratio": round(ref["step_s"] / got["step_s"], 3),
                           "breakdown_s": {k: round(v, 4) for k, v in got["breakdown_s"].items()},
                           "threads": torch.get_num_threads(), "row_wall_s": round(time.perf_counter() - t_row, 1)}
                    if peaks:
                        row.update(loss_tokens=args.loss_tokens, peak_loss_bytes=peaks[True],
                                   reference_peak_loss_bytes=peaks[False])
                    if args.device == "cuda":
                        row["peak_bytes"], row["reference_peak_bytes"] = got["peak_bytes"], ref["peak_bytes"]
                        if args.peak_tflops:
                            row["mfu"] = round(6 * got["params"] * real / got["step_s"] / (args.peak_tflops * 1e12), 4)
                    print(json.dumps(row), flush=True)
                    if not args.json:
                        print(f"{name} {precision} {attention} packing={packing}: ours {row['ours_tokens_per_s']:.0f} "
                              f"tok/s, reference {row['reference_tokens_per_s']:.0f} tok/s (x{row['ratio']}), padding "
                              f"{row['padding_fraction']:.0%}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
