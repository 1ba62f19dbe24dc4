"""Post-hoc inspection of a run's epoch log: one record per epoch, as a table or as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from slurm_rl.control.acks import read_ack, read_reshards
from slurm_rl.control.epochs import EpochStore
from slurm_rl.control.events import read_events
from slurm_rl.control.paths import RunPaths
from slurm_rl.placement import COMPONENTS
from slurm_rl.rules import compress_ranks  # noqa: F401  (re-exported: the config names rank lists with it too)



@dataclass(frozen=True)
class EpochRecord:
    """What one epoch did and how long the switch took (``switch_latency_s`` = last ack − publish)."""

    epoch: int
    generation: int
    iteration: int
    published_at: float
    reason: str
    boundary: str
    placement: dict[str, list[int]]
    acks: int
    switch_latency_s: float | None
    bytes_moved: int
    reshard_s: float | None  # the actor's in-place move for this epoch (slowest rank), if it moved
    transition_s: float
    decision_latency_s: float | None
    forecast_end_s: float | None = None  # seconds into its iteration the policy expected it to end (plan)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def epoch_records(run_dir: Path) -> list[EpochRecord]:
    """Every published epoch of the run with its acknowledgements, oldest first."""
    paths = RunPaths(run_dir)
    if not paths.epochs_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} has no control/epochs directory: not a slurm_rl run dir")
    decisions = {int(d["epoch"]): d for d in read_events(paths, "decision") if "epoch" in d}
    records = []
    for epoch in EpochStore(paths).all():
        world = sorted({r for spec in epoch.placement.values() for r in spec["ranks"]})
        acked = [read_ack(paths, epoch.epoch, r) for r in _ack_ranks(paths, epoch.epoch, world)]
        acked = [a for a in acked if a is not None]
        # The actor's state moves after the ack (at the stamped mini-batch boundary): its own records.
        reshards = [r["figures"] for r in read_reshards(paths, epoch.epoch)]
        last = max((float(a["applied_at"]) for a in acked), default=None)
        decision = decisions.get(epoch.epoch, {})
        published = float(decision.get("published_at", epoch.created_at))
        records.append(
            EpochRecord(
                epoch=epoch.epoch,
                generation=epoch.generation,
                iteration=epoch.iteration,
                published_at=published,
                reason=epoch.reason,
                boundary=epoch.boundary,
                placement={c: list(s["ranks"]) for c, s in epoch.placement.items()},
                acks=len(acked),
                switch_latency_s=None if last is None else max(0.0, last - published),
                bytes_moved=sum(int(a.get("figures", {}).get("bytes_moved", 0)) for a in acked)
                + sum(int(f.get("bytes_received", 0)) for f in reshards),
                reshard_s=max((float(f.get("seconds", 0.0)) for f in reshards), default=None),
                transition_s=max((float(a.get("figures", {}).get("seconds", 0.0)) for a in acked), default=0.0),
                decision_latency_s=decision.get("decision_latency_s"),
                forecast_end_s=decision.get("forecast_end_s"),
            )
        )
    return records


def kept_gates(run_dir: Path) -> list[dict[str, Any]]:
    """The gates where the policy kept the placement in force and said why (``kept`` events: no epoch was
    published), as ``{"iteration", "reason"}``, oldest first."""
    return [{"iteration": int(e["iteration"]), "reason": str(e.get("reason", ""))}
            for e in read_events(RunPaths(run_dir), "kept") if isinstance(e.get("iteration"), int)]


def _ack_ranks(paths: RunPaths, epoch: int, placed: list[int]) -> list[int]:
    """Ranks that may have acked: listing is fine here (inspection, not a hot loop)."""
    directory = paths.acks_dir(epoch)
    if not directory.is_dir():
        return placed
    ranks = []
    for name in sorted(p.name for p in directory.iterdir()):
        if name.startswith("rank-") and name.endswith(".json"):
            ranks.append(int(name[5:-5]))
    return ranks


def render_table(records: list[EpochRecord], console: Any = None) -> None:
    """Print the epoch log as a rich table."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=max(Console().width, 140))
    table = Table(title="placement epochs")
    for column in ("epoch", "gen", "iter", "boundary", "published", "reason", *COMPONENTS, "acks", "switch s",
                   "reshard s", "bytes moved"):
        table.add_column(column, justify="right" if column not in ("reason",) else "left")
    t0 = records[0].published_at if records else 0.0
    for r in records:
        table.add_row(
            str(r.epoch),
            str(r.generation),
            str(r.iteration),
            r.boundary,
            f"+{r.published_at - t0:.2f}s",
            r.reason,
            *(compress_ranks(r.placement.get(c, [])) for c in COMPONENTS),
            str(r.acks),
            "-" if r.switch_latency_s is None else f"{r.switch_latency_s:.3f}",
            "-" if r.reshard_s is None else f"{r.reshard_s:.3f}",
            _human_bytes(r.bytes_moved),
        )
    console.print(table)


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"
