"""Peak memory of one actor training step per precision and activation recompute (JSON lines).

Model: Qwen2.5-0.5B's shapes (``slurm_rl.toy.checkpoint.QWEN25_05B``: hidden 896, 24 layers, 14
heads, 2 query groups, ffn 4864, vocabulary 151936, tied embeddings, q/k/v biases, qwen2; about
494M parameters) with random weights, or ``--tiny`` (hidden 128, 1 layer, vocabulary 512: a check
of the script itself). One rank: a one-process gloo world (``init_local_process_group``), an
``ActorTrainer`` on ranks ``[0]`` (TP 1, DP 1, AdamW without ZeRO-1), ``--steps`` training steps
(default 1) on ``--batch`` samples of ``--seq`` tokens (loss on every target) in micro-batches of
``--micro-batch`` samples (default: the whole batch in one).

Every configuration (``--precision`` x ``--recompute``, default fp32, bf16 x none, full) runs in a
process of its own, so no configuration inherits another's peak or allocator pools: on cpu a child
forked from this process once it has imported torch, megatron-core and our trainer (and built
nothing), the state a fresh interpreter reaches after its imports; on cuda (no fork after CUDA) a
FRESH Python process (this script with ``--worker``). Host memory is the process's resident set size (RSS):

``rss_start_gib``        RSS after the imports, before the model is built;
``rss_after_build_gib``  RSS after the trainer is built: the model, the fp32 master weights and
                         both Adam moments (12 bytes per parameter), the fp32 gradient buffer
                         (4), in bf16 the bf16 compute copy of the parameters (2);
``peak_rss_build_gib``   ``ru_maxrss`` after the build (the build's transient: megatron allocates
                         and initialises the parameters before the trainer copies them into its
                         flat buffers);
``peak_rss_gib``         ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` after the step(s): the
                         process's peak, the larger of the build's and the step's;
``step_peak_rss_gib``    the peak during the step(s) alone: the peak is reset to the current RSS
                         after the build (Linux ``/proc/self/clear_refs`` 5, which ``ru_maxrss``
                         follows) and read after the step(s); null where the reset is refused;
``step_added_gib``       ``step_peak_rss_gib - rss_after_build_gib``: what the step held at its
                         peak on top of the built state -- activations kept for the backward
                         pass, the logits and their gradient, bf16 gradients in flight and the
                         optimizer's temporaries (the part recompute and precision change).

With ``--device cuda`` the same RSS figures plus ``torch.cuda.memory_allocated`` after the build
(``cuda_after_build_gib``), ``torch.cuda.max_memory_allocated`` after the build
(``cuda_peak_build_gib``) and during the step(s) (``cuda_step_peak_gib``, peak statistics reset
after the build) and their difference ``cuda_step_added_gib``: on CUDA the model and its state
live in GPU memory, and those are the figures that matter.

``build_s``: seconds to build the trainer; ``step_s``: seconds of each step (the first includes
one-time work; on CUDA kernel selection and allocator growth); ``loss`` of each step and
``finite`` (all finite). Exit status 1 when a configuration failed or gave a non-finite loss.

    .venv/bin/python tools/bench_memory.py
    .venv/bin/python tools/bench_memory.py --batch 1 --seq 256 --precision bf16 --recompute full
    .venv/bin/python tools/bench_memory.py --device cuda --steps 3
    .venv/bin/python tools/bench_memory.py --tiny --seq 32
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import time
from typing import Any

from bench_reshard import peak_rss, reset_peak_rss  # tools/, beside this script

GIB = 2.0 ** 30


def model_config(tiny: bool) -> Any:
    """Qwen2.5-0.5B's shapes, or a tiny model of the same architecture."""
    from slurm_rl.engines.model_config import ModelConfig

    if tiny:
        return ModelConfig(vocab_size=512, hidden_size=128, num_layers=1, num_attention_heads=4,
                           num_query_groups=2, ffn_hidden_size=256, max_position_embeddings=2048,
                           tie_word_embeddings=True, architecture="qwen2", qkv_bias=True,
                           rotary_base=1000000.0, norm_epsilon=1e-6)
    return ModelConfig(vocab_size=151936, hidden_size=896, num_layers=24, num_attention_heads=14,
                       num_query_groups=2, ffn_hidden_size=4864, max_position_embeddings=32768,
                       tie_word_embeddings=True, architecture="qwen2", qkv_bias=True,
                       rotary_base=1000000.0, norm_epsilon=1e-6)


def _rss() -> float:
    """Current resident set size in bytes (VmRSS)."""
    with open("/proc/self/status") as f:
        found = re.search(r"VmRSS:\s+(\d+)", f.read())
    return float(found.group(1)) * 1024 if found else peak_rss()




def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration in this (fresh) process: build, step(s), figures."""
    import torch

    torch.set_num_threads(args.threads)
    from slurm_rl.engines.actor.groups import GroupCache
    from slurm_rl.engines.actor.microbatch import BatchConfig
    from slurm_rl.engines.actor.model import init_local_process_group, preload_megatron
    from slurm_rl.engines.actor.optimizer import OptimConfig
    from slurm_rl.engines.actor.trainer import ActorTrainer

    precision, recompute = args.precision[0], args.recompute[0]  # one of each in a worker
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    init_local_process_group()
    preload_megatron(args.device)  # imports count as the start, not the build
    cfg = model_config(args.tiny)
    out: dict[str, Any] = {"model": "tiny" if args.tiny else "qwen2.5-0.5b-shapes",
                           "params": cfg.num_parameters(), "precision": precision,
                           "recompute": recompute, "device": args.device,
                           "batch": args.batch, "seq": args.seq,
                           "micro_batch": args.micro_batch or args.batch, "steps": args.steps,
                           "threads": args.threads, "rss_start_gib": _rss() / GIB}
    t0 = time.perf_counter()
    trainer = ActorTrainer(cfg, OptimConfig(),
                           BatchConfig(global_batch_size=args.batch,
                                       micro_batch_size=args.micro_batch or args.batch),
                           [0], GroupCache(), seed=0, device=args.device,
                           precision=precision, recompute=recompute)
    if cuda:
        torch.cuda.synchronize()
    out["build_s"] = time.perf_counter() - t0
    out["rss_after_build_gib"] = _rss() / GIB
    out["peak_rss_build_gib"] = peak_rss() / GIB
    if cuda:
        out["cuda_after_build_gib"] = torch.cuda.memory_allocated() / GIB
        out["cuda_peak_build_gib"] = torch.cuda.max_memory_allocated() / GIB
        torch.cuda.reset_peak_memory_stats()
    gen = torch.Generator().manual_seed(1)
    samples = [{"input_ids": torch.randint(0, cfg.vocab_size, (args.seq,), generator=gen),
                "loss_mask": torch.ones(args.seq - 1)} for _ in range(args.batch)]
    reset = reset_peak_rss()
    steps, losses = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(trainer.train_step(samples)["loss"])
        if cuda:
            torch.cuda.synchronize()
        steps.append(time.perf_counter() - t0)
    out["step_s"] = steps
    out["loss"] = losses
    out["finite"] = all(math.isfinite(x) for x in losses)
    out["peak_rss_gib"] = max(peak_rss() / GIB, out["peak_rss_build_gib"])
    out["step_peak_rss_gib"] = peak_rss() / GIB if reset else None
    out["step_added_gib"] = (out["step_peak_rss_gib"] - out["rss_after_build_gib"]
                             if reset else None)
    if cuda:
        out["cuda_step_peak_gib"] = torch.cuda.max_memory_allocated() / GIB
        out["cuda_step_added_gib"] = out["cuda_step_peak_gib"] - out["cuda_after_build_gib"]
    return out


def preload(args: argparse.Namespace) -> None:
    """Import what :func:`worker` imports (no torch op, no thread): the forked configurations start from here."""
    import torch  # noqa: F401

    from slurm_rl.engines.actor import groups, microbatch, optimizer, trainer  # noqa: F401
    from slurm_rl.engines.actor.model import preload_megatron

    preload_megatron(args.device)


def forked(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`worker` in a child forked from this process (its row, or ``error`` with why it gave none)."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the child: one configuration, its row on the pipe, then out without Python's exit handlers
        os.close(read_fd)
        code = 1
        try:
            with os.fdopen(write_fd, "w") as out:
                json.dump(worker(args), out)
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write_fd)
    deadline = time.monotonic() + args.timeout_s
    chunks = []
    with os.fdopen(read_fd, "rb") as pipe:
        while True:
            if not select.select([pipe], [], [], max(0.0, deadline - time.monotonic()))[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"precision": args.precision[0], "recompute": args.recompute[0],
                        "error": f"no result within --timeout-s {args.timeout_s}"}
            chunk = pipe.read1(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code == 0 and chunks:
        return json.loads(b"".join(chunks))
    return {"precision": args.precision[0], "recompute": args.recompute[0],
            "error": f"the configuration's process exited with code {code} (its traceback is on stderr)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"],
                        choices=["fp32", "bf16"])
    parser.add_argument("--recompute", nargs="+", default=["none", "full"],
                        choices=["none", "selective", "full"])
    parser.add_argument("--batch", type=int, default=2, help="samples per step")
    parser.add_argument("--seq", type=int, default=512, help="tokens per sample")
    parser.add_argument("--micro-batch", type=int, default=0,
                        help="samples per micro-batch (default: the whole batch)")
    parser.add_argument("--steps", type=int, default=1, help="training steps per configuration")
    parser.add_argument("--tiny", action="store_true", help="a tiny qwen2 model (script check)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch CPU threads (default: every core)")
    parser.add_argument("--timeout-s", type=float, default=3600,
                        help="per configuration; a configuration past it prints an error line")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seq < 2 or args.batch < 1 or args.steps < 1:
        parser.error("--seq >= 2, --batch >= 1 and --steps >= 1")
    micro = args.micro_batch or args.batch
    if args.batch % micro:
        parser.error(f"--micro-batch {micro} does not divide --batch {args.batch}")
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: torch.cuda.is_available() is False")
    if args.device == "cpu":
        preload(args)
    failed = False
    for precision in args.precision:
        for recompute in args.recompute:
            if args.device == "cpu":
                row = forked(argparse.Namespace(**{**vars(args), "precision": [precision],
                                                   "recompute": [recompute]}))
                print(json.dumps(row), flush=True)
                failed = failed or "error" in row or not row["finite"]
                continue
            cmd = [sys.executable, os.path.abspath(__file__), "--worker",
                   "--precision", precision, "--recompute", recompute,
                   "--batch", str(args.batch), "--seq", str(args.seq),
                   "--micro-batch", str(micro), "--steps", str(args.steps),
                   "--device", args.device, "--threads", str(args.threads)]
            if args.tiny:
                cmd.append("--tiny")
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      timeout=args.timeout_s)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                if proc.returncode == 0 and lines:
                    print(lines[-1], flush=True)
                    failed = failed or not json.loads(lines[-1])["finite"]
                    continue
                error = f"rc {proc.returncode}: {proc.stderr[-1500:]}"
            except subprocess.TimeoutExpired:
                error = f"no result within --timeout-s {args.timeout_s}"
            failed = True
            print(json.dumps({"precision": precision, "recompute": recompute,
                              "error": error}), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
