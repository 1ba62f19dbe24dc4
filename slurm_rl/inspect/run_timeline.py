"""A run's placement timeline from its files: which rank held which role when, and what it did.

Reads only files of ``RUN_DIR`` (works on a running job's directory from a login node):
the epochs, each rank's ack of each epoch (``applied_at`` starts the rank's bar of that epoch,
``figures.roles`` its roles, ``figures.migrated_requests`` the requests it handed back), the
actor's reshard records, the coordinator's decision log (``release`` records are the iteration
gates), each rank's activity spans (``control/activity``: busy time) and progress files (when a
rank finished). Nothing here raises on a failed or half-written run: what could not be found is
listed under ``missing``.

Terms: a rank *holds* a role from its ack of an epoch to its ack of the next one; it is *busy*
while one of its activity spans runs; a *switch* is a reshard of the actor's state; the *bubble*
is held time neither busy nor switching. GPU-seconds are counted over the training window, from
the release of iteration 0 to the release of the final gate (or the last thing observed).
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from slurm_rl.control.activity import read_spans
from slurm_rl.control.acks import read_ack, read_reshards
from slurm_rl.control.atomic import read_json
from slurm_rl.control.epochs import Epoch, EpochStore, read_epoch_file
from slurm_rl.control.errors import ControlError
from slurm_rl.control.events import read_events
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.progress import RankProgress
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.placement import COMPONENTS

BUSY_KINDS = ("rollout", "inference", "actor", "critic", "sync")
_READ_ERRORS = (OSError, ValueError, ControlError, KeyError, TypeError)


@dataclass(frozen=True)
class RoleBar:
    """Rank ``rank`` held ``roles`` (empty: idle) from ``start`` to ``end`` under ``epoch``;
    ``open``: the rank has not moved on or finished yet (the end is the last thing observed)."""

    rank: int
    epoch: int
    roles: tuple[str, ...]
    start: float
    end: float
    open: bool = False

    @property
    def label(self) -> str:
        return "+".join(self.roles) or "idle"


@dataclass
class RunTimeline:
    """Everything the Gantt chart and the summary need (absolute times, ``time.time()``)."""

    run_dir: str
    world: list[int]
    t0: float | None  # epoch 0 published
    end: float | None  # the run finished, or the last thing observed
    state: str  # finished | failed | running | unknown
    iterations: int | None
    epochs: list[dict[str, Any]] = field(default_factory=list)  # epoch, published_at, iteration, boundary, reason
    bars: list[RoleBar] = field(default_factory=list)
    spans: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # rank -> activity spans
    gates: list[tuple[int, float]] = field(default_factory=list)  # (iteration released, at)
    reshards: list[dict[str, Any]] = field(default_factory=list)  # epoch, start, end, old, new, bytes
    migrations: list[dict[str, Any]] = field(default_factory=list)  # rank, epoch, at, requests
    missing: list[str] = field(default_factory=list)
    origin: float | None = None  # where the run's clock starts (epoch 0) when this is a window of it; None: t0

    @property
    def window(self) -> tuple[float | None, float | None]:
        """The training window: release of iteration 0 .. release of the final gate (or the end)."""
        start = next((t for k, t in self.gates if k == 0), self.t0)
        final = next((t for k, t in self.gates if self.iterations is not None and k == self.iterations), None)
        return start, final if final is not None else self.end

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["bars"] = [dict(asdict(b), label=b.label) for b in self.bars]
        doc["spans"] = {str(r): s for r, s in self.spans.items()}
        doc["window"] = list(self.window)
        doc["components"] = component_seconds(self)
        return doc


def config_facts(run_dir: Path, missing: list[str]) -> tuple[list[int], int | None, dict[str, Any]]:
    """(world ranks, iterations, facts) from ``config.yaml`` (empty when it cannot be read)."""
    try:
        from slurm_rl.config import load_config

        cfg = load_config(run_dir / "config.yaml")
    except Exception as exc:  # a config error is reported, not raised: inspection must go on
        missing.append(f"{run_dir / 'config.yaml'}: unreadable ({type(exc).__name__}: {str(exc)[:200]})")
        return [], None, {}
    facts = {"device": cfg.runtime.device, "policy": cfg.scheduler.policy, "world_size": cfg.placement.world_size,
             "iterations": cfg.train.num_iterations, "placement": {c: sorted(p.ranks) for c, p in
                                                                   cfg.placement.components.items()}}
    return list(range(cfg.placement.world_size)), int(cfg.train.num_iterations), facts


def read_epochs(paths: RunPaths, missing: list[str]) -> list[Epoch]:
    """The published epochs, oldest first; on a gap or a bad file, those before it (noted in ``missing``)."""
    try:
        return EpochStore(paths).all()
    except _READ_ERRORS as exc:
        missing.append(f"{paths.epochs_dir}: {exc}; later epochs left out")
    out: list[Epoch] = []
    while True:
        try:
            out.append(read_epoch_file(paths, len(out)))
        except _READ_ERRORS:
            return out


def _last_seen(paths: RunPaths, world: Iterable[int]) -> tuple[float | None, dict[int, RankProgress]]:
    """The latest time any file says something happened, and each rank's progress (a progress file
    that is not a valid one is left out)."""
    latest: list[float] = []
    progress: dict[int, RankProgress] = {}
    for rank in world:
        path = paths.progress(rank)
        try:
            progress[rank] = RankProgress.from_json(read_json(path), path, rank=rank)
            latest.append(progress[rank].time)
        except _READ_ERRORS:
            pass
        try:
            beat = read_json(paths.heartbeat(rank))
        except _READ_ERRORS:
            continue
        if isinstance(beat.get("time"), (int, float)):
            latest.append(float(beat["time"]))
    return max(latest, default=None), progress


def build_timeline(run_dir: str | Path, now: float | None = None) -> RunTimeline:
    """Read the run's files into a :class:`RunTimeline` (never raises on a half-written run)."""
    root = Path(run_dir)
    paths = RunPaths(root)
    missing: list[str] = []
    world, iterations, _ = config_facts(root, missing)
    epochs = read_epochs(paths, missing) if paths.epochs_dir.is_dir() else []
    if not epochs:
        missing.append(f"{paths.epochs_dir}: no epoch published (the coordinator did not start)")
    world = sorted(set(world) | {r for e in epochs for s in e.placement.values() for r in s["ranks"]})
    try:
        events = read_events(paths)
    except _READ_ERRORS as exc:
        events = []
        missing.append(f"{paths.decisions}: unreadable ({exc})")
    decisions = {int(d["epoch"]): d for d in events if d.get("kind") == "decision" and isinstance(d.get("epoch"), int)}
    gates = sorted((int(e["iteration"]), float(e["released_at"])) for e in events
                   if e.get("kind") == "release" and isinstance(e.get("released_at"), (int, float)))
    status = None
    try:
        status = read_coordinator_status(paths)
    except _READ_ERRORS as exc:
        missing.append(f"{paths.control / 'coordinator.json'}: unreadable ({exc})")
    state = status.state if status is not None else "unknown"
    if status is None:
        missing.append(f"{paths.control / 'coordinator.json'}: no coordinator status")
    elif status.failed:
        missing.append(f"the coordinator failed: {status.error}")
    latest, progress = _last_seen(paths, world)
    observed = [t for t in (latest, *(t for _, t in gates)) if t is not None]
    if state == "running" or state == "starting":
        observed.append(now if now is not None else time.time())
    end = float(status.time) if status is not None and state in ("finished", "failed") and status.time is not None \
        else max(observed, default=None)
    tl = RunTimeline(run_dir=str(root), world=world, t0=None, end=end, state=state, iterations=iterations,
                     gates=gates, missing=missing)
    for e in epochs:
        published = float(decisions.get(e.epoch, {}).get("published_at", e.created_at))
        tl.epochs.append({"epoch": e.epoch, "published_at": published, "iteration": e.iteration,
                          "boundary": e.boundary, "reason": e.reason,
                          "placement": {c: list(s["ranks"]) for c, s in e.placement.items()}})
    tl.t0 = tl.epochs[0]["published_at"] if tl.epochs else None
    for rank in world:
        try:
            tl.spans[rank] = read_spans(paths, rank)
        except OSError as exc:
            missing.append(f"activity of rank {rank}: unreadable ({exc})")
    _add_bars(tl, paths, epochs, progress)
    _add_reshards(tl, paths, epochs)
    if epochs and not any(tl.spans.values()):
        missing.append(f"{paths.control / 'activity'}: no activity spans (busy time and bubbles unknown)")
    failed = sorted(r for r, d in progress.items() if d.state == "failed")
    if failed:
        why = progress[failed[0]].error
        missing.append(f"ranks {failed} failed" + (f" (rank {failed[0]}: {why})" if why else ""))
    if iterations is not None and not any(k == iterations for k, _ in gates):
        done = max((k for k, _ in gates), default=0)
        missing.append(f"{done} of {iterations} iterations released and done"
                       + (" so far (the run is going on)" if state in ("running", "starting") else ""))
    return tl


def _add_bars(tl: RunTimeline, paths: RunPaths, epochs: list[Epoch], progress: dict[int, RankProgress]) -> None:
    """One bar per (rank, epoch) from the rank's ack of it; a rank's last bar ends when it finished."""
    unacked: dict[int, list[int]] = {}
    for rank in tl.world:
        starts: list[tuple[float, int, tuple[str, ...]]] = []
        for e in epochs:
            try:
                ack = read_ack(paths, e.epoch, rank)
            except _READ_ERRORS:
                ack = None
            if ack is None or not isinstance(ack.get("applied_at"), (int, float)):
                unacked.setdefault(e.epoch, []).append(rank)
                continue
            n = ack.get("figures", {}).get("migrated_requests")
            if isinstance(n, int) and n > 0:
                tl.migrations.append({"rank": rank, "epoch": e.epoch, "at": float(ack["applied_at"]), "requests": n})
            roles = ack.get("figures", {}).get("roles")
            roles = tuple(roles) if isinstance(roles, list) else tuple(e.role_of(rank))
            starts.append((float(ack["applied_at"]), e.epoch, tuple(c for c in COMPONENTS if c in roles)))
        starts.sort()
        doc = progress.get(rank)
        finished = doc is not None and doc.state in ("finished", "failed")
        for i, (start, epoch, roles) in enumerate(starts):
            last = i + 1 == len(starts)
            end = starts[i + 1][0] if not last else (doc.time if doc is not None and finished else tl.end or start)
            if not roles and any(sp["kind"] == "critic" and sp["end"] > start and sp["start"] < end
                                 for sp in tl.spans.get(rank, [])):
                roles = ("critic",)  # a rank of the critic's own: idle in the epoch, training the critic
            tl.bars.append(RoleBar(rank, epoch, roles, start, max(start, end), open=last and not finished))
    if unacked:
        tl.missing.append("epochs not acknowledged by every rank: " + "; ".join(
            f"epoch {e} by ranks {_ranges(r)}" for e, r in sorted(unacked.items())))


def _add_reshards(tl: RunTimeline, paths: RunPaths, epochs: list[Epoch]) -> None:
    """One record per reshard of the actor's state (the slowest rank's span; bytes of every rank)."""
    for e in epochs:
        try:
            docs = [d.get("figures", {}) for d in read_reshards(paths, e.epoch)]
        except _READ_ERRORS as exc:
            tl.missing.append(f"reshard records of epoch {e.epoch}: unreadable ({exc})")
            continue
        docs = [d for d in docs if isinstance(d.get("started_at"), (int, float))]
        if not docs:
            continue
        start = min(float(d["started_at"]) for d in docs)
        seconds = max(float(d.get("seconds") or 0.0) for d in docs)
        done = max(float(d.get("done_at", d["started_at"])) for d in docs)
        tl.reshards.append({"epoch": e.epoch, "start": start, "end": max(done, start + seconds), "seconds": seconds,
                            "old": docs[0].get("old"), "new": docs[0].get("new"),
                            "bytes": int(docs[0].get("bytes_moved") or 0), "iteration": docs[0].get("iteration")})


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same time as ``intervals``."""
    out: list[tuple[float, float]] = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap(merged: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Time of the disjoint sorted ``merged`` intervals inside ``[lo, hi]``."""
    i = max(0, bisect.bisect_right(merged, (lo, math.inf)) - 1)
    total = 0.0
    while i < len(merged) and merged[i][0] < hi:
        a, b = merged[i]
        total += max(0.0, min(b, hi) - max(a, lo))
        i += 1
    return total


def union_length(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` clipped to ``[lo, hi]``."""
    return overlap(merge_intervals(intervals), lo, hi)


def rank_intervals(tl: "RunTimeline", rank: int, kinds: Iterable[str]) -> list[tuple[float, float]]:
    """The rank's activity spans of ``kinds``, merged (sorted, disjoint)."""
    wanted = set(kinds)
    return merge_intervals((s["start"], s["end"]) for s in tl.spans.get(rank, []) if s.get("kind") in wanted)


def component_seconds(tl: RunTimeline) -> dict[str, dict[str, float | None]]:
    """Per role label (``actor``, ``rollout``, ``actor+rollout``, ``idle`` ...): GPU-seconds held,
    busy, switching (actor reshards) and bubble over the training window (busy, switch and bubble
    are None when the run recorded no activity spans)."""
    lo, hi = tl.window
    known = any(tl.spans.values())
    out: dict[str, dict[str, float]] = {}
    if lo is None or hi is None or hi <= lo:
        return out
    busy_of = {r: rank_intervals(tl, r, BUSY_KINDS) for r in tl.world}
    reshard_of = {r: rank_intervals(tl, r, ("reshard",)) for r in tl.world}
    for bar in tl.bars:
        a, b = max(bar.start, lo), min(bar.end, hi)
        if b <= a:
            continue
        busy = overlap(busy_of.get(bar.rank, []), a, b)
        switch = overlap(reshard_of.get(bar.rank, []), a, b)
        row = out.setdefault(bar.label, {"held_s": 0.0, "busy_s": 0.0, "switch_s": 0.0, "bubble_s": 0.0})
        row["held_s"] += b - a
        row["busy_s"] += busy
        row["switch_s"] += min(switch, b - a - busy)
        row["bubble_s"] += max(0.0, b - a - busy - switch)
    if not known:
        out = {k: {"held_s": v["held_s"], "busy_s": None, "switch_s": None, "bubble_s": None} for k, v in out.items()}
    order = {c: i for i, c in enumerate(COMPONENTS)}
    return dict(sorted(out.items(), key=lambda kv: (kv[0] == "idle", "+" in kv[0], order.get(kv[0], 9), kv[0])))


def iteration_spans(tl: RunTimeline) -> list[tuple[int, float, float]]:
    """``(iteration, released at, ended at)`` of each iteration released in ``tl``, in order: an
    iteration ends at the next release (the last one at ``tl.end``). The final gate, and the gate
    that closes a window of iterations (:func:`clip_timeline`), start no iteration."""
    last: dict[int, float] = {}
    for k, t in sorted(tl.gates, key=lambda g: g[1]):
        last[k] = t  # a released again iteration (a resumed run): its last release
    gates = sorted(last.items(), key=lambda g: g[1])
    out = []
    for i, (k, t) in enumerate(gates):
        if tl.iterations is not None and k >= tl.iterations:
            continue
        end = gates[i + 1][1] if i + 1 < len(gates) else tl.end
        if end is None or (end <= t and i + 1 == len(gates)):
            continue
        out.append((k, t, max(t, end)))
    return out


def release_time(tl: RunTimeline, iteration: int) -> float | None:
    """When ``iteration`` was released (iteration 0: epoch 0 if its gate is missing; a later one
    never released: the next release, else the end)."""
    released = {k: t for k, t in sorted(tl.gates, key=lambda g: g[1])}
    if iteration in released:
        return released[iteration]
    if iteration == 0 and tl.t0 is not None:
        return tl.t0
    return min((t for k, t in released.items() if k >= iteration), default=tl.end)


def clip_timeline(tl: RunTimeline, first: int, stop: int) -> RunTimeline:
    """The part of ``tl`` from the release of iteration ``first`` to the release of ``stop`` (or the
    end): bars and activity spans cut to that window, the epochs of those iterations, the gates
    ``first..stop``, the reshards and migrations inside it. Its ``t0`` is the window's start,
    ``origin`` the run's clock (epoch 0), so that times still read as seconds into the run."""
    lo, hi = release_time(tl, first), release_time(tl, stop)
    origin = tl.origin if tl.origin is not None else tl.t0
    out = RunTimeline(run_dir=tl.run_dir, world=list(tl.world), t0=lo, end=hi, state=tl.state,
                      iterations=tl.iterations, missing=list(tl.missing), origin=origin)
    if lo is None or hi is None:
        return out
    out.epochs = [e for e in tl.epochs if first <= e["iteration"] < stop]
    out.gates = [(k, t) for k, t in tl.gates if first <= k <= stop and lo <= t <= hi]
    for b in tl.bars:
        a, z = max(b.start, lo), min(b.end, hi)
        if z > a:
            out.bars.append(RoleBar(b.rank, b.epoch, b.roles, a, z, open=b.open and b.end <= hi))
    for rank, spans in tl.spans.items():
        out.spans[rank] = [dict(s, start=max(s["start"], lo), end=min(s["end"], hi)) for s in spans
                           if s["end"] > lo and s["start"] < hi]
    out.reshards = [r for r in tl.reshards if lo <= r["start"] < hi]
    out.migrations = [m for m in tl.migrations if lo <= m["at"] <= hi]
    return out


def _ranges(ranks: Iterable[int]) -> str:
    from slurm_rl.inspect.epoch_log import compress_ranks

    return compress_ranks(ranks)
