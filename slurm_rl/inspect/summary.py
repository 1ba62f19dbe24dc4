"""A run on one screen: facts, epochs (repeated iteration patterns collapsed), metrics summarised,
GPU-seconds per component with bubbles, switch latency, the text Gantt, and what is missing.

``run_report_json`` is the full data behind it (``slurm-rl inspect --json``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from slurm_rl.errors import InputError
from slurm_rl.inspect.epoch_log import EpochRecord, _human_bytes, compress_ranks, epoch_records, kept_gates
from slurm_rl.inspect.run_gantt import gantt_legend_text, text_gantt
from slurm_rl.inspect.run_timeline import (RunTimeline, build_timeline, clip_timeline, component_seconds,
                                           iteration_spans)
from slurm_rl.metrics import read_metrics
from slurm_rl.placement import COMPONENTS

SPARK = "▁▂▃▄▅▆▇█"
METRIC_KEYS = ("reward_mean", "kl", "loss", "lr", "seconds", "tokens_per_s", "actor_dp", "sync_s", "train_s",
               "val/reward_mean", "val/pass@1", "val/mean@n", "mismatch/kl", "mismatch/max_abs", "actor/pg_clipfrac",
               "critic/vf_loss", "critic/vf_clipfrac", "staleness/max")
LOWER_IS_BETTER = {"kl", "loss", "seconds", "sync_s", "train_s", "mismatch/kl", "mismatch/max_abs", "critic/vf_loss",
                   "staleness/max"}
HIGHER_IS_BETTER = {"reward_mean", "tokens_per_s", "val/reward_mean", "val/pass@1", "val/mean@n"}
WINDOW_HELP = "A:B (iterations A to B-1, like a Python slice; A: and :B too, negative counts from the end)"


class WindowError(InputError):
    """``--iterations`` names no window of the run's iterations (the message says what is allowed)."""


def run_iteration_end(tl: RunTimeline, rows: list[dict[str, Any]]) -> int:
    """One past the last iteration the run released or finished (0: none yet)."""
    done = [int(r["iteration"]) for r in rows if isinstance(r.get("iteration"), int)]
    released = [k for k, _, _ in iteration_spans(tl)]
    return max(done + released, default=-1) + 1


def resolve_window(text: str, end: int) -> tuple[int, int]:
    """``--iterations TEXT`` as ``(first, stop)`` within the run's iterations ``0..end-1``:
    ``A:B`` (half open), ``A:``, ``:B``, a single ``A``; negative values count from ``end``."""
    where = (f"the run's iterations are 0-{end - 1} (0:{end})" if end > 0
             else "the run has no iteration released yet")
    bad = WindowError(f"--iterations: got {text!r}; allowed: {WINDOW_HELP} within the run: {where}")
    try:
        if ":" in text:
            a, b = text.split(":")
            first = int(a) if a.strip() else 0
            stop = int(b) if b.strip() else end
            first, stop = (first + end if first < 0 else first), (stop + end if stop < 0 else stop)
        else:
            first = int(text)
            first = first + end if first < 0 else first
            stop = first + 1
    except ValueError:
        raise bad from None
    if not 0 <= first < stop <= end:
        raise bad
    return first, stop


def percentiles(values: list[float]) -> dict[str, float | None]:
    """``{"n", "p50", "p99", "max"}`` with linear interpolation (None when empty)."""
    xs = sorted(values)

    def q(p: float) -> float | None:
        if not xs:
            return None
        pos = p * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {"n": len(xs), "p50": q(0.5), "p99": q(0.99), "max": xs[-1] if xs else None}


def sparkline(values: list[float], width: int = 32) -> str:
    """``values`` as block characters, averaged down to at most ``width`` cells."""
    xs = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not xs:
        return ""
    if len(xs) > width:
        step = len(xs) / width
        xs = [sum(xs[int(i * step):max(int(i * step) + 1, int((i + 1) * step))])
              / max(1, len(xs[int(i * step):max(int(i * step) + 1, int((i + 1) * step))])) for i in range(width)]
    lo, hi = min(xs), max(xs)
    if hi - lo < 1e-12:
        return SPARK[3] * len(xs)
    return "".join(SPARK[min(len(SPARK) - 1, int((x - lo) / (hi - lo) * len(SPARK)))] for x in xs)


def metric_summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per numeric metric: first, best (where better has a direction), last, mean, sparkline."""
    out: dict[str, dict[str, Any]] = {}
    for key in METRIC_KEYS:
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        if not values:
            continue
        best = max(values) if key in HIGHER_IS_BETTER else min(values) if key in LOWER_IS_BETTER else None
        out[key] = {"first": values[0], "best": best, "last": values[-1], "mean": sum(values) / len(values),
                    "n": len(values), "spark": sparkline(values)}
    return out


def staleness_summary(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The samples trained per staleness (iteration - the policy version their rollout started from), per
    iteration and over the rows; None where no row has them (a run from before they were recorded)."""
    per = {int(r["iteration"]): {int(s): int(n) for s, n in r["staleness/counts"].items()}
           for r in rows if isinstance(r.get("staleness/counts"), dict) and isinstance(r.get("iteration"), int)}
    if not per:
        return None
    total: dict[int, int] = {}
    for counts in per.values():
        for s, n in counts.items():
            total[s] = total.get(s, 0) + n
    return {"per_iteration": {str(k): {str(s): n for s, n in sorted(c.items())} for k, c in sorted(per.items())},
            "total": {str(s): n for s, n in sorted(total.items())}, "max": max(total, default=None)}


def _signature(records: list[EpochRecord]) -> tuple[Any, ...]:
    return tuple((r.boundary, tuple((c, tuple(r.placement.get(c, []))) for c in COMPONENTS)) for r in records)


def collapse_epochs(records: list[EpochRecord]) -> list[tuple[list[int], list[EpochRecord]]]:
    """Group the iterations by their pattern of epochs (boundaries and placements, in order):
    ``(iterations with that pattern, the epochs of the first of them)``, by first occurrence."""
    by_it: dict[int, list[EpochRecord]] = {}
    for r in records:
        by_it.setdefault(r.iteration, []).append(r)
    patterns: dict[tuple[Any, ...], tuple[list[int], list[EpochRecord]]] = {}
    for k in sorted(by_it):
        its, _ = patterns.setdefault(_signature(by_it[k]), ([], by_it[k]))
        its.append(k)
    return list(patterns.values())


def run_report_json(run_dir: str | Path, now: float | None = None, iterations: str | None = None) -> dict[str, Any]:
    """Everything inspection knows about a run, JSON-ready; ``missing`` says what could not be found.

    ``iterations`` (``--iterations A:B``, see :func:`resolve_window`): the epochs, metrics,
    GPU-seconds, switches and timeline of those iterations only (``facts`` stay the whole run's;
    ``window`` says which); :class:`WindowError` when the run has no such iterations."""
    root = Path(run_dir)
    tl = build_timeline(root, now=now)
    try:
        records, kept = epoch_records(root), kept_gates(root)
    except Exception as exc:  # a torn or missing epoch log is reported, never raised
        records, kept = [], []
        tl.missing.append(f"epoch log: {type(exc).__name__}: {exc}")
    rows = read_metrics(root)
    if not rows:
        tl.missing.append(f"{root / 'metrics.jsonl'}: no iteration finished yet (no metrics)")
    facts, window = _facts(root, tl, rows), None
    if iterations is not None:
        first, stop = resolve_window(iterations, run_iteration_end(tl, rows))
        tl = clip_timeline(tl, first, stop)
        records = [r for r in records if first <= r.iteration < stop]
        kept = [k for k in kept if first <= k["iteration"] < stop]
        rows = [r for r in rows if isinstance(r.get("iteration"), int) and first <= r["iteration"] < stop]
        window = _window_facts(iterations, first, stop, tl, rows)
    latencies = [r.switch_latency_s for r in records if r.switch_latency_s is not None and r.epoch > 0]
    reshards = [r.reshard_s for r in records if r.reshard_s is not None]
    return {
        "run_dir": str(root),
        "facts": facts,
        **({"window": window} if window is not None else {}),
        "epochs": [r.to_json() for r in records],
        "kept": kept,
        "metrics": rows,
        "metrics_summary": metric_summary(rows),
        "staleness": staleness_summary(rows),
        "components": component_seconds(tl),
        "switch": {"latency_s": percentiles(latencies), "reshard_s": percentiles(reshards),
                   "bytes_moved": sum(r.bytes_moved for r in records),
                   "migrated_requests": sum(m["requests"] for m in tl.migrations)},
        "timeline": tl.to_json(),
        "memory": peak_memory(root, facts.get("world_size")),
        "missing": list(tl.missing),
    }


def peak_memory(root: Path, world_size: int | None) -> dict[str, Any]:
    """Each rank's peak resident host memory so far (its last heartbeat's ``peak_rss_bytes``; ranks whose
    heartbeat has none are left out) and the largest of them."""
    from slurm_rl.control.heartbeats import read_heartbeat
    from slurm_rl.control.paths import RunPaths

    paths, peaks = RunPaths(root), {}
    for rank in range(int(world_size or 0)):
        try:
            doc = read_heartbeat(paths, rank)
        except Exception:  # a torn heartbeat: this rank's figure is missing, the report goes on
            doc = None
        if doc is not None and doc.get("peak_rss_bytes") is not None:
            peaks[rank] = int(doc["peak_rss_bytes"])
    top = max(peaks, key=lambda r: peaks[r]) if peaks else None
    return {"peak_rss_bytes": peaks, "max_rank": top}


def _facts(root: Path, tl: RunTimeline, rows: list[dict[str, Any]]) -> dict[str, Any]:
    from slurm_rl.inspect.run_timeline import config_facts

    _, _, facts = config_facts(root, [])
    lo, hi = tl.window
    seconds = [float(r["seconds"]) for r in rows if isinstance(r.get("seconds"), (int, float))]
    done = len({r["iteration"] for r in rows if isinstance(r.get("iteration"), int)}) or len(rows)
    return {**facts, "state": tl.state, "iterations_done": done, "epochs": len(tl.epochs),
            "startup_s": (lo - tl.t0) if lo is not None and tl.t0 is not None else None,
            "train_s": (hi - lo) if lo is not None and hi is not None else None,
            "s_per_iteration": sum(seconds) / len(seconds) if seconds else None}


def _window_facts(spec: str, first: int, stop: int, tl: RunTimeline, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``--iterations`` picked: its iterations, when they ran (seconds into the run), their pace."""
    origin = tl.origin if tl.origin is not None else tl.t0
    seconds = [float(r["seconds"]) for r in rows if isinstance(r.get("seconds"), (int, float))]
    return {"spec": spec, "iterations": [first, stop],
            "iterations_done": len({r["iteration"] for r in rows}), "epochs": len(tl.epochs),
            "start_s": tl.t0 - origin if tl.t0 is not None and origin is not None else None,
            "end_s": tl.end - origin if tl.end is not None and origin is not None else None,
            "s_per_iteration": sum(seconds) / len(seconds) if seconds else None}


def _f(value: Any, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def format_summary(run_dir: str | Path, all_epochs: bool = False, columns: int = 72,
                   report: dict[str, Any] | None = None) -> str:
    """The one-screen summary as text (``all_epochs``: every epoch row instead of collapsed patterns)."""
    r = report if report is not None else run_report_json(run_dir)
    f, out = r["facts"], []
    done = f"{f['iterations_done']}/{f.get('iterations', '?')}"
    out.append(f"run {r['run_dir']}")
    out.append(f"  {f.get('device', '?')} · {f.get('world_size', '?')} ranks · policy {f.get('policy', '?')} · "
               f"state {f['state']} · iterations {done} · {f['epochs']} epochs · startup {_f(f['startup_s'])}s · "
               f"training {_f(f['train_s'])}s · {_f(f['s_per_iteration'], '{:.2f}')} s/iteration")
    w = r.get("window")
    if w is not None:
        first, stop = w["iterations"]
        out.append(f"  --iterations {w['spec']}: only iterations {first}-{stop - 1} below ({w['iterations_done']} "
                   f"finished) · {w['epochs']} epochs · {_f(w['start_s'])}s to {_f(w['end_s'])}s into the run · "
                   f"{_f(w['s_per_iteration'], '{:.2f}')} s/iteration")
    out.append("")
    out.extend(_epoch_lines(r, all_epochs))
    out.append("")
    out.extend(_metric_lines(r["metrics_summary"]))
    out.extend(_staleness_lines(r.get("staleness")))
    out.append("")
    out.extend(_component_lines(r))
    out.extend(_memory_lines(r.get("memory") or {}))
    tl = _timeline_from_json(r["timeline"])
    out.append("")
    out.append(gantt_legend_text(tl, columns))
    out.extend(text_gantt(tl, columns))
    if r["missing"]:
        out.append("")
        out.append("  missing / incomplete:")
        out.extend(f"   - {m}" for m in r["missing"])
    return "\n".join(out)


def _memory_lines(memory: dict[str, Any]) -> list[str]:
    peaks = {int(k): v for k, v in (memory.get("peak_rss_bytes") or {}).items()}
    if not peaks:
        return []
    gib = sorted(v / 2**30 for v in peaks.values())
    top = max(peaks, key=lambda r: peaks[r])
    return [f"  peak host memory (RSS) per rank: max {peaks[top] / 2**30:.2f} GiB (rank {top}), "
            f"median {gib[len(gib) // 2]:.2f}, min {gib[0]:.2f} GiB over {len(peaks)} ranks"]


def _epoch_lines(r: dict[str, Any], all_epochs: bool, max_rows: int = 12) -> list[str]:
    records = [EpochRecord(**e) for e in r["epochs"]]
    if not records:
        return ["  placement epochs: none published" + (" in these iterations" if r.get("window") else "")]
    origin = r["timeline"].get("origin")  # a window: times stay seconds into the run
    t0 = origin if origin is not None else records[0].published_at
    head = (f"  {'epoch':>5} {'iter':>4} {'boundary':<9} {'at':>7}  {'actor':<9} {'rollout':<9} {'inference':<9} "
            f"{'switch s':>8} {'reshard s':>9} {'moved':>8}  reason")
    lines = [f"  placement epochs ({len(records)}; " + ("all rows" if all_epochs else
                                                       "iterations with the same pattern collapsed; --all for every row")
             + "):", head]

    def row(e: EpochRecord) -> str:
        return (f"  {e.epoch:>5} {e.iteration:>4} {e.boundary:<9} {e.published_at - t0:>6.2f}s  "
                + " ".join(f"{compress_ranks(e.placement.get(c, [])):<9}" for c in COMPONENTS)
                + f" {_f(e.switch_latency_s, '{:.3f}'):>8} {_f(e.reshard_s, '{:.3f}'):>9} "
                  f"{_human_bytes(e.bytes_moved):>8}  {e.reason[:48]}")

    kept = r.get("kept") or []
    said = [f"  placement kept at the gate of iteration {k['iteration']} (no epoch): {k['reason']}" for k in kept[-3:]]
    if len(kept) > 3:
        said.insert(0, f"  placement kept at {len(kept)} gates (no epoch published); the latest 3:")
    if all_epochs:
        return lines + [row(e) for e in records] + said
    shown = 0
    groups = collapse_epochs(records)
    for n, (its, group) in enumerate(groups):
        if shown + len(group) > max_rows and n > 0:
            rest = [k for its_, _ in groups[n:] for k in its_]
            listed = compress_ranks(rest)
            if len(listed) > 40:
                listed = listed[:40].rsplit(",", 1)[0] + ",…"
            lines.append(f"  {'':>5} {'':>4} ... {len(groups) - n} other pattern(s) in {len(rest)} iteration(s): "
                         f"{listed} (--all for every epoch)")
            break
        lines.extend(row(e) for e in group)
        shown += len(group)
        if len(its) > 1:
            listed = compress_ranks(its[1:])
            if len(listed) > 40:
                listed = listed[:40].rsplit(",", 1)[0] + ",…"
            lines.append(f"  {'':>5} {'':>4} ... the same {len(group)} epoch(s) in {len(its) - 1} more "
                         f"iteration(s): {listed}")
    return lines + said


def _metric_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    if not summary:
        return ["  metrics: none yet"]
    wide = max(12, *(len(k) for k in summary))
    lines = [f"  {'metric':<{wide}} {'first':>10} {'best':>10} {'last':>10}  per iteration"]
    for key, m in summary.items():
        lines.append(f"  {key:<{wide}} {m['first']:>10.4g} {_f(m['best'], '{:.4g}'):>10} {m['last']:>10.4g}  "
                     f"{m['spark']}")
    return lines


def _staleness_lines(st: dict[str, Any] | None) -> list[str]:
    if st is None:
        return []
    total = sum(st["total"].values())
    spread = ", ".join(f"{s}: {n} ({n / total:.0%})" for s, n in st["total"].items()) if total else "no samples"
    return [f"  staleness (iteration - policy version of the samples' rollout), samples over "
            f"{len(st['per_iteration'])} iterations: {spread}; max {st['max']} (per iteration: --json)"]


def _component_lines(r: dict[str, Any]) -> list[str]:
    comps, sw = r["components"], r["switch"]
    lines = [f"  {'GPU-seconds':<16} {'held':>8} {'busy':>8} {'reshard':>8} {'bubble':>8} {'bubble %':>8}"]
    for label, c in comps.items():
        share = c["bubble_s"] / c["held_s"] if c["bubble_s"] is not None and c["held_s"] > 0 else None
        lines.append(f"  {label:<16} {c['held_s']:>8.1f} {_f(c['busy_s']):>8} {_f(c['switch_s'], '{:.2f}'):>8} "
                     f"{_f(c['bubble_s']):>8} {_f(share, '{:.0%}'):>8}")
    if not comps:
        lines.append("  (no training window yet)")
    lat, rs = sw["latency_s"], sw["reshard_s"]
    lines.append(f"  switch latency p50/p99 {_f(lat['p50'], '{:.3f}')}/{_f(lat['p99'], '{:.3f}')}s over {lat['n']} "
                 f"switch{'es' if lat['n'] != 1 else ''}; actor reshard p50/p99 {_f(rs['p50'], '{:.3f}')}/{_f(rs['p99'], '{:.3f}')}s; "
                 f"{_human_bytes(sw['bytes_moved'])} moved; {sw['migrated_requests']} requests migrated")
    return lines


def _timeline_from_json(doc: dict[str, Any]) -> RunTimeline:
    from slurm_rl.inspect.run_timeline import RoleBar

    tl = RunTimeline(run_dir=doc["run_dir"], world=doc["world"], t0=doc["t0"], end=doc["end"], state=doc["state"],
                     iterations=doc["iterations"], epochs=doc["epochs"],
                     bars=[RoleBar(b["rank"], b["epoch"], tuple(b["roles"]), b["start"], b["end"], b["open"])
                           for b in doc["bars"]],
                     spans={int(k): v for k, v in doc["spans"].items()},
                     gates=[tuple(g) for g in doc["gates"]], reshards=doc["reshards"], migrations=doc["migrations"],
                     missing=doc["missing"], origin=doc.get("origin"))
    return tl
