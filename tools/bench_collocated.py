#!/usr/bin/env python3
"""A collocated rank on cpu: what its switches between phases cost and the memory it holds, as JSON.

Per model shape, two short runs of the quickstart task (single-digit addition, GSM8K's reward, static):
- **collocated**: one rank serves actor, rollout and inference (RLinf's single-GPU example
  ``actor,rollout,inference: 0``), the actor's state parked in host memory while it decodes and scores
  (``actor.offload_weight/grad/optimizer``), the hf rollout engine parked while it trains;
- **disaggregated**: the same job on three ranks (actor 0, rollout 1, inference 2).

One JSON line per shape:
- ``to_train_s``: from the collocated rank's last rollout or inference span of an iteration to its first
  training step (the switch: the rollout engine released, the actor's state back from host memory), the
  median over the iterations after the first; ``to_rollout_s``: from its last training step to the next
  iteration's first decode (the state parked, the iteration gate, the weights copied into the engine);
- ``offload``: per direction (``generate``: state to host memory; ``train``: back), the median seconds and
  the bytes of each move;
- ``peak_rss_gib``: the peak resident memory of the collocated rank and of the disaggregated run's actor,
  rollout and inference ranks (each rank's last heartbeat: ``ru_maxrss``, the interpreter it was forked
  from included, so the four share one baseline);
- ``iteration_s`` and ``samples_per_s`` of each run (the median iteration after the first);
- on cuda, ``peak_gpu_gib`` of the collocated rank per phase (``train``: the actor alone; ``generate``: the
  rollout and inference alone; each switch reads the device's peak of the phase it ends and resets it).

``--device cuda`` (not run yet: no GPU has been at hand) runs the collocated job on one GPU (what ``tools/gpu_check.sh`` does, with Qwen2.5-0.5B's
24 layers) and the disaggregated one only where three GPUs are visible; ``--rollout vllm`` decodes with vLLM
(sleep mode between phases) where it is installed.

Shapes: ``quickstart`` (runs/toy/model: llama, 64 wide, 2 layers) and ``qwen2.5-0.5b`` (Qwen2.5-0.5B's
widths: 896 hidden, 14 heads, 2 KV groups, 4864 FFN, 151936 vocabulary, tied embeddings, as a random
Llama-style model with the character tokenizer; ``--layers`` of its 24 layers on cpu).

    .venv/bin/python tools/bench_collocated.py [--shapes quickstart,qwen2.5-0.5b] [--layers 2] [--iterations 4]
        [--device cpu|cuda] [--rollout hf|vllm]

Needs ``runs/toy`` (``tools/make_toy_files.py runs/toy --max-operand 4``, which ``tools/quickstart.sh`` runs), or
another directory of those files (``--toy``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GIB = 1024.0 ** 3
COLLOCATED = {"actor,rollout,inference": 0}
DISAGGREGATED = {"actor": 0, "rollout": 1, "inference": 2}
OFFLOAD = ["actor.offload_weight=true", "actor.offload_grad=true", "actor.offload_optimizer=true"]
BATCH = ["train.rollout_batch_size=8", "train.group_size=4", "train.global_batch_size=16",
         "train.micro_batch_size=8", "cluster.auto_scheduler=false", "train.minibatch_order=index"]
SHAPES = {
    "quickstart": [],
    "qwen2.5-0.5b": ["model.path=null", "model.vocab_size=151936", "model.hidden_size=896",
                     "model.num_attention_heads=14", "model.num_query_groups=2", "model.ffn_hidden_size=4864",
                     "model.tie_word_embeddings=true", "model.max_position_embeddings=256"],
}


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def toy_overrides(toy: Path) -> list[str]:
    """The quickstart's model and prompts read from ``toy`` (``tools/make_toy_files.py`` output)."""
    return [f"model.path={toy / 'model'}", f"data.train_files=[{toy / 'train.jsonl'}]"]


def launch(run_dir: Path, placement: dict[str, int], overrides: list[str]) -> float:
    """Run the quickstart config with ``overrides`` on ``placement``; its wall seconds (exit on failure)."""
    from slurm_rl.launch import zygote

    args = ["run", "configs/quickstart.yaml", f"runtime.run_dir={run_dir}",
            f"cluster.gpus_per_node={len(set(placement.values()))}",
            f"cluster.component_placement={json.dumps(placement)}", *BATCH, *overrides, "--no-inspect"]
    cmd = zygote.command("slurm_rl.cli", args, "cpu", dict(os.environ))  # forked where a zygote serves (SLURM_RL_ZYGOTE)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench_collocated: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.time() - t0


def spans(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    path = run_dir / "control" / "activity" / f"rank-{rank:04d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def peak_rss_gib(run_dir: Path, rank: int) -> float:
    doc = json.loads((run_dir / "control" / "heartbeats" / f"rank-{rank:04d}.json").read_text())
    return round(doc["peak_rss_bytes"] / GIB, 3)


def iteration_figures(run_dir: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    later = [r["seconds"] for r in rows[1:]] or [r["seconds"] for r in rows]
    return {"iteration_s": median(later), "samples_per_s": round(rows[0]["samples"] / statistics.median(later), 2)}


def phase_peaks_gib(run_dir: Path) -> dict[str, float] | None:
    """On cuda: the collocated rank's device memory peak per phase (the switch ending it records it)."""
    moves = [s for s in spans(run_dir, 0) if s["kind"] == "offload" and "peak_gpu_bytes" in s]
    if not moves:
        return None
    ended = {"train": "generate", "generate": "train"}  # a switch to train ends the generate phase
    return {ended[phase]: round(max(s["peak_gpu_bytes"] for s in moves if s["phase"] == phase) / GIB, 3)
            for phase in ("train", "generate") if any(s["phase"] == phase for s in moves)}


def switches(run_dir: Path) -> dict[str, Any]:
    """The collocated rank's phase switches, from its spans (see the module docstring)."""
    sp = spans(run_dir, 0)
    iterations = sorted({s["iteration"] for s in sp if s["kind"] == "actor"})
    to_train, to_rollout = [], []
    for k in iterations[1:]:
        decode = [s for s in sp if s["kind"] in ("rollout", "inference") and s.get("iteration") == k]
        steps = [s for s in sp if s["kind"] == "actor" and s.get("iteration") == k]
        before = [s for s in sp if s["kind"] == "actor" and s.get("iteration") == k - 1]
        first_decode = [s["start"] for s in sp if s["kind"] == "rollout" and s.get("iteration") == k]
        if decode and steps:
            to_train.append(min(s["start"] for s in steps) - max(s["end"] for s in decode))
        if before and first_decode:
            to_rollout.append(min(first_decode) - max(s["end"] for s in before))
    offload: dict[str, Any] = {}
    for phase in ("generate", "train"):
        moves = [s for s in sp if s["kind"] == "offload" and s.get("phase") == phase]
        offload[phase] = {"moves": len(moves), "median_s": median([s["end"] - s["start"] for s in moves]),
                          "bytes": max((int(s["bytes"]) for s in moves), default=0)}
    return {"to_train_s": median(to_train), "to_rollout_s": median(to_rollout), "offload": offload}


def bench(shape: str, layers: int, iterations: int, tmp: Path, device: str, rollout: str,
          disaggregated: bool, toy: Path) -> dict[str, Any]:
    overrides = [*toy_overrides(toy), *SHAPES[shape], f"train.num_iterations={iterations}",
                 f"runtime.device={device}", f"rollout.backend={rollout}"]
    if shape != "quickstart":
        overrides.append(f"model.num_layers={layers}")
    shared, apart = tmp / f"{shape}-collocated", tmp / f"{shape}-disaggregated"
    out: dict[str, Any] = {"shape": shape, "layers": None if shape == "quickstart" else layers, "device": device,
                           "rollout": rollout, "iterations": iterations}
    wall = launch(shared, COLLOCATED, [*overrides, *OFFLOAD])
    out.update(switches(shared))
    out["peak_rss_gib"] = {"collocated": peak_rss_gib(shared, 0)}
    out["collocated"] = {**iteration_figures(shared), "wall_s": round(wall, 1)}
    peaks = phase_peaks_gib(shared)
    if peaks is not None:
        out["peak_gpu_gib"] = peaks
    if disaggregated:
        wall = launch(apart, DISAGGREGATED, overrides)
        out["peak_rss_gib"].update({"actor": peak_rss_gib(apart, 0), "rollout": peak_rss_gib(apart, 1),
                                    "inference": peak_rss_gib(apart, 2)})
        out["disaggregated"] = {**iteration_figures(apart), "wall_s": round(wall, 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="quickstart,qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=2, help="layers of the qwen2.5-0.5b shapes on cpu (of 24)")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rollout", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--toy", type=Path, default=REPO / "runs" / "toy", help="the toy files (default: runs/toy)")
    args = parser.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        sys.exit(f"bench_collocated: --shapes: unknown {unknown} (known: {', '.join(SHAPES)})")
    if args.iterations < 2:
        sys.exit(f"bench_collocated: --iterations: got {args.iterations}, at least 2 (the first one warms up)")
    if not (args.toy / "model").is_dir():
        sys.exit(f"bench_collocated: {args.toy} has no model: run tools/make_toy_files.py {args.toy} --max-operand 4")
    disaggregated = args.device == "cpu" or _cuda_devices() >= len(DISAGGREGATED)
    with tempfile.TemporaryDirectory(prefix="bench_collocated_") as tmp:
        for shape in shapes:
            print(json.dumps(bench(shape, args.layers, args.iterations, Path(tmp), args.device, args.rollout,
                                   disaggregated, args.toy.absolute())), flush=True)


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count()


if __name__ == "__main__":
    main()
