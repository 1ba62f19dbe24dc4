"""Evaluation on ``data.val_files``: before the first iteration and every ``eval.every`` iterations.

The lowest rollout rank of the iteration evaluates the weights it has just received (version
``k``): ``eval.n`` samples per validation prompt at ``eval.temperature`` (greedy by default), each
with its own seed, scored by the run's reward. Figures (``val/reward_mean``: mean reward of all
samples; ``val/pass@1``: the share of samples scoring 1 or more; ``val/mean@n``: the mean over
prompts of each prompt's mean reward over its ``n`` samples) go to ``RUN_DIR/eval/iter-K.json``;
the metrics row of iteration ``k`` takes them in, so they reach ``metrics.jsonl``, TensorBoard and
``slurm-rl inspect``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

EVAL_DIR = "eval"


def eval_due(every: int, iteration: int) -> bool:
    """Whether iteration ``iteration`` is evaluated (``every`` 0: never; iteration 0 always)."""
    return every > 0 and iteration % every == 0


def eval_path(run_dir: Path, iteration: int) -> Path:
    """Where the figures of the evaluation at ``iteration`` are written."""
    return Path(run_dir) / EVAL_DIR / f"iter-{iteration:06d}.json"


def eval_figures(rewards: Sequence[float], n: int) -> dict[str, float]:
    """``val/*`` figures of ``rewards`` laid out prompt by prompt, ``n`` samples each."""
    if not rewards:
        return {}
    per_prompt = [rewards[i:i + n] for i in range(0, len(rewards), n)]
    return {"val/reward_mean": sum(rewards) / len(rewards),
            "val/pass@1": sum(1.0 for r in rewards if r >= 1.0) / len(rewards),
            "val/mean@n": sum(sum(p) / len(p) for p in per_prompt) / len(per_prompt),
            "val/prompts": float(len(per_prompt)), "val/n": float(n)}


def write_eval(run_dir: Path, iteration: int, figures: dict[str, Any]) -> Path:
    """Write the figures of one evaluation atomically."""
    from slurm_rl.fsio import atomic_write_json

    path = eval_path(run_dir, iteration)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"iteration": iteration, **figures})
    return path
