"""The placement timeline of one run as a Gantt chart: PNG (matplotlib) and compact text.

Rows are ranks, the x axis is seconds since epoch 0 was published. A rank's bar has the colour of
the role it held (pale where it held the role but did nothing: the bubble; full where an activity
span says it worked), black hatching where the actor's state was resharded. Dotted lines mark
epochs, solid lines the iteration gates; arrows name the requests migrated off a released
rollout rank. The text version collapses ranks whose rows are identical, so it stays short at 64.

A long run (more than ``LONG_RUN_ITERATIONS`` iterations) would be a solid block at that scale: its
PNG shows one column per iteration over the whole run (the role each rank held most of it; the
seconds it took and the actor's size) above the Gantt chart of its last ``DETAIL_ITERATIONS``.
"""

from __future__ import annotations

import bisect
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_rl.inspect.run_timeline import (BUSY_KINDS, RunTimeline, clip_timeline, iteration_spans, overlap,
                                           rank_intervals)
from slurm_rl.placement import COMPONENTS

TEXT_COLUMNS = 72
LETTERS = {"actor": "A", "rollout": "R", "inference": "I", "critic": "V"}
COLOURS = {"actor": "#1f77b4", "rollout": "#2ca02c", "inference": "#ff7f0e", "critic": "#9467bd", "idle": "#bbbbbb"}
MIXED_COLOUR = "#9467bd"
MAX_EPOCH_LINES = 120  # more epoch lines than this would grey the whole chart
MAX_MIGRATION_LABELS = 40
MAX_RESHARD_LABELS = 16
LONG_RUN_ITERATIONS = 40  # more iterations than this: an overview of each iteration over the last ones in detail
DETAIL_ITERATIONS = 20


def _letter(label: str) -> str:
    if label == "idle":
        return "."
    parts = label.split("+")
    return LETTERS.get(parts[0], "?") if len(parts) == 1 else "C"


def text_gantt(tl: RunTimeline, columns: int = TEXT_COLUMNS) -> list[str]:
    """One row per run of consecutive ranks with the same role in every epoch: upper case = working
    (half of the column or more, averaged over the row's ranks), lower case = holding the role idle
    (bubble), ``.`` = no role, ``#`` = actor reshard, blank = not started / finished."""
    if tl.t0 is None or tl.end is None or tl.end <= tl.t0 or not tl.bars:
        return ["  (no epoch acknowledged yet: nothing to draw)"]
    t0, width = tl.t0, (tl.end - tl.t0) / columns
    has_spans = any(tl.spans.values())
    # Ranks with the same role in every epoch share a row; its cells take the role covering most of
    # the column over those ranks (acks differ by milliseconds between them).
    keys = {r: tuple(b.label for b in sorted((b for b in tl.bars if b.rank == r), key=lambda b: b.epoch))
            for r in tl.world}
    groups: list[list[int]] = []
    for rank in tl.world:
        if groups and keys[groups[-1][-1]] == keys[rank] and groups[-1][-1] == rank - 1:
            groups[-1].append(rank)
        else:
            groups.append([rank])
    out: list[str] = []
    for group in groups:
        cover = [dict() for _ in range(columns)]  # type: list[dict[str, float]]
        busy_share, reshard_share = [0.0] * columns, [0.0] * columns
        for rank in group:
            busy, reshard = rank_intervals(tl, rank, BUSY_KINDS), rank_intervals(tl, rank, ("reshard",))
            for bar in (b for b in tl.bars if b.rank == rank):
                first = max(0, int((bar.start - t0) / width))
                last = min(columns - 1, int((bar.end - t0) / width))
                for c in range(first, last + 1):
                    part = min(bar.end, t0 + (c + 1) * width) - max(bar.start, t0 + c * width)
                    if part > 0:
                        cover[c][bar.label] = cover[c].get(bar.label, 0.0) + part
            for c in range(columns):
                a, b = t0 + c * width, t0 + (c + 1) * width
                busy_share[c] += overlap(busy, a, b) / width / len(group)
                reshard_share[c] += overlap(reshard, a, b) / width / len(group)
        cells = []
        for c in range(columns):
            mark = _letter(max(cover[c].items(), key=lambda kv: kv[1])[0]) if cover[c] else " "
            if mark not in " ." and reshard_share[c] >= 0.5:
                mark = "#"
            elif mark not in " .?" and has_spans and busy_share[c] < 0.5:
                mark = mark.lower()
            cells.append(mark)
        name = f"rank {group[0]}" if len(group) == 1 else f"ranks {group[0]}-{group[-1]}"
        out.append(f"  {name:>12} |{''.join(cells)}|")
    marks = [" "] * columns
    for e in tl.epochs:
        c = int((e["published_at"] - t0) / width)
        if 0 <= c < columns and marks[c] == " ":
            marks[c] = "'"
    for k, t in tl.gates:
        c = min(columns - 1, int((t - t0) / width))
        if 0 <= c:  # digits while they can be read, | when gates crowd the columns
            marks[c] = str(k % 10) if len(tl.gates) <= columns // 3 else "|"
    out.insert(0, f"  {'gates/epochs':>12} |{''.join(marks)}|")
    labels = [" "] * (columns + 8)
    shift = t0 - tl.origin if tl.origin is not None else 0.0  # a window of a run: seconds into the run
    for c in range(0, columns + 1, 18):
        for n, ch in enumerate(f"^{shift + c * width:.0f}s"):
            if c + n < len(labels):
                labels[c + n] = ch
    out.append(f"  {'':>12}  {''.join(labels).rstrip()}")
    return out


def gantt_legend_text(tl: RunTimeline, columns: int = TEXT_COLUMNS) -> str:
    width = (tl.end - tl.t0) / columns if tl.t0 is not None and tl.end is not None else 0.0
    return (f"  placement timeline, 1 column = {width:.2f}s: A actor, R rollout, I inference, V critic, C collocated, . no role\n"
            f"  (lower case = holding the role idle: bubble; # = actor reshard; digit or | = iteration gate, ' = epoch)")


@dataclass
class GanttDrawing:
    """What :func:`draw_run_gantt` drew: ``layout`` is ``single`` (one Gantt chart) or
    ``overview+detail`` (a long run: a strip per iteration of the whole run over a Gantt chart of
    its last iterations); ``axes`` names the panels top to bottom; ``detail``: the iterations
    ``[first, stop)`` of the detailed chart (None: the whole timeline is drawn in detail)."""

    path: Path
    layout: str
    axes: list[str]
    iterations: int
    detail: tuple[int, int] | None = None


def write_run_gantt(tl: RunTimeline, path: str | os.PathLike[str] | None = None, title: str | None = None) -> Path:
    """Draw ``tl`` as a Gantt PNG (default ``RUN_DIR/timeline.png``); needs matplotlib. A run of
    more than :data:`LONG_RUN_ITERATIONS` iterations gets an overview of every iteration over a
    Gantt chart of the last :data:`DETAIL_ITERATIONS` (see :func:`draw_run_gantt`)."""
    return draw_run_gantt(tl, path, title).path


def draw_run_gantt(tl: RunTimeline, path: str | os.PathLike[str] | None = None, title: str | None = None,
                   detail_iterations: int = DETAIL_ITERATIONS) -> GanttDrawing:
    """Draw ``tl`` into ``path`` (default ``RUN_DIR/timeline.png``) and say what was drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path) if path is not None else Path(tl.run_dir) / "timeline.png"
    spans = iteration_spans(tl)
    if len(spans) > LONG_RUN_ITERATIONS and tl.t0 is not None and tl.end is not None and tl.bars:
        return _draw_long_run(tl, spans, out, title, max(1, detail_iterations))
    n = max(1, len(tl.world))
    fig, ax = plt.subplots(figsize=(14, 2.2 + min(0.34 * n, 0.11 * n + 3.2)))
    _draw_gantt(ax, tl, title)
    _save(fig, out)
    return GanttDrawing(out, "single", ["gantt"], len(spans))


def _draw_gantt(ax: Any, tl: RunTimeline, title: str | None) -> None:
    """The Gantt chart of ``tl`` on ``ax``: x = seconds since the run's epoch 0 (``tl.origin``, else
    ``tl.t0``), from ``tl.t0`` to ``tl.end``."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    n = max(1, len(tl.world))
    if tl.t0 is None or tl.end is None or not tl.bars:
        ax.text(0.5, 0.5, "no epoch acknowledged yet: nothing to draw", ha="center", va="center",
                transform=ax.transAxes)
        return
    t0 = tl.origin if tl.origin is not None else tl.t0  # x = 0
    lo, span = tl.t0 - t0, max(tl.end - tl.t0, 1e-9)  # the x range drawn: lo .. lo + span
    height = 0.8 if n <= 16 else 0.9
    has_spans = any(tl.spans.values())
    busy_of = {r: rank_intervals(tl, r, BUSY_KINDS) for r in tl.world}
    # One collection per (rank, role): fast with thousands of epochs or spans.
    held: dict[tuple[int, str], list[tuple[float, float]]] = {}
    worked: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for bar in tl.bars:
        if bar.end <= bar.start:
            continue
        held.setdefault((bar.rank, bar.label), []).append((bar.start - t0, bar.end - bar.start))
        if bar.open:
            ax.barh(bar.rank, bar.end - bar.start, left=bar.start - t0, height=height, fill=False, edgecolor="black",
                    linestyle="--", linewidth=0.6)
        i = max(0, bisect.bisect_right(busy_of[bar.rank], (bar.start, math.inf)) - 1)
        spans = busy_of[bar.rank]
        while i < len(spans) and spans[i][0] < bar.end:
            x, y = max(spans[i][0], bar.start), min(spans[i][1], bar.end)
            if y > x:
                worked.setdefault((bar.rank, bar.label), []).append((x - t0, y - x))
            i += 1
    for (rank, label), segments in held.items():
        ax.broken_barh(segments, (rank - height / 2, height), facecolors=COLOURS.get(label, MIXED_COLOUR),
                       alpha=0.28 if has_spans else 0.85, linewidth=0)
    for (rank, label), segments in worked.items():
        ax.broken_barh(segments, (rank - height / 2, height), facecolors=COLOURS.get(label, MIXED_COLOUR),
                       linewidth=0)
    for rank in tl.world:
        moved = [(x - t0, y - x) for x, y in rank_intervals(tl, rank, ("reshard",))]
        if moved:
            ax.broken_barh(moved, (rank - height / 2, height), facecolors="none", hatch="xxxx",
                           edgecolor="black", linewidth=0)
    many_epochs = len(tl.epochs) > MAX_EPOCH_LINES
    later = [e["published_at"] - t0 for e in tl.epochs if e["published_at"] > tl.t0]  # epoch 0 starts the chart
    if not many_epochs and later:
        ax.vlines(later, 0, 1, transform=ax.get_xaxis_transform(), colors="grey", linestyles=":", linewidth=0.8,
                  zorder=0)
    if tl.gates:
        ax.vlines([t - t0 for _, t in tl.gates], 0, 1, transform=ax.get_xaxis_transform(), colors="black",
                  linewidth=1.3 if len(tl.gates) <= 40 else 0.4, zorder=4)
    every = max(1, math.ceil(len(tl.gates) / 16))  # at most ~16 gate labels
    for i, (k, t) in enumerate(tl.gates):
        last = tl.iterations is not None and k >= tl.iterations
        if i % every and not last:
            continue
        ax.text(t - t0, 1.0, f" {'end' if last else f'it {k}'}", transform=ax.get_xaxis_transform(), ha="left",
                va="bottom", fontsize=8, fontweight="bold")
    _annotate_reshards(ax, tl, t0, lo, span, n)
    _annotate_migrations(ax, tl, t0, n)
    step = 1 if n <= 16 else (4 if n <= 64 else 8)
    ax.set_yticks(list(range(0, n, step)), [f"rank {r}" for r in range(0, n, step)], fontsize=8)
    ax.set_ylim(n - 0.5, -0.5 - header_rows(n))
    ax.set_xlim(lo - 0.01 * span, lo + span * 1.01)
    ax.set_xlabel("seconds since epoch 0 was published")
    ax.grid(axis="x", alpha=0.25)
    ax.set_axisbelow(True)
    present = sorted({b.label for b in tl.bars}, key=lambda x: (x == "idle", "+" in x,
                                                                COMPONENTS.index(x) if x in COMPONENTS else 9))
    handles: list[Any] = [Patch(color=COLOURS.get(lb, MIXED_COLOUR), label=lb) for lb in present]
    if has_spans:
        handles.append(Patch(facecolor="#1f77b4", alpha=0.28, label="role held, idle (bubble)"))
    handles.append(Patch(facecolor="white", hatch="xxxx", edgecolor="black", label="actor reshard"))
    handles.append(Line2D([], [], color="black", linewidth=1.3, label="iteration gate"))
    if not many_epochs:
        handles.append(Line2D([], [], color="grey", linestyle=":", label="epoch published"))
    if tl.migrations:
        handles.append(Line2D([], [], marker="<", color="crimson", linestyle="", label="requests migrated off"))
    if any(b.open for b in tl.bars):
        handles.append(Patch(facecolor="white", edgecolor="black", linestyle="--", label="still running"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    hidden = f"; {len(tl.epochs)} epochs: their lines left out" if many_epochs else ""
    name = Path(tl.run_dir).name
    if tl.origin is not None and title is None:  # a window of a run: which iterations
        its = [k for k, _, _ in iteration_spans(tl)]
        name += f", iterations {its[0]}-{its[-1]}" if its else ""
    ax.set_title(title or f"placement timeline of {name} ({len(tl.epochs)} epochs, "
                          f"{len(tl.gates)} gates, {len(tl.world)} ranks, state {tl.state}{hidden})", fontsize=10,
                 pad=16)


def per_iteration_roles(tl: RunTimeline, spans: list[tuple[int, float, float]]) -> dict[int, list[tuple[str, float]]]:
    """Per rank, per iteration of ``spans``: the role label it held longest in that iteration
    (``""``: none) and the share of the iteration it was busy."""
    busy_of = {r: rank_intervals(tl, r, BUSY_KINDS) for r in tl.world}
    out: dict[int, list[tuple[str, float]]] = {}
    for rank in tl.world:
        bars = sorted((b for b in tl.bars if b.rank == rank and b.end > b.start), key=lambda b: b.start)
        starts = [b.start for b in bars]
        row = []
        for _, a, z in spans:
            held: dict[str, float] = {}
            i = max(0, bisect.bisect_right(starts, a) - 1)
            while i < len(bars) and bars[i].start < z:
                part = min(bars[i].end, z) - max(bars[i].start, a)
                if part > 0:
                    held[bars[i].label] = held.get(bars[i].label, 0.0) + part
                i += 1
            label = max(held.items(), key=lambda kv: kv[1])[0] if held else ""
            row.append((label, overlap(busy_of[rank], a, z) / (z - a) if z > a else 0.0))
        out[rank] = row
    return out


def per_iteration_actor_ranks(tl: RunTimeline, spans: list[tuple[int, float, float]]) -> tuple[list[int], list[int]]:
    """Per iteration of ``spans``: the most actor ranks at once (from the epochs in force) and the
    number of placement changes (epochs published during it)."""
    epochs = sorted(tl.epochs, key=lambda e: e["published_at"])
    times = [e["published_at"] for e in epochs]
    most, changes = [], []
    for _, a, z in spans:
        i = max(0, bisect.bisect_right(times, a) - 1)
        sizes = [len(epochs[i]["placement"].get("actor", []))] if epochs else [0]
        i += 1
        n = 0
        while i < len(epochs) and times[i] < z:
            sizes.append(len(epochs[i]["placement"].get("actor", [])))
            i += 1
            n += 1
        most.append(max(sizes))
        changes.append(n)
    return most, changes


def _draw_long_run(tl: RunTimeline, spans: list[tuple[int, float, float]], out: Path, title: str | None,
                   detail_iterations: int) -> GanttDrawing:
    """A long run: per iteration, which role each rank held most of it (pale: idle in it) and how
    long it took with the actor's size; below, the Gantt chart of the last ``detail_iterations``."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import to_rgb
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    n = max(1, len(tl.world))
    ks = [k for k, _, _ in spans]
    first, stop = spans[-min(detail_iterations, len(spans))][0], spans[-1][0] + 1
    detail = clip_timeline(tl, first, stop)
    strip_h, secs_h = min(max(0.9, 0.2 * n), 3.0), 1.5
    detail_h = 2.2 + min(0.34 * n, 0.11 * n + 3.2)
    fig = plt.figure(figsize=(14, strip_h + secs_h + detail_h + 1.4), layout="constrained")
    grid = fig.add_gridspec(3, 1, height_ratios=[strip_h, secs_h, detail_h])
    ax_roles = fig.add_subplot(grid[0])
    ax_secs = fig.add_subplot(grid[1], sharex=ax_roles)
    ax_detail = fig.add_subplot(grid[2])

    # Which role each rank held most of each iteration; the paler, the more of it idle.
    has_spans = any(tl.spans.values())
    roles = per_iteration_roles(tl, spans)
    k0, k1 = min(ks), max(ks)
    image = np.ones((n, k1 - k0 + 1, 4))
    for row, rank in enumerate(tl.world):
        for k, (label, busy) in zip(ks, roles[rank]):
            if label:
                alpha = 0.35 + 0.65 * min(1.0, busy) if has_spans else 0.85
                image[row, k - k0] = (*to_rgb(COLOURS.get(label, MIXED_COLOUR)), alpha)
    ax_roles.imshow(image, aspect="auto", interpolation="nearest", extent=(k0 - 0.5, k1 + 0.5, n - 0.5, -0.5))
    step = 1 if n <= 8 else max(1, n // 8)
    ax_roles.set_yticks(list(range(0, n, step)), [f"rank {tl.world[r]}" for r in range(0, n, step)], fontsize=8)
    ax_roles.set_title(f"every iteration ({len(spans)}): the role each rank held most of it"
                       + (" (paler = idle longer: bubble)" if has_spans else ""), fontsize=9, loc="left")
    ax_roles.tick_params(labelbottom=False)
    present = sorted({lb for row in roles.values() for lb, _ in row if lb},
                     key=lambda x: (x == "idle", "+" in x, COMPONENTS.index(x) if x in COMPONENTS else 9))
    ax_roles.legend(handles=[Patch(color=COLOURS.get(lb, MIXED_COLOUR), label=lb) for lb in present],
                    loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)

    # How long each iteration took, and the actor's size in it.
    seconds = [z - a for _, a, z in spans]
    ax_secs.bar(ks, seconds, width=1.0, color="#777777", linewidth=0)
    ax_secs.set_ylabel("seconds", fontsize=8)
    ax_secs.set_xlabel("iteration", fontsize=8)
    ax_secs.grid(axis="y", alpha=0.25)
    ax_secs.set_xlim(k0 - 0.5, k1 + 0.5)
    actor, changes = per_iteration_actor_ranks(tl, spans)
    ax_actor = ax_secs.twinx()
    ax_actor.step(ks, actor, where="mid", color=COLOURS["actor"], linewidth=1.2)
    ax_actor.scatter(ks, changes, s=4, color="crimson", linewidths=0, zorder=3)
    ax_actor.set_ylim(0, max(actor + changes + [1]) * 1.15)
    ax_actor.set_ylabel("count", fontsize=8)
    ax_actor.tick_params(axis="y", labelsize=7)
    ax_secs.set_title("seconds per iteration (release to release), the most actor ranks at once in it, and its "
                      "placement changes", fontsize=9, loc="left")
    ax_secs.legend(handles=[Patch(color="#777777", label="seconds"),
                            Line2D([], [], color=COLOURS["actor"], label="actor ranks (most)"),
                            Line2D([], [], marker="o", markersize=3, color="crimson", linestyle="",
                                   label="placement changes")],
                   loc="upper left", bbox_to_anchor=(1.04, 1.0), fontsize=8, frameon=False)
    for ax in (ax_roles, ax_secs):  # where the detail below is
        ax.axvspan(first - 0.5, stop - 0.5, facecolor="none", edgecolor="black", linewidth=1.2, zorder=5)
    ax_roles.text(first - 0.5, -0.5, f"detail below: {first}-{stop - 1} ", ha="right", va="bottom", fontsize=8)

    _draw_gantt(ax_detail, detail, f"the last {stop - first} iterations in detail: {first}-{stop - 1} "
                                   f"({len(detail.epochs)} epochs)")
    name = Path(tl.run_dir).name + (f", iterations {k0}-{k1}" if tl.origin is not None else "")  # a window
    fig.suptitle(title or f"placement timeline of {name} ({len(spans)} iterations, "
                          f"{len(tl.epochs)} epochs, {len(tl.world)} ranks, state {tl.state})", fontsize=11)
    _save(fig, out, tight=False)
    return GanttDrawing(out, "overview+detail", ["roles per iteration", "seconds per iteration", "gantt"],
                        len(spans), (first, stop))


def header_rows(n: int) -> float:
    """Height (in rank rows) of the band above rank 0 that holds the reshard labels."""
    return 2.0 if n <= 16 else 0.075 * n


def _annotate_reshards(ax: Any, tl: RunTimeline, t0: float, lo: float, span: float, n: int) -> None:
    """Name each reshard (actor ranks old -> new, bytes, seconds) in the band above the ranks, in two
    staggered lanes; a label that would overlap both lanes is left out (the hatching still shows it)."""
    from slurm_rl.inspect.epoch_log import _human_bytes

    band = header_rows(n)
    if len(tl.reshards) > MAX_RESHARD_LABELS:  # one line for all of them: labels would only crowd
        total = sum(r["bytes"] for r in tl.reshards)
        seconds = sorted(r["seconds"] for r in tl.reshards)
        ax.text(lo, -0.5 - 0.5 * band, f" {len(tl.reshards)} actor reshards (hatched): median "
                f"{seconds[len(seconds) // 2]:.3f}s, max {seconds[-1]:.3f}s, {_human_bytes(total)} moved in all",
                fontsize=8, ha="left", va="center", zorder=6,
                bbox={"boxstyle": "square,pad=0.15", "facecolor": "white", "alpha": 0.9, "linewidth": 0})
        return
    width = 0.085 * span  # about the width of a label at this font size
    lanes: list[list[tuple[float, float]]] = [[], []]  # extents taken in each lane
    for r in tl.reshards:
        x = r["start"] - t0
        right = x > lo + span - width  # near the right edge the label runs leftwards (the legend is there)
        extent = (x - width, x) if right else (x, x + width)
        lane = next((i for i, taken in enumerate(lanes)
                     if all(extent[1] <= a or extent[0] >= b for a, b in taken)), None)
        if lane is None:
            continue  # no room: the hatching still shows the reshard
        lanes[lane].append(extent)
        y = -0.5 - band + (0.05 + 0.5 * lane) * band
        moved = f"{_human_bytes(r['bytes'])}, {r['seconds']:.2f}s" if r["bytes"] else "no transfer"
        text = f"actor {len(r.get('old') or [])}→{len(r.get('new') or [])} ranks\n{moved}"
        ax.plot([x, x], [y, -0.5], color="black", linewidth=0.6, zorder=5)
        ax.text(x, y, (text + " ") if right else (" " + text), fontsize=7, ha="right" if right else "left", va="top",
                zorder=6, multialignment="left",
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "alpha": 0.85, "linewidth": 0})


def _annotate_migrations(ax: Any, tl: RunTimeline, t0: float, n: int) -> None:
    """A marker where a rollout rank handed back requests; the count beside it (totals per epoch at 64)."""
    if not tl.migrations:
        return
    ax.scatter([m["at"] - t0 for m in tl.migrations], [m["rank"] for m in tl.migrations], marker="<", s=18 if n > 16 else 30,
               color="crimson", zorder=6)
    if len(tl.migrations) > MAX_MIGRATION_LABELS:
        return  # markers only: that many labels would cover the bars
    if n <= 16:
        last: dict[int, float] = {}
        for m in sorted(tl.migrations, key=lambda m: m["at"]):
            if m["at"] - last.get(m["rank"], -math.inf) < 0.06 * (tl.end - tl.t0 if tl.end and tl.t0 else 1.0):
                continue  # the previous label on this rank is still there
            last[m["rank"]] = m["at"]
            ax.annotate(f"{m['requests']} req", (m["at"] - t0, m["rank"]), xytext=(5, 0), textcoords="offset points",
                        fontsize=7, color="crimson", va="center", ha="left", zorder=6,
                    bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "alpha": 0.8, "linewidth": 0})
        return
    per_epoch: dict[int, list[dict[str, Any]]] = {}
    for m in tl.migrations:
        per_epoch.setdefault(m["epoch"], []).append(m)
    for ms in per_epoch.values():
        at = min(m["at"] for m in ms) - t0
        y = min(m["rank"] for m in ms)
        ax.text(at, y - 0.8, f" {sum(m['requests'] for m in ms)} req migrated", fontsize=7, color="crimson",
                ha="left", va="bottom", zorder=6,
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "alpha": 0.8, "linewidth": 0})


def _save(fig: Any, out: Path, tight: bool = True) -> None:
    import matplotlib.pyplot as plt

    if tight:
        fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
