#!/usr/bin/env python3
"""Does each RL recipe learn the quickstart task? Runs ``configs/quickstart.yaml`` (4 CPU ranks, single-digit
addition, GSM8K's reward) once per recipe and prints one JSON line each: the mean reward of the first and
the last 20 iterations, the run's wall seconds, and per recipe what it adds (PPO: the critic's value loss
over the first and last 20 iterations; DAPO: prompts drawn and groups dropped per iteration).

Recipes (overrides of the quickstart config):
- ``grpo``: the quickstart as it is (auto scheduling, KL loss 0.05);
- ``ppo``: ``algorithm.adv_estimator: gae`` (lambda 0.95) with a critic on the actor's ranks
  (``actor,critic: 0``, ``critic.lr`` 3e-3), auto;
- ``dapo``: clip-higher 0.28, no KL, dynamic sampling (``filter_groups`` on ``acc``, generation batches of
  16 prompts), static placement (dynamic sampling needs it);
- ``collocated``: the quickstart's GRPO with every component on all 4 ranks (RLinf's collocated mode
  ``actor,rollout,inference: all``, static: each rank decodes, scores, then trains);
- ``ppo_own_critic``: ``ppo`` with the critic on a rank of its own (``actor: 0, critic: 1, rollout: 2,
  inference: 3``), static (no policy moves such a critic).

    .venv/bin/python tools/bench_algorithms.py [--recipes ppo dapo] [--iterations 300]

Needs ``runs/toy`` (``tools/make_toy_files.py runs/toy --max-operand 4``, which ``tools/quickstart.sh`` runs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = {
    "grpo": [],
    "ppo": ["algorithm.adv_estimator=gae", "algorithm.lam=0.95", "critic.lr=3.0e-3",
            'cluster.component_placement={"actor,critic": 0, rollout: 1-2, inference: 3}'],
    "dapo": ["cluster.auto_scheduler=false", "algorithm.kl_coef=0.0", "algorithm.clip_ratio_high=0.28",
             "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc", "data.gen_batch_size=16"],
    "collocated": ["cluster.auto_scheduler=false", 'cluster.component_placement={"actor,rollout,inference": all}'],
    "ppo_own_critic": ["algorithm.adv_estimator=gae", "algorithm.lam=0.95", "critic.lr=3.0e-3",
                       "cluster.auto_scheduler=false",
                       "cluster.component_placement={actor: 0, critic: 1, rollout: 2, inference: 3}"],
}
WINDOW = 20


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def run(recipe: str, iterations: int, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "slurm_rl.cli", "run", "configs/quickstart.yaml", f"runtime.run_dir={run_dir}",
           f"train.num_iterations={iterations}", *RECIPES[recipe], "--no-inspect"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    seconds = time.time() - t0
    if proc.returncode != 0:
        return {"recipe": recipe, "error": proc.stderr[-2000:], "returncode": proc.returncode}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in rows]
    out = {"recipe": recipe, "overrides": RECIPES[recipe], "iterations": len(rows), "seconds": round(seconds, 1),
           f"reward_first_{WINDOW}": mean(rewards[:WINDOW]), f"reward_last_{WINDOW}": mean(rewards[-WINDOW:])}
    if recipe.startswith("ppo"):
        vf = [r["critic/vf_loss"] for r in rows]
        out.update({f"vf_loss_first_{WINDOW}": mean(vf[:WINDOW]), f"vf_loss_last_{WINDOW}": mean(vf[-WINDOW:])})
    if recipe == "dapo":
        out.update({"prompts_drawn_per_iteration": mean([r["prompts_drawn"] for r in rows]),
                    "dropped_groups_per_iteration": mean([r["filter_groups/dropped_groups"] for r in rows])})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--iterations", type=int, default=300)
    args = parser.parse_args()
    if not (REPO / "runs" / "toy" / "model").is_dir():
        sys.exit("bench_algorithms: runs/toy is missing: run tools/make_toy_files.py runs/toy --max-operand 4")
    with tempfile.TemporaryDirectory(prefix="bench_algorithms_") as tmp:
        for recipe in args.recipes:
            print(json.dumps(run(recipe, args.iterations, Path(tmp) / recipe)), flush=True)


if __name__ == "__main__":
    main()
