"""Where the actor's training step spends its time: torch.profiler over one step, one JSON line per model depth.

    .venv/bin/python tools/profile_step.py [--device cpu|cuda] [--model quickstart|qwen2.5-0.5b]
                                           [--layers 1,2,4,8] [--attention sdpa] [--precision fp32] [--top 12]

A fixed cost per step shows as figures that grow with the number of parameter tensors (layers) rather than
with the tokens: per line ``param_tensors``, ``ops_per_step`` (operator calls the profiler saw in one step),
``host_syncs`` (``aten::_local_scalar_dense`` calls: every ``.item()`` / ``float(tensor)``, a host-device
sync on cuda), ``step_s``, the ``top`` operators by self CPU time, the ``most_called`` ones and, on cuda, the top kernels by self CUDA
time, ``gpu_busy_fraction`` (the kernels' summed time over the step's wall time: the rest is the GPU waiting
on the host) and ``launches`` (``cudaLaunchKernel`` calls). The step is
:meth:`ActorTrainer.train_step` on samples as ``tools/bench_step.py`` makes them (``--samples``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_step import make_samples, model_config, pg_loss, sync  # noqa: E402


def profile_one(layers: int, args: argparse.Namespace) -> dict:
    import dataclasses

    from torch.profiler import ProfilerActivity, profile

    from slurm_rl.engines.actor.groups import GroupCache
    from slurm_rl.engines.actor.microbatch import BatchConfig
    from slurm_rl.engines.actor.model import init_local_process_group
    from slurm_rl.engines.actor.optimizer import OptimConfig
    from slurm_rl.engines.actor.trainer import ActorTrainer

    init_local_process_group()
    cfg = dataclasses.replace(model_config(args.model, args.device, layers, args.prompt_len + args.response_max),
                              num_layers=layers)
    samples = make_samples(args.samples, cfg.vocab_size, args.prompt_len, args.response_median,
                           args.response_max, seed=1)
    batch_cfg = (BatchConfig(global_batch_size=len(samples), micro_batch_size=1, max_tokens_per_microbatch=args.max_tokens,
                             remove_padding=True) if args.packing == "true"
                 else BatchConfig(global_batch_size=len(samples), micro_batch_size=args.micro_batch))
    trainer = ActorTrainer(cfg, OptimConfig(lr=1e-6), batch_cfg,
                           [0], GroupCache(), seed=0, device=args.device, precision=args.precision,
                           attention=args.attention)
    trainer.train_step(samples, pg_loss)  # warm-up: allocations, lazy inits
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    sync(args.device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        trainer.train_step(samples, pg_loss)
        sync(args.device)
        step_s = time.perf_counter() - t0
    events = prof.key_averages()
    count = {e.key: e.count for e in events}
    row = {"device": args.device, "model": args.model, "layers": layers, "precision": args.precision,
           "packing": args.packing == "true",
           "attention": args.attention, "param_tensors": sum(1 for _ in trainer.model.parameters()),
           "params": sum(p.numel() for p in trainer.model.parameters()), "step_s": round(step_s, 4),
           "ops_per_step": sum(e.count for e in events if e.key.startswith("aten::")),
           "host_syncs": count.get("aten::_local_scalar_dense", 0),
           "top": [{"op": e.key, "calls": e.count, "self_cpu_s": round(e.self_cpu_time_total / 1e6, 4)}
                   for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.top]],
           "most_called": [{"op": e.key, "calls": e.count} for e in sorted(
               (e for e in events if e.key.startswith("aten::")), key=lambda e: -e.count)[:args.top]]}
    if args.device == "cuda":
        kernels = [e for e in events if e.self_device_time_total > 0 and not e.key.startswith("aten::")]
        busy = sum(e.self_device_time_total for e in kernels) / 1e6
        row.update(gpu_busy_fraction=round(busy / step_s, 4), launches=count.get("cudaLaunchKernel", 0),
                   top_kernels=[{"kernel": e.key[:120], "calls": e.count,
                                 "self_cuda_s": round(e.self_device_time_total / 1e6, 4)}
                                for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:args.top]],
                   peak_bytes=torch.cuda.max_memory_allocated())
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--model", default="quickstart", choices=["quickstart", "qwen2.5-0.5b"])
    p.add_argument("--layers", default="1,2,4,8")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "local"])
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--packing", default="false", choices=["false", "true"], help="packed micro-batches (--max-tokens)")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--response-median", type=int, default=96)
    p.add_argument("--response-max", type=int, default=512)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for layers in (int(x) for x in args.layers.split(",")):
        print(json.dumps(profile_one(layers, args)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
