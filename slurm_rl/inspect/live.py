"""Live progress of a run, read from its files only (works from a login node on a job's RUN_DIR).

:class:`RunMonitor` turns what the ranks and the coordinator write (progress files with startup
phases, epochs, ``metrics.jsonl``, ``control/coordinator.json``) into lines: startup phases by
group of ranks, the first placement, one line per finished iteration (mean reward, seconds per
iteration, placement changes, ETA), a "still in iteration k" line whenever nothing else was said
for ``quiet_s`` seconds, and the end. :func:`print_progress` prints them (a rich progress bar on a
terminal, plain lines otherwise); ``python -m slurm_rl.inspect.live RUN_DIR`` is the follower that
``sbatch/train.sh`` runs beside the ranks so that the job log shows the same lines.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from slurm_rl.control.atomic import read_json
from slurm_rl.control.epochs import read_epoch_file
from slurm_rl.control.errors import ControlError
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.progress import RankProgress
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.inspect.epoch_log import compress_ranks
from slurm_rl.metrics import read_metrics
from slurm_rl.placement import COMPONENTS
from slurm_rl.resume.restart import read_resume_point

QUIET_S = 10.0
PHASE_EVERY_S = 5.0
_READ_ERRORS = (OSError, ValueError, ControlError, KeyError, TypeError)


class RunMonitor:
    """Poll a run's files and say what changed since the last poll (see the module docstring)."""

    def __init__(self, run_dir: str | Path, world_size: int, iterations: int, quiet_s: float = QUIET_S,
                 every: int = 1) -> None:
        self.run_dir, self.paths = Path(run_dir), RunPaths(run_dir)
        self.world_size, self.iterations, self.quiet_s = world_size, iterations, quiet_s
        self.every = every  # an iteration line every this many iterations (and the first and last)
        self.started = time.time()
        self.last_said = time.monotonic()
        self.phases: dict[str, list[int]] = {}  # phase -> ranks when last named
        self.phase_said: dict[str, float] = {}
        self.next_epoch = 0
        self.epochs_in_iteration: dict[int, int] = {}
        self.rows_seen = 0
        self.first_iteration_at: float | None = None
        self.state: str | None = None
        self.last_reward: float | None = None
        self.pending: list[str] = []  # lines for the next poll
        try:
            point = read_resume_point(self.run_dir)
        except _READ_ERRORS:
            point = None
        if point is not None:  # a resumed run: say so, and leave out what earlier incarnations did
            self.next_epoch = point.after_epoch + 1
            self.rows_seen = sum(1 for r in read_metrics(self.run_dir) if int(r.get("iteration", -1)) < point.iteration)
            self.pending.append(f"resumed at iteration {point.iteration + 1}/{iterations} "
                                + (f"from {point.checkpoint}" if point.checkpoint else "from the start (no checkpoint)"))

    @property
    def done(self) -> bool:
        """The coordinator says the run finished, failed or stopped."""
        return self.state in ("finished", "failed", "stopped")

    @property
    def iterations_done(self) -> int:
        return self.rows_seen

    def poll(self) -> list[str]:
        """New lines since the last call (empty when nothing worth saying happened)."""
        lines, self.pending = self.pending, []
        progress = self._progress()
        lines += self._epochs()
        lines += self._startup(progress)
        lines += self._iterations()
        try:
            status = read_coordinator_status(self.paths)
        except _READ_ERRORS:
            status = None
        state = status.state if status is not None else None
        if state != self.state:  # (a state implies a status)
            if state == "finished":
                lines.append(f"run finished: {self.rows_seen}/{self.iterations} iterations in "
                             f"{time.time() - self.started:.0f}s")
            elif state == "failed":
                lines.append(f"run failed: the coordinator says {status.error}")
            elif state == "checkpointing":
                request = status.checkpoint_request
                lines.append(f"checkpoint before iteration {request.iteration + 1 if request else '?'}/{self.iterations}")
            elif state == "stopped":
                gate = status.stopped_at_iteration
                lines.append(f"run stopped before iteration {gate + 1 if isinstance(gate, int) else '?'}/{self.iterations} "
                             f"with a checkpoint ({(status.stop or {}).get('reason')}); it resumes from there")
            self.state = state
        failed = {r: d for r, d in progress.items() if d.state == "failed"}
        if failed and not self.done:
            rank, doc = min(failed.items())
            lines.append(f"rank {rank} failed: {doc.error}")
            self.state = "failed"
        if lines:
            self.last_said = time.monotonic()
        elif time.monotonic() - self.last_said >= self.quiet_s:
            lines.append(self._still(progress))
            self.last_said = time.monotonic()
        return lines

    def _progress(self) -> dict[int, RankProgress]:
        out: dict[int, RankProgress] = {}
        for rank in range(self.world_size):
            path = self.paths.progress(rank)
            try:
                out[rank] = RankProgress.from_json(read_json(path), path, rank=rank)
            except _READ_ERRORS:
                continue
        return out

    def _startup(self, progress: dict[int, RankProgress]) -> list[str]:
        """A line per startup phase whose set of ranks changed (ranks grouped: short at 64)."""
        phases: dict[str, list[int]] = {}
        for rank, doc in sorted(progress.items()):
            if doc.state == "starting":
                phases.setdefault(doc.phase or "starting", []).append(rank)
        lines = []
        now = time.monotonic()
        for phase, ranks in phases.items():
            said = self.phase_said.get(phase)
            # a phase is named when first seen; ranks joining it later at most every PHASE_EVERY_S
            # (ranks leaving it are named by the phase they move on to)
            if not set(ranks) <= set(self.phases.get(phase, [])) and (said is None or now - said >= PHASE_EVERY_S):
                who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compress_ranks(ranks)}"
                lines.append(f"{who}: {phase}…")
                self.phase_said[phase] = now
                self.phases[phase] = sorted(set(ranks) | set(self.phases.get(phase, [])))
        return lines

    def _epochs(self) -> list[str]:
        lines = []
        while True:
            try:
                epoch = read_epoch_file(self.paths, self.next_epoch)
            except _READ_ERRORS:
                return lines
            self.next_epoch += 1
            self.epochs_in_iteration[epoch.iteration] = self.epochs_in_iteration.get(epoch.iteration, 0) + 1
            if epoch.epoch == 0:
                where = ", ".join(f"{c} {compress_ranks(epoch.ranks_of(c))}" for c in COMPONENTS
                                  if epoch.ranks_of(c))
                lines.append(f"epoch 0 published ({where}); training starts once every rank has applied it")

    def _iterations(self) -> list[str]:
        rows = read_metrics(self.run_dir)
        lines = []
        if len(rows) > self.rows_seen:  # progress, printed or not (the bar shows it): not a quiet spell
            self.last_said = time.monotonic()
        for row in rows[self.rows_seen:]:
            k = int(row.get("iteration", self.rows_seen))
            self.rows_seen += 1
            seconds = row.get("seconds")
            if self.first_iteration_at is None and isinstance(row.get("time"), (int, float)) and isinstance(seconds, (int, float)):
                self.first_iteration_at = float(row["time"]) - float(seconds)
            per_it = self._seconds_per_iteration(row)
            left = self.iterations - self.rows_seen
            eta = f"ETA {_duration(per_it * left)}" if per_it is not None and left > 0 else "last iteration"
            reward = row.get("reward_mean")
            self.last_reward = reward if isinstance(reward, (int, float)) else self.last_reward
            changes = max(0, self.epochs_in_iteration.get(k, 0) - (1 if k == 0 else 0))
            parts = [f"iteration {k + 1}/{self.iterations}",
                     f"reward {reward:.3f}" if isinstance(reward, (int, float)) else "reward -",
                     f"{seconds:.1f}s" if isinstance(seconds, (int, float)) else "-",
                     f"{changes} placement change{'s' if changes != 1 else ''}", eta]
            if self.every <= 1 or self.rows_seen in (1, self.iterations) or self.rows_seen % self.every == 0:
                lines.append(" · ".join(parts))
        return lines

    def _seconds_per_iteration(self, row: dict[str, Any]) -> float | None:
        """Wall seconds per finished iteration so far (gates and switches included)."""
        if self.first_iteration_at is not None and isinstance(row.get("time"), (int, float)) and self.rows_seen:
            return max(0.0, float(row["time"]) - self.first_iteration_at) / self.rows_seen
        seconds = row.get("seconds")
        return float(seconds) if isinstance(seconds, (int, float)) else None

    def _still(self, progress: dict[int, RankProgress]) -> str:
        """What the run is doing now, for a line when nothing else happened for a while."""
        starting: dict[str, list[int]] = {}
        for rank, doc in sorted(progress.items()):
            if doc.state == "starting":
                starting.setdefault(doc.phase or "starting", []).append(rank)
        if starting:
            return "still starting: " + "; ".join(f"ranks {compress_ranks(r)} {p}" for p, r in starting.items()) \
                + f" ({time.time() - self.started:.0f}s)"
        if self.next_epoch == 0:
            started = len(progress)
            return (f"waiting for the ranks: {started}/{self.world_size} wrote progress, no epoch yet "
                    f"({time.time() - self.started:.0f}s)")
        k = max([self.rows_seen, *(d.iteration for d in progress.values() if d.iteration is not None)])
        counters = [d.counters for d in progress.values() if d.iteration == k]
        finished = sum(c.rollout_finished for c in counters)
        minibatches = max((c.actor_minibatches_done for c in counters), default=0)
        return (f"still in iteration {k + 1}/{self.iterations}: {finished} rollouts finished, "
                f"{minibatches} mini-batches trained ({time.time() - self.started:.0f}s since start)")


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}min"
    return f"{seconds / 3600:.1f}h"


def print_progress(monitor: RunMonitor, stop: threading.Event, interval_s: float = 1.0,
                   out: Callable[[str], None] | None = None, bar: bool | None = None,
                   timeout_s: float | None = None) -> None:
    """Print the monitor's lines until ``stop`` is set or the run ends (one last poll after either).

    ``bar``: a rich progress bar with the lines above it (default: when stdout is a terminal).
    ``timeout_s``: give up after that long, saying what was awaited.
    """
    use_bar = sys.stdout.isatty() if bar is None else bar
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if not use_bar:
        emit = out or (lambda line: print(line, flush=True))
        while True:
            for line in monitor.poll():
                emit(f"[{time.strftime('%H:%M:%S')}] {line}")
            if stop.is_set() or monitor.done:
                return
            if deadline is not None and time.monotonic() > deadline:
                emit(f"stopped following {monitor.run_dir} after {timeout_s:.0f}s: the run did not end")
                return
            stop.wait(interval_s)
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), transient=False) as bar_view:
        task = bar_view.add_task("starting", total=monitor.iterations)
        while True:
            for line in monitor.poll():
                bar_view.console.print(line, highlight=False)
            reward = f" · reward {monitor.last_reward:.3f}" if monitor.last_reward is not None else ""
            bar_view.update(task, completed=monitor.iterations_done, description=f"iterations{reward}")
            if stop.is_set() or monitor.done:
                return
            if deadline is not None and time.monotonic() > deadline:
                bar_view.console.print(f"stopped following after {timeout_s:.0f}s: the run did not end")
                return
            stop.wait(interval_s)


class ProgressPrinter:
    """:func:`print_progress` in a background thread for the duration of a ``with`` block."""

    def __init__(self, run_dir: str | Path, world_size: int, iterations: int, interval_s: float = 1.0) -> None:
        # on a terminal the bar shows every iteration: about 20 lines for the whole run
        every = max(1, iterations // 20) if sys.stdout.isatty() else 1
        self.monitor = RunMonitor(run_dir, world_size, iterations, every=every)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=print_progress, args=(self.monitor, self.stop, interval_s),
                                       name="progress", daemon=True)

    def __enter__(self) -> "ProgressPrinter":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10.0)


def main(argv: list[str] | None = None) -> int:
    """``python -m slurm_rl.inspect.live RUN_DIR``: print progress lines until the run ends."""
    parser = argparse.ArgumentParser(prog="python -m slurm_rl.inspect.live", description=main.__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    parser.add_argument("--timeout", type=float, default=7 * 24 * 3600.0, help="give up after this many seconds")
    args = parser.parse_args(argv)
    from slurm_rl.config import load_config

    cfg = load_config(args.run_dir / "config.yaml")
    monitor = RunMonitor(args.run_dir, cfg.placement.world_size, cfg.train.num_iterations)
    print_progress(monitor, threading.Event(), args.interval, bar=False, timeout_s=args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
