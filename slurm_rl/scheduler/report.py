"""Simulation results: per-iteration figures, JSON, and a rich table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from slurm_rl.placement import COMPONENTS


@dataclass
class IterationReport:
    """One iteration: wall time, GPU-seconds busy/idle per component, bubbles, changes.

    ``busy``: GPUs computing (rollout: instances with at least one running request);
    ``idle``: GPUs held by the component but not computing (waiting for data, switching,
    resharding); ``unassigned``: GPUs no component holds. ``bubble_gpu_s`` is every
    GPU-second not busy: ``gpus * time_s - sum(busy)``.
    """

    iteration: int
    time_s: float
    busy_gpu_s: dict[str, float] = field(default_factory=dict)
    idle_gpu_s: dict[str, float] = field(default_factory=dict)
    unassigned_gpu_s: float = 0.0
    bubble_gpu_s: float = 0.0
    placement_changes: int = 0
    migrated_requests: int = 0
    decisions: list[dict[str, Any]] = field(default_factory=list)
    #: when each phase ended (seconds into the iteration): ``rollout_end_s`` (last response),
    #: ``inference_end_s`` (last sample scored), ``last_minibatch_start_s``
    phases: dict[str, float] = field(default_factory=dict)
    #: lower bounds of the iteration: ``tail_s`` (the longest response decoded alone from t=0,
    #: then inference of its group and the last mini-batch on every GPU), ``work_s`` (every
    #: busy GPU-second spread over all GPUs)
    bounds: dict[str, float] = field(default_factory=dict)


@dataclass
class SimReport:
    """A whole simulated run."""

    policy: str
    gpus: int
    use_pre_process_policy: bool
    use_wait_before_last_iter_policy: bool
    seed: int
    iterations: list[IterationReport] = field(default_factory=list)
    decide_s: list[float] = field(default_factory=list, repr=False)  # CPU seconds of each policy call

    @property
    def total_time_s(self) -> float:
        return sum(it.time_s for it in self.iterations)

    @property
    def mean_iteration_s(self) -> float:
        return self.total_time_s / max(1, len(self.iterations))

    def as_dict(self, with_decisions: bool = True) -> dict[str, Any]:
        """Plain-JSON dictionary."""
        out = asdict(self)
        out.pop("decide_s")  # wall-clock figures vary run to run: see ``decide_ms``
        if not with_decisions:
            for it in out["iterations"]:
                it.pop("decisions")
        out["total_time_s"] = round(self.total_time_s, 3)
        out["mean_iteration_s"] = round(self.mean_iteration_s, 3)
        return _rounded(out)

    def decide_ms(self) -> dict[str, float]:
        """CPU milliseconds per policy call: calls, median, 99th percentile, max."""
        d = sorted(self.decide_s)
        if not d:
            return {"calls": 0}
        return {"calls": len(d), "median": round(1e3 * d[len(d) // 2], 3),
                "p99": round(1e3 * d[min(len(d) - 1, int(0.99 * len(d)))], 3), "max": round(1e3 * d[-1], 3)}

    def to_json(self, with_decisions: bool = True) -> str:
        """JSON text of ``as_dict``."""
        return json.dumps(self.as_dict(with_decisions), indent=2, sort_keys=True)


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return round(obj, 3)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


def print_report(report: SimReport, console: Any = None) -> None:
    """Print one row per iteration (rich table)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    flags = [n for n, on in (("pre_process", report.use_pre_process_policy),
                             ("wait_before_last_iter", report.use_wait_before_last_iter_policy))
             if on]
    title = (f"simulated {report.policy}{' + ' + ' + '.join(flags) if flags else ''} "
             f"on {report.gpus} GPUs (seed {report.seed})")
    table = Table(title=title)
    table.add_column("iter", justify="right")
    table.add_column("time s", justify="right")
    for comp in COMPONENTS:
        table.add_column(f"{comp} busy/idle GPU-s", justify="right")
    table.add_column("unassigned GPU-s", justify="right")
    table.add_column("bubble GPU-s", justify="right")
    table.add_column("changes", justify="right")
    for it in report.iterations:
        table.add_row(
            str(it.iteration), f"{it.time_s:.1f}",
            *(f"{it.busy_gpu_s.get(c, 0):.0f}/{it.idle_gpu_s.get(c, 0):.0f}"
              for c in COMPONENTS),
            f"{it.unassigned_gpu_s:.0f}", f"{it.bubble_gpu_s:.0f}", str(it.placement_changes))
    table.caption = f"total {report.total_time_s:.1f} s, mean {report.mean_iteration_s:.1f} s/iteration"
    console.print(table)
