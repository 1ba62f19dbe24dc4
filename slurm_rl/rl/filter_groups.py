"""DAPO's dynamic sampling (verl's ``algorithm.filter_groups``), in generation batches of an iteration.

verl's DAPO trainer draws ``data.gen_batch_size`` prompts, generates and scores them, keeps the groups
whose responses differ in ``metric`` (``np.std > 0``, or a group of one) and draws the next generation
batch until ``train_batch_size`` groups are kept (at most ``max_num_gen_batches``; 0: no limit); the
kept groups beyond that are cut off. Here the same happens in one iteration's data plane:

* generation batch ``b`` of iteration ``k`` holds the prompts at stream positions
  ``P_k + b * G`` .. ``P_k + (b + 1) * G - 1`` (``G = data.gen_batch_size``) as prompt indices
  ``b * G + j`` of ``k``, so its group and sample ids follow on from the batch before;
* the actor's leader (which cuts the mini-batches) classifies each group as it completes and opens
  batch ``b + 1`` — writes :func:`rounds_path` — once every group of batches ``0..b`` is complete and
  fewer than ``train.rollout_batch_size`` are kept; it closes the iteration's generation once enough
  are. Rollout ranks claim a batch's requests only once it is open, and their rollout is complete when
  generation is closed and every opened batch's samples are written;
* the trained groups are the first ``train.rollout_batch_size`` kept ones (in group index order under
  ``train.minibatch_order: index``, else in completion order); the rest are not trained;
* ``P_k`` is the sum of the prompts drawn by the iterations before (``prompts_drawn`` of each one's
  metrics row), so a resumed run draws the same prompts as the uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.data.layout import stage_dir

ROUNDS_STAGE = "requests"  # the rounds file lives beside the iteration's request claims
ROUNDS_FILE = "gen_batches.json"
DRAWN_KEY = "prompts_drawn"  # a metrics row's count of the prompts its iteration drew


def group_metric(rewards: Sequence[float], lengths: Sequence[int], metric: str, overlong: Any,
                 max_new_tokens: int) -> list[float]:
    """Per response, the value ``metric`` compares: ``seq_reward`` the reward as trained; ``acc`` and
    ``score`` the reward function's own score (the reward without DAPO's overlong shaping: our reward
    functions return one number, a rule reward's correctness)."""
    values = [float(r) for r in rewards]
    if metric != "seq_reward" and overlong is not None and overlong.enable:
        from slurm_rl.rewards.overlong import overlong_penalties

        penalties = overlong_penalties(list(lengths), max_new_tokens, overlong.len, overlong.penalty_factor)
        values = [v - p for v, p in zip(values, penalties)]
    return values


def keeps(values: Sequence[float]) -> bool:
    """verl's test: a group is kept when its metric's std is above 0, or it has one response."""
    return len(values) == 1 or float(np.std(np.asarray(values, np.float64))) > 0.0


def rounds_path(run_dir: str | Path, k: int) -> Path:
    """The generation batches of iteration ``k``: ``{"open": n, "closed": bool}`` (absent: batch 0 open)."""
    return stage_dir(run_dir, k, ROUNDS_STAGE) / ROUNDS_FILE


def read_rounds(run_dir: str | Path, k: int) -> tuple[int, bool]:
    """(generation batches open, generation closed) of iteration ``k``."""
    try:
        doc = read_json(rounds_path(run_dir, k))
    except FileNotFoundError:
        return 1, False
    return int(doc["open"]), bool(doc["closed"])


def write_rounds(run_dir: str | Path, k: int, opened: int, closed: bool) -> None:
    """Open generation batches ``0..opened-1`` of iteration ``k``; ``closed``: no more will open."""
    atomic_write_json(rounds_path(run_dir, k), {"open": int(opened), "closed": bool(closed)})


def prompts_before(rows: Sequence[dict[str, Any]], k: int, per_iteration: int) -> int:
    """Stream position of iteration ``k``'s first prompt: the prompts drawn by iterations ``0..k-1``
    (each one's last metrics row; ``per_iteration`` where a row does not say). ``LookupError`` when
    a row of those iterations is missing."""
    last: dict[int, dict[str, Any]] = {}
    for row in rows:
        it = row.get("iteration")
        if isinstance(it, int) and it < k:
            last[it] = row
    missing = [j for j in range(k) if j not in last]
    if missing:
        raise LookupError(f"metrics.jsonl has no row for iteration(s) {missing[:5]} (their prompts drawn)")
    return sum(int(last[j].get(DRAWN_KEY, per_iteration)) for j in range(k))


def prompts_per_batch(cfg: Any) -> int:
    """Prompts of one generation batch: ``data.gen_batch_size`` (default ``train.rollout_batch_size``)
    under dynamic sampling, else the iteration's ``train.rollout_batch_size``."""
    if cfg.algorithm.filter_groups.enable and cfg.data.gen_batch_size:
        return int(cfg.data.gen_batch_size)
    return int(cfg.train.rollout_batch_size)
