"""Post-hoc inspection of a co-execution group: who held which slot when, switch costs, slowdowns.

Reads only files of ``GROUP_DIR``: ``group.json`` (pools, jobs, SLOs), the decision log
``control/events/decisions.jsonl`` (``grant``, ``phase``, ``job_finished`` / ``job_failed``
records), the grants and release files (a fallback when the log lacks them: a scheduler that died
before it logged a release), the group scheduler's ``control/coordinator.json`` and each job's
``jobs/<name>/`` (its own status and ``metrics.jsonl``). Nothing here raises on a half-written or
failed group: what could not be found is listed under ``missing``.

Times in the JSON are absolute (``time.time()``); ``group_start`` (grant 0) is the origin of the
text timeline and of the Gantt chart.

A phase's interval on its slot: ``start`` = the rank saw its grant (resume begins),
``work_start`` = resumed, ``work_end`` = stopped working (park begins), ``end`` = parked and
released. Busy (work), switch (resume + park) and bubble (idle) shares of a pool add up to 1.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from slurm_rl.control.errors import ControlError
from slurm_rl.control.events import read_events
from slurm_rl.control.grants import GroupPaths, grant_numbers, read_grant
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.metrics import read_metrics
from slurm_rl.inspect.summary import percentiles

POOLS = ("rollout", "train")
TIMELINE_COLUMNS = 80
_READ_ERRORS = (OSError, ValueError, ControlError, KeyError, TypeError)


@dataclass(frozen=True)
class PhaseInterval:
    """One job's phase on one slot: a release record; ``open``: held in the last grant, never released;
    ``approx``: no release record, but a later grant freed the slot (times from the grants)."""

    job: str
    pool: str
    slot: int
    iteration: int
    start: float | None
    end: float | None
    resume_s: float
    park_s: float
    revoked: bool = False
    skipped: bool = False
    open: bool = False
    work_start: float | None = None
    work_end: float | None = None
    grant: int | None = None
    migrated: int | None = None
    finished: int | None = None
    approx: bool = False
    ready_at: float | None = None  # when the rank began waiting for this grant (``waited_s`` before it)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- reading ------------------------------------------------------------------------------------

def _read_doc(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _phase_from_record(doc: Mapping[str, Any]) -> PhaseInterval | None:
    """A release (or ``phase`` event) as an interval; None when it lacks job/pool/iteration/slot."""
    try:
        job, pool, it, slot = str(doc["job"]), str(doc["pool"]), int(doc["iteration"]), int(doc["slot"])
    except (KeyError, TypeError, ValueError):
        return None
    resume_s, park_s = _num(doc.get("resume_s")) or 0.0, _num(doc.get("park_s")) or 0.0
    seen, waited = _num(doc.get("granted_seen_at")) or _num(doc.get("released_at")), _num(doc.get("waited_s"))
    ready_at = seen - waited if seen is not None and waited is not None else None
    if doc.get("skipped"):
        return PhaseInterval(job, pool, slot, it, None, None, 0.0, 0.0, skipped=True, ready_at=ready_at)
    work_start, work_end = _num(doc.get("started_at")), _num(doc.get("ended_at"))
    start = _num(doc.get("granted_seen_at"))
    if start is None and work_start is not None:
        start = work_start - resume_s
    end = _num(doc.get("released_at"))
    if end is None and work_end is not None:
        end = work_end + park_s
    work_start = start + resume_s if work_start is None and start is not None else work_start
    work_end = end - park_s if work_end is None and end is not None else work_end
    grant = doc.get("grant")
    return PhaseInterval(job, pool, slot, it, start, end, resume_s, park_s, revoked=bool(doc.get("revoked")),
                         work_start=work_start, work_end=work_end,
                         grant=grant if isinstance(grant, int) else None,
                         migrated=doc.get("migrated") if isinstance(doc.get("migrated"), int) else None,
                         finished=doc.get("finished") if isinstance(doc.get("finished"), int) else None,
                         ready_at=ready_at)


def _release_files(paths: GroupPaths) -> Iterable[dict[str, Any]]:
    """Every release file under ``control/releases`` (listing: inspection only)."""
    root = paths.control / "releases"
    try:
        jobs = sorted(os.listdir(root))
    except OSError:
        return
    for job in jobs:
        try:
            phases = sorted(os.listdir(root / job))
        except OSError:
            continue
        for phase in phases:
            try:
                names = sorted(os.listdir(root / job / phase))
            except OSError:
                continue
            for name in names:
                doc = _read_doc(root / job / phase / name)
                if doc is not None:
                    yield doc


def _grant_records(paths: GroupPaths, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``grant`` records of the log, completed by grant files the log lacks."""
    out = {int(e["grant"]): e for e in events if e.get("kind") == "grant" and isinstance(e.get("grant"), int)}
    for n in grant_numbers(paths):
        if n in out:
            continue
        try:
            g = read_grant(paths, n)
        except _READ_ERRORS:
            continue
        out[n] = {"kind": "grant", "grant": n, "events": list(g.events), "pools": dict(g.pools),
                  "published_at": g.created_at, "time": g.created_at}
    return [out[n] for n in sorted(out)]


def _phase_list(phases: Iterable[PhaseInterval]) -> str:
    """``"a train it 0 slots [2]; ..."``."""
    by_phase: dict[tuple[str, str, int], list[int]] = {}
    for p in phases:
        by_phase.setdefault((p.job, p.pool, p.iteration), []).append(p.slot)
    return "; ".join(f"{j} {pool} it {k} slots {sorted(s)}" for (j, pool, k), s in sorted(by_phase.items()))


def _grant_holders(grants: list[dict[str, Any]]) -> Iterable[tuple[dict[str, Any], str, int, str, int, bool]]:
    """``(grant record, pool, slot, job, iteration, revoked)`` per held slot of every grant (malformed skipped)."""
    for g in grants:
        pools = g.get("pools") if isinstance(g.get("pools"), dict) else {}
        for pool, pg in pools.items():
            slots = pg.get("slots") if isinstance(pg, dict) and isinstance(pg.get("slots"), dict) else {}
            for slot, h in slots.items():
                if (isinstance(h, dict) and isinstance(h.get("job"), str) and isinstance(h.get("iteration"), int)
                        and str(slot).isdigit()):
                    yield g, str(pool), int(slot), h["job"], h["iteration"], bool(h.get("revoked"))


def _union(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` clipped to ``[lo, hi]``."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total, cur_a, cur_b = 0.0, None, None
    for a, b in clipped:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a  # type: ignore[operator]
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a  # type: ignore[operator]
    return total


def _why(text: Any, prefix: str = "failed:") -> str:
    """The reason without the scheduler's ``failed:`` (or ``stopped:``) prefix."""
    text = str(text)
    return text[len(prefix):].strip() if text.startswith(prefix) else text


def _job_status(name: str, paths: GroupPaths, events: list[dict[str, Any]],
                sched: Mapping[str, Any]) -> tuple[str, str | None]:
    """(finished | stopped | failed | running? , why) from the log, the scheduler status, the job's own status."""
    for e in events:
        if e.get("job") == name and e.get("kind") in ("job_finished", "job_failed", "job_stopped"):
            return {"job_finished": ("finished", None), "job_stopped": ("stopped", _why(e.get("why"), "stopped:")),
                    "job_failed": ("failed", _why(e.get("why")))}[e["kind"]]
    out = sched.get("out") if isinstance(sched.get("out"), dict) else {}
    if name in out:
        why = str(out[name])
        if why.startswith("stopped"):
            return "stopped", _why(why, "stopped:")
        return ("finished", None) if why == "finished" else ("failed", _why(why))
    try:
        own = read_coordinator_status(RunPaths(paths.job_dir(name)))
    except _READ_ERRORS:
        own = None
    if own is not None and own.state == "finished":
        return "finished", "its coordinator says finished; the group log has no job_finished record"
    if own is not None and own.failed:
        return "failed", f"{own.error} (its coordinator; no job_failed record in the group log)"
    return "running?", "no job_finished / job_failed record (still running, or the group scheduler stopped)"


# -- the report ---------------------------------------------------------------------------------

PhaseKey = tuple[str, str, int, int]  # job, pool, iteration, slot


def _collect_phases(paths: GroupPaths, events: list[dict[str, Any]], grants: list[dict[str, Any]],
                    missing: list[str]) -> dict[PhaseKey, PhaseInterval]:
    """Phases from the log, then release files the log lacks, then holdings no release accounts for."""
    phases: dict[PhaseKey, PhaseInterval] = {}
    for e in events:
        if e.get("kind") == "phase" and (p := _phase_from_record(e)) is not None:
            phases.setdefault((p.job, p.pool, p.iteration, p.slot), p)
    late = 0
    for doc in _release_files(paths):
        p = _phase_from_record(doc)
        if p is not None and (p.job, p.pool, p.iteration, p.slot) not in phases:
            phases[(p.job, p.pool, p.iteration, p.slot)] = p
            late += 1
    if late:
        missing.append(f"{late} release(s) under control/releases have no phase record in the log "
                       "(the group scheduler stopped before it saw them); taken from the files")
    # a holding without a release: freed by a later grant (approx) or still held (open)
    held_spans: dict[PhaseKey, list[Any]] = {}  # -> [granted at, grant, freed at, revoked]
    last: set[PhaseKey] = set()
    for g in grants:
        at = _num(g.get("published_at")) or _num(g.get("time")) or 0.0
        now: set[PhaseKey] = set()
        for _, pool, slot, job, it, revoked in _grant_holders([g]):
            now.add((job, pool, it, slot))
            span = held_spans.setdefault((job, pool, it, slot), [at, int(g["grant"]), None, False])
            span[3] = span[3] or revoked
        for key in last - now:
            held_spans[key][2] = held_spans[key][2] or at
        last = now
    for key, (at, number, freed, revoked) in sorted(held_spans.items()):
        if key not in phases:
            job, pool, it, slot = key
            phases[key] = PhaseInterval(job, pool, slot, it, at, freed, 0.0, 0.0, revoked=revoked, open=freed is None,
                                        approx=freed is not None, work_start=at, work_end=freed, grant=number)
    if open_phases := [p for p in phases.values() if p.open]:
        missing.append("unfinished phases (held in the last grant, no release): " + _phase_list(open_phases))
    if approx := [p for p in phases.values() if p.approx]:
        missing.append("phases without a release record, freed by a later grant (times from the grants, "
                       "switches unknown): " + _phase_list(approx))
    return phases


def _pools(group: Mapping[str, Any], grants: list[dict[str, Any]],
           phases: Iterable[PhaseInterval]) -> dict[str, list[int]]:
    """Pool -> slots from group.json, completed from what the grants and phases name; rollout first."""
    pools_doc = group.get("pools") if isinstance(group.get("pools"), dict) else {}
    pools: dict[str, list[int]] = {}
    for p, slots in pools_doc.items():
        if isinstance(slots, list) and all(isinstance(x, int) for x in slots):
            pools[str(p)] = sorted(slots)
    if not all(p in pools for p in POOLS):
        seen: dict[str, set[int]] = {}
        for _, pool, slot, _, _, _ in _grant_holders(grants):
            seen.setdefault(pool, set()).add(slot)
        for ph in phases:
            seen.setdefault(ph.pool, set()).add(ph.slot)
        for p, slots_seen in seen.items():
            pools.setdefault(p, sorted(slots_seen))
    return {p: pools[p] for p in sorted(pools, key=lambda p: (POOLS.index(p) if p in POOLS else len(POOLS), p))}


def _switch_stats(phases: list[PhaseInterval]) -> dict[str, Any]:
    known = [p for p in phases if not (p.open or p.approx)]
    return {"resume": percentiles([p.resume_s for p in known]), "park": percentiles([p.park_s for p in known])}


def _job_summary(name: str, spec: Mapping[str, Any], mine: list[PhaseInterval], ready: float | None,
                 status: tuple[str, str | None], pools: Iterable[str], closed_end: Any,
                 phases: Mapping[PhaseKey, PhaseInterval]) -> dict[str, Any]:
    """One job's line of the report (see :func:`group_report_json`)."""
    slots_of: dict[str, list[int]] = {p: [] for p in POOLS}
    rank_slots = spec.get("rank_slots") if isinstance(spec.get("rank_slots"), dict) else {}
    for where in rank_slots.values():
        if isinstance(where, list) and len(where) == 2 and isinstance(where[1], int):
            slots_of.setdefault(str(where[0]), []).append(where[1])
    start = min([ready if ready is not None else math.inf, *(p.start for p in mine if p.start is not None)],
                default=math.inf)
    end = max((closed_end(p) for p in mine), default=None)
    makespan = (end - start) if end is not None and math.isfinite(start) else None
    bounds: dict[tuple[int, str], list[float]] = {}  # (iteration, pool) -> [first work start, last work end]
    for p in mine:
        if not p.open and p.work_start is not None and p.work_end is not None:
            b = bounds.setdefault((p.iteration, p.pool), [p.work_start, p.work_end])
            b[0], b[1] = min(b[0], p.work_start), max(b[1], p.work_end)
    solo = sum(b - a for (_, pool), (a, b) in bounds.items() if pool in POOLS)
    done = sorted({k for k, pool in bounds if pool == "train" and _phase_done(name, pool, k, phases, slots_of)})
    slo = _num(spec.get("slo"))
    slowdown = makespan / solo if makespan is not None and solo > 0 and status[0] == "finished" else None
    iterations = spec.get("iterations")
    return {
        "status": status[0], "why": status[1], "slo": slo,
        "iterations": iterations if isinstance(iterations, int) else None, "iterations_done": len(done),
        "slots": {p: sorted(s) for p, s in slots_of.items()},
        "start": start if math.isfinite(start) else None, "end": end, "makespan_s": makespan,
        "busy_s": {pool: sum(closed_end(p) - p.start for p in mine if p.pool == pool) for pool in pools},
        "phases": len({(p.pool, p.iteration) for p in mine}), "slot_phases": len(mine),
        "revoked": sum(p.revoked for p in mine),
        "switch_s": {pool: _switch_stats([p for p in mine if p.pool == pool]) for pool in pools},
        "est_solo_s": solo if solo > 0 else None, "slowdown": slowdown,
        "within_slo": None if slowdown is None or slo is None else slowdown <= slo,
    }


def _pool_summary(slots: list[int], on_pool: list[PhaseInterval], lo: float | None, hi: float | None,
                  closed_end: Any) -> dict[str, Any]:
    """Busy (working), switch and bubble slot-seconds of one pool over ``[lo, hi]``."""
    cap = len(slots) * (hi - lo) if lo is not None and hi is not None else 0.0
    held = work = 0.0
    if lo is not None and hi is not None:
        for slot in slots:
            on = [p for p in on_pool if p.slot == slot]
            held += _union(((p.start, closed_end(p)) for p in on), lo, hi)
            work += _union(((p.work_start if p.work_start is not None else p.start,
                             p.work_end if p.work_end is not None else closed_end(p)) for p in on), lo, hi)
    switch, bubble = max(0.0, held - work), max(0.0, cap - held)
    frac = (lambda x: x / cap if cap > 0 else None)  # noqa: E731
    return {"slots": slots, "slot_seconds": cap, "busy_s": work, "switch_s": switch, "bubble_s": bubble,
            "busy_fraction": frac(work), "switch_fraction": frac(switch), "bubble_fraction": frac(bubble)}


def group_report_json(group_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything known about a group's run, JSON-ready (see the module docstring for the terms).

    ``phases``: one interval per (job, pool, iteration, slot). Per job: ``start`` (its ranks first
    waited for a grant), ``end`` (its last release), ``makespan_s``, busy seconds per pool
    (slot-seconds held, switches included), phase count, resume/park p50/p99 per pool,
    ``est_solo_s``, ``slowdown`` = makespan / est. solo and ``within_slo`` (finished jobs only),
    status. ``est_solo_s`` is measured in the group: the sum over its iterations of the rollout
    phase (first work start to last work end on the rollout pool) plus the train phase (likewise).
    Waiting for the pools and switches are left out, but a rollout tail that ran on fewer slots
    after a tail migration counts as it ran: an upper-bound-ish estimate of the job alone (so the
    slowdown is, if anything, understated).

    Per pool, over the group's span (first job ready to last release): busy (working), switch
    (resume/park) and bubble (idle) fractions of slot-seconds. ``missing`` lists what could not be
    found or looks unfinished.
    """
    root = Path(group_dir)
    paths = GroupPaths(root)
    missing: list[str] = []
    group = _read_doc(root / "group.json")
    if group is None:
        missing.append(f"{root / 'group.json'} missing or unreadable: pools, jobs and SLOs are taken from the grants")
        group = {}
    try:
        events = read_events(paths)
    except _READ_ERRORS as exc:
        events = []
        missing.append(f"{paths.decisions}: unreadable ({exc})")
    if not events:
        missing.append(f"{paths.decisions}: no records (the group scheduler did not start or logged nothing)")
    grants = _grant_records(paths, events)
    if not grants:
        missing.append(f"{paths.grants_dir}: no grant published")
    sched = _read_doc(paths.control / "coordinator.json") or {}
    if not sched:
        missing.append(f"{paths.control / 'coordinator.json'}: no group scheduler status")
    elif sched.get("state") == "failed":
        missing.append(f"group scheduler failed: {sched.get('error')}")
    elif sched.get("state") != "finished":
        missing.append(f"group scheduler state is {sched.get('state')!r}, not finished (the group may still run)")

    phases = _collect_phases(paths, events, grants, missing)
    pools = _pools(group, grants, phases.values())
    jobs_doc: dict[str, Any] = group.get("jobs") if isinstance(group.get("jobs"), dict) else {}
    names = list(jobs_doc)
    for name in sorted({ph.job for ph in phases.values()} | {str(e.get("job")) for e in events
                                                              if e.get("kind") in ("job_finished", "job_failed", "job_stopped")}):
        if name not in names:
            names.append(name)
            if jobs_doc:
                missing.append(f"job {name} appears in the log but not in group.json")

    observed = [ph.end for ph in phases.values() if ph.end is not None]
    observed += [t for e in events if (t := _num(e.get("time"))) is not None]
    observed += [t for g in grants if (t := _num(g.get("published_at"))) is not None]
    observed_until = max(observed, default=None)

    def closed_end(p: PhaseInterval) -> float:
        """The end of a phase; a never-released one lasts until the last thing observed."""
        return p.end if p.end is not None else (observed_until if observed_until is not None else p.start or 0.0)

    intervals = sorted(phases.values(), key=lambda p: (p.start if p.start is not None else math.inf,
                                                       POOLS.index(p.pool) if p.pool in POOLS else 9, p.slot))
    worked = [p for p in intervals if not p.skipped and p.start is not None]
    ready: dict[str, float] = {}
    for p in intervals:
        if p.ready_at is not None:
            ready[p.job] = min(ready.get(p.job, math.inf), p.ready_at)
    group_start = next((_num(g.get("published_at")) for g in grants if g.get("grant") == 0), None)
    span_start = min([*ready.values(), *(p.start for p in worked if p.start is not None)], default=group_start)
    span_end = max((closed_end(p) for p in worked), default=observed_until)
    group_start = span_start if group_start is None else group_start
    span_s = (span_end - span_start) if span_start is not None and span_end is not None else 0.0
    startup_s = (span_start - group_start) if span_start is not None and group_start is not None else None

    jobs: dict[str, Any] = {}
    for name in names:
        spec = jobs_doc.get(name) if isinstance(jobs_doc.get(name), dict) else {}
        mine = [p for p in worked if p.job == name]
        status = _job_status(name, paths, events, sched)
        jobs[name] = j = _job_summary(name, spec, mine, ready.get(name), status, pools, closed_end, phases)
        try:
            j["metrics_rows"] = len(read_metrics(paths.job_dir(name)))
        except _READ_ERRORS:
            j["metrics_rows"] = 0
        if j["iterations"] is not None and j["iterations_done"] < j["iterations"] and j["status"] != "stopped":
            missing.append(f"job {name}: {j['iterations_done']} of {j['iterations']} iterations have a completed "
                           "train phase")
        if j["status"] == "running?":
            missing.append(f"job {name}: {j['why']}")
        if not mine:
            missing.append(f"job {name}: no phase ran")

    facts = {k: _num(group.get(k)) for k in ("tail_fraction", "tail_slots", "park_s", "poll_interval_s", "timeout_s")}
    facts["schedule"] = group.get("schedule", "round_robin")
    membership = _membership(root, events)
    return {
        "membership": membership,
        "group_dir": str(root), "facts": {"pools": pools, **facts},
        "scheduler": {"state": sched.get("state"), "error": sched.get("error"), "grants": len(grants)},
        "group_start": group_start, "observed_until": observed_until,
        "span": {"start": span_start, "end": span_end, "seconds": span_s,
                 "startup_s": startup_s},
        "phases": [p.to_json() for p in intervals],
        "jobs": jobs,
        "pools": {pool: _pool_summary(slots, [p for p in worked if p.pool == pool], span_start, span_end, closed_end)
                  for pool, slots in pools.items()},
        "switch_s": {pool: _switch_stats([p for p in worked if p.pool == pool]) for pool in pools},
        "missing": missing,
    }


def _phase_done(job: str, pool: str, k: int, phases: Mapping[PhaseKey, PhaseInterval],
                slots_of: Mapping[str, list[int]]) -> bool:
    """Every slot of the job on ``pool`` released phase ``k`` (any released slot when slots unknown)."""
    mine = {s for (j, p, i, s), ph in phases.items() if j == job and p == pool and i == k and not ph.open}
    want = set(slots_of.get(pool) or [])
    return bool(mine) and (not want or want <= mine)


# -- text ---------------------------------------------------------------------------------------

def _letters(names: list[str]) -> dict[str, str]:
    """One upper-case letter per job: its initial when unique, else A, B, C, ..."""
    initials = [n[:1].upper() for n in names]
    if len(set(initials)) == len(initials) and all(i.isalpha() for i in initials):
        return dict(zip(names, initials))
    return {n: chr(ord("A") + i % 26) for i, n in enumerate(names)}


def _f(value: Any, fmt: str = "{:.1f}", none: str = "-") -> str:
    return none if value is None else fmt.format(value)


def timeline_rows(report: Mapping[str, Any], columns: int = TIMELINE_COLUMNS) -> list[str]:
    """The compact text timeline: one row per slot, ``columns`` time buckets over the span."""
    t0, t1 = report["span"]["start"], report["span"]["end"]
    if t0 is None or t1 is None or t1 <= t0:
        return ["  (no phase ran: nothing to draw)"]
    letters = _letters(list(report["jobs"]))
    width = (t1 - t0) / columns
    rows = []
    for pool, stats in report["pools"].items():
        for slot in stats["slots"]:
            on = [p for p in report["phases"] if p["pool"] == pool and p["slot"] == slot and p["start"] is not None]
            cells = []
            for c in range(columns):
                a, b = t0 + c * width, t0 + (c + 1) * width
                cover: dict[str, float] = {}
                for p in on:
                    end = p["end"] if p["end"] is not None else t1
                    ws = p["work_start"] if p["work_start"] is not None else p["start"]
                    we = p["work_end"] if p["work_end"] is not None else end
                    letter = letters.get(p["job"], "?")
                    parts = ((p["start"], ws, letter.lower()), (ws, we, "?" if p["open"] else letter),
                             (we, end, letter.lower()))
                    for x, y, mark in parts:
                        overlap = min(y, b) - max(x, a)
                        if overlap > 0:
                            cover[mark] = cover.get(mark, 0.0) + overlap
                best = max(cover.items(), key=lambda kv: kv[1], default=(".", 0.0))
                cells.append(best[0] if best[1] >= (width - sum(cover.values())) else ".")
            rows.append(f"  {pool:<7} {slot:>3} |{''.join(cells)}|")
        rows.append("")
    origin = report["group_start"] if report["group_start"] is not None else t0
    ticks, labels = [" "] * (columns + 1), [" "] * (columns + 12)
    for c in range(0, columns + 1, 20):
        ticks[c] = "^"
        text = f"{t0 + c * width - origin:.0f}s"
        for i, ch in enumerate(text):
            labels[c + i] = ch
    rows[-1:] = [f"  {'':<11} {''.join(ticks)}", f"  {'':<11} {''.join(labels).rstrip()}"]
    return rows


def _membership(root: Path, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Joins and leaves (``mux add`` / ``mux remove`` records, the scheduler's ``job_joined``) and the
    group's stops and resumes, in time order."""
    rows: list[dict[str, Any]] = []
    try:
        from slurm_rl.mux.group_state import read_records

        records = read_records(root)
    except _READ_ERRORS:
        records = []
    for r in records:
        what = f"mux add {r['join']}" if "join" in r else f"mux remove {r.get('leave')}: {r.get('reason', '')}"
        rows.append({"time": _num(r.get("time")), "what": what})
    for e in events:
        kind = e.get("kind")
        if kind == "job_joined":
            rows.append({"time": _num(e.get("time")), "what": f"{e.get('job')} joined the rotation, order "
                                                               f"{e.get('order')}"})
        elif kind == "group_stop":
            rows.append({"time": _num(e.get("time")), "what": f"group stop ({e.get('reason')}): members "
                                                               f"{e.get('members')} checkpoint at their gates"})
        elif kind == "group_resumed":
            rows.append({"time": _num(e.get("time")), "what": f"group resumed members {e.get('members')}"})
    return sorted(rows, key=lambda r: r["time"] if r["time"] is not None else math.inf)


def format_group_report(group_dir: str | os.PathLike[str], columns: int = TIMELINE_COLUMNS) -> str:
    """One screen: facts, per-job table, per-pool busy/bubble, switch latency, text timeline."""
    r = group_report_json(group_dir)
    out: list[str] = []
    facts, span = r["facts"], r["span"]
    pools = ", ".join(f"{p} {_slot_ranges(s)}" for p, s in facts["pools"].items()) or "unknown"
    out.append(f"group {r['group_dir']}  (scheduler: {r['scheduler']['state'] or 'no status'}, "
               f"{r['scheduler']['grants']} grants)")
    out.append(f"  pools: {pools}; tail_fraction {_f(facts.get('tail_fraction'), '{:g}')}, tail_slots "
               f"{_f(facts.get('tail_slots'), '{:g}')}, park_s {_f(facts.get('park_s'), '{:g}')}")
    out.append(f"  span {_f(span['seconds'])}s (first job ready +{_f(span['startup_s'])}s after grant 0 .. "
               f"last release); times below are seconds since grant 0; schedule {facts.get('schedule')}")
    for m in r["membership"]:
        t = None if m["time"] is None or r["group_start"] is None else m["time"] - r["group_start"]
        out.append(f"  {_f(t):>7}s  {m['what']}")
    out.append("")
    letters = _letters(list(r["jobs"]))
    out.append(f"  {'job':<14} {'':1} {'iters':>5} {'start':>6} {'end':>6} {'makespan':>8} {'est.solo':>8} "
               f"{'slowdown':>8} {'SLO':>5} {'ok':>3}  status")
    origin = r["group_start"] or 0.0
    for name, j in r["jobs"].items():
        ok = {True: "yes", False: "NO", None: "-"}[j["within_slo"]]
        status = j["status"] + (f": {j['why']}" if j["why"] and j["status"] != "finished" else "")
        iters = f"{j['iterations_done']}/{_f(j['iterations'], '{}', '?')}"
        start = None if j["start"] is None else j["start"] - origin
        end = None if j["end"] is None else j["end"] - origin
        out.append(f"  {name[:14]:<14} {letters[name]:1} {iters:>5} {_f(start):>6} {_f(end):>6} "
                   f"{_f(j['makespan_s']):>8} {_f(j['est_solo_s']):>8} {_f(j['slowdown'], '{:.2f}x'):>8} "
                   f"{_f(j['slo'], '{:g}x'):>5} {ok:>3}  {status[:60]}")
    out.append("  (est.solo: in-group rollout + train phase durations per iteration, tails included: "
               "an upper-bound-ish solo time)")
    out.append("")
    out.append(f"  {'pool':<8} {'slots':>5} {'busy':>6} {'switch':>6} {'bubble':>6}   "
               f"{'resume p50/p99 s':>17} {'park p50/p99 s':>15}")
    for pool, s in r["pools"].items():
        sw = r["switch_s"].get(pool, {})
        out.append(f"  {pool:<8} {len(s['slots']):>5} {_f(s['busy_fraction'], '{:.0%}'):>6} "
                   f"{_f(s['switch_fraction'], '{:.1%}'):>6} {_f(s['bubble_fraction'], '{:.0%}'):>6}   "
                   f"{_pq(sw.get('resume')):>17} {_pq(sw.get('park')):>15}")
    out.append("")
    legend = ", ".join(f"{letters[n]} = {n}" for n in r["jobs"])
    width = span["seconds"] / columns if span["seconds"] else 0.0
    out.append(f"  timeline, 1 column = {width:.2f}s: {legend}")
    out.append("  (upper case = working, lower case = resume/park, ? = held but never released, . = idle)")
    out.extend(timeline_rows(r, columns))
    if r["missing"]:
        out.append("")
        out.append("  missing / incomplete:")
        for m in r["missing"]:
            out.extend(textwrap.wrap(m, width=110, initial_indent="   - ", subsequent_indent="     "))
    return "\n".join(out)


def _legend_label(name: str, job: Mapping[str, Any], origin: float) -> str:
    end = "-" if job["end"] is None else f"{job['end'] - origin:.0f}s"
    return (f"{name}: {job['status']} at {end}\n  slowdown {_f(job['slowdown'], '{:.2f}x')}"
            f" (SLO {_f(job['slo'], '{:g}x')})")


def _pq(stats: Mapping[str, Any] | None) -> str:
    if not stats or not stats.get("n"):
        return "-"
    return f"{stats['p50']:.3f}/{stats['p99']:.3f}"


def _slot_ranges(slots: list[int]) -> str:
    from slurm_rl.inspect.epoch_log import compress_ranks

    return compress_ranks(slots)


# -- Gantt --------------------------------------------------------------------------------------

def write_group_gantt(group_dir: str | os.PathLike[str], path: str | os.PathLike[str] | None = None) -> Path:
    """Draw the group's slots over time as a Gantt PNG (default ``GROUP_DIR/timeline.png``).

    Rows: slots, rollout pool above the training pool; x: seconds since grant 0. One colour per
    job, a bar per phase (its iteration written in it when it fits), resume/park parts hatched,
    revoked (tail-migrated) ends marked, never-released phases dashed. Needs matplotlib.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    r = group_report_json(group_dir)
    out = Path(path) if path is not None else Path(group_dir) / "timeline.png"
    origin = r["group_start"] or r["span"]["start"] or 0.0
    t1 = (r["span"]["end"] or origin) - origin
    t0 = max(0.0, (r["span"]["start"] or origin) - origin)
    names = list(r["jobs"])
    cmap = plt.get_cmap("tab10")
    palette = [cmap(i) for i in (0, 1, 2, 4, 6, 8, 9, 5, 7)]  # no red: red marks revoked slots
    colour = {n: palette[i % len(palette)] for i, n in enumerate(names)}
    rows: list[tuple[str, int]] = [(p, s) for p in POOLS if p in r["pools"] for s in r["pools"][p]["slots"]]
    rows += [(p, s) for p in r["pools"] if p not in POOLS for s in r["pools"][p]["slots"]]
    gap = 0.8
    ypos: dict[tuple[str, int], float] = {}
    y = 0.0
    for i, (pool, slot) in enumerate(rows):
        if i and rows[i - 1][0] != pool:
            y += gap
        ypos[(pool, slot)] = y
        y += 1.0
    n = max(1, len(rows))
    fig, ax = plt.subplots(figsize=(13, 1.6 + 0.42 * n + 0.6 * (len(r["pools"]) - 1)))
    span = max(t1 - t0, 1e-9)
    height = 0.78
    revoked_x, revoked_y = [], []
    for p in r["phases"]:
        if p["start"] is None or (p["pool"], p["slot"]) not in ypos:
            continue
        yc = ypos[(p["pool"], p["slot"])]
        a = p["start"] - origin
        b = (p["end"] if p["end"] is not None else origin + t1) - origin
        ws = (p["work_start"] if p["work_start"] is not None else p["start"]) - origin
        we = (p["work_end"] - origin) if p["work_end"] is not None else b
        c = colour.get(p["job"], "grey")
        if p["open"] or p["approx"]:
            ax.barh(yc, b - a, left=a, height=height, color=c, alpha=0.35 if p["open"] else 0.6, edgecolor="black",
                    linestyle="--" if p["open"] else ":", linewidth=1.0)
        else:
            ax.barh(yc, we - ws, left=ws, height=height, color=c, edgecolor="white", linewidth=0.6)
            for x0, x1 in ((a, ws), (we, b)):
                if x1 > x0:
                    ax.barh(yc, x1 - x0, left=x0, height=height, color=c, alpha=0.45, hatch="////",
                            edgecolor="black", linewidth=0)
        if p["revoked"]:
            revoked_x.append(we)
            revoked_y.append(yc)
        label = f"it {p['iteration']}" if b - a > 0.06 * span else str(p["iteration"])
        if b - a > 0.022 * span:
            ax.text((a + b) / 2, yc, label + ("?" if p["open"] else ""), ha="center", va="center", fontsize=8,
                    color="white" if not p["open"] else "black", fontweight="bold", clip_on=True)
    for x, yc in zip(revoked_x, revoked_y):  # a red right edge: the slot was taken back mid-phase
        ax.plot([x, x], [yc - height / 2, yc + height / 2], color="red", linewidth=2.8, solid_capstyle="butt",
                zorder=5)
    for name, j in r["jobs"].items():
        if j["end"] is not None:
            ax.axvline(j["end"] - origin, color=colour[name], linestyle=":", linewidth=1.3)
    # pools: separators and labels
    labels = []
    for pool in r["pools"]:
        ys = [ypos[(pool, s)] for s in r["pools"][pool]["slots"] if (pool, s) in ypos]
        if not ys:
            continue
        st = r["pools"][pool]
        ax.text(-0.075, (min(ys) + max(ys)) / 2, f"{pool} pool", transform=ax.get_yaxis_transform(), rotation=90,
                ha="center", va="center", fontsize=10, fontweight="bold")
        labels.append(f"{pool}: busy {_f(st['busy_fraction'], '{:.0%}')}, bubble {_f(st['bubble_fraction'], '{:.0%}')}")
        if min(ys) > 0:
            ax.axhline(min(ys) - (gap + 1 - height) / 2 - height / 2, color="grey", linewidth=0.8)
    ax.set_yticks([ypos[k] for k in rows], [f"slot {s}" for _, s in rows], fontsize=8)
    ax.set_ylim(y - 1 + 0.7, -0.7)
    pad = 0.01 * span
    ax.set_xlim(t0 - pad, t1 + pad)
    ax.set_xlabel("seconds since the group started (grant 0)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    title = f"co-execution group {Path(r['group_dir']).name}: " + "; ".join(labels)
    ax.set_title(title, fontsize=10)
    handles: list[Any] = [Patch(color=colour[nm], label=_legend_label(nm, r["jobs"][nm], origin)) for nm in names]
    handles.append(Patch(facecolor="lightgrey", hatch="////", edgecolor="black", label="resume / park (switch)"))
    handles.append(Line2D([], [], linestyle=":", color="black", label="job's last release (coloured)"))
    if revoked_x:
        handles.append(Line2D([], [], color="red", linewidth=2.8, label="revoked: tail migrated away"))
    if any(p["open"] for p in r["phases"]):
        handles.append(Patch(facecolor="white", edgecolor="black", linestyle="--", label="never released"))
    if any(p["approx"] for p in r["phases"]):
        handles.append(Patch(facecolor="lightgrey", edgecolor="black", linestyle=":",
                             label="no release record (times from grants)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
