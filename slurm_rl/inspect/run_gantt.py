"""The placement timeline of one run as a Gantt chart: PNG (matplotlib) and compact text.

Rows are ranks, the x axis is seconds since epoch 0 was published. A rank's bar has the colour of
the role it held (pale where it held the role but did nothing: the bubble; full where an activity
span says it worked), black hatching where the actor's state was resharded. Dotted lines mark
epochs, solid lines the iteration gates; arrows name the requests migrated off a released
rollout rank. The text version collapses ranks whose rows are identical, so it stays short at 64.
"""

from __future__ import annotations

import bisect
import math
import os
from pathlib import Path
from typing import Any

from slurm_rl.inspect.run_timeline import BUSY_KINDS, RunTimeline, overlap, rank_intervals
from slurm_rl.placement import COMPONENTS

TEXT_COLUMNS = 72
LETTERS = {"actor": "A", "rollout": "R", "inference": "I"}
COLOURS = {"actor": "#1f77b4", "rollout": "#2ca02c", "inference": "#ff7f0e", "idle": "#bbbbbb"}
MIXED_COLOUR = "#9467bd"
MAX_EPOCH_LINES = 120  # more epoch lines than this would grey the whole chart
MAX_MIGRATION_LABELS = 40
MAX_RESHARD_LABELS = 16


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
    for c in range(0, columns + 1, 18):
        for n, ch in enumerate(f"^{c * width:.0f}s"):
            if c + n < len(labels):
                labels[c + n] = ch
    out.append(f"  {'':>12}  {''.join(labels).rstrip()}")
    return out


def gantt_legend_text(tl: RunTimeline, columns: int = TEXT_COLUMNS) -> str:
    width = (tl.end - tl.t0) / columns if tl.t0 is not None and tl.end is not None else 0.0
    return (f"  placement timeline, 1 column = {width:.2f}s: A actor, R rollout, I inference, C collocated, . no role\n"
            f"  (lower case = holding the role idle: bubble; # = actor reshard; digit or | = iteration gate, ' = epoch)")


def write_run_gantt(tl: RunTimeline, path: str | os.PathLike[str] | None = None, title: str | None = None) -> Path:
    """Draw ``tl`` as a Gantt PNG (default ``RUN_DIR/timeline.png``); needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    out = Path(path) if path is not None else Path(tl.run_dir) / "timeline.png"
    n = max(1, len(tl.world))
    fig, ax = plt.subplots(figsize=(14, 2.2 + min(0.34 * n, 0.11 * n + 3.2)))
    if tl.t0 is None or tl.end is None or not tl.bars:
        ax.text(0.5, 0.5, "no epoch acknowledged yet: nothing to draw", ha="center", va="center",
                transform=ax.transAxes)
        _save(fig, out)
        return out
    t0, span = tl.t0, max(tl.end - tl.t0, 1e-9)
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
    if not many_epochs and len(tl.epochs) > 1:
        ax.vlines([e["published_at"] - t0 for e in tl.epochs[1:]], 0, 1, transform=ax.get_xaxis_transform(),
                  colors="grey", linestyles=":", linewidth=0.8, zorder=0)
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
    _annotate_reshards(ax, tl, t0, span, n)
    _annotate_migrations(ax, tl, t0, n)
    step = 1 if n <= 16 else (4 if n <= 64 else 8)
    ax.set_yticks(list(range(0, n, step)), [f"rank {r}" for r in range(0, n, step)], fontsize=8)
    ax.set_ylim(n - 0.5, -0.5 - header_rows(n))
    ax.set_xlim(-0.01 * span, span * 1.01)
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
    ax.set_title(title or f"placement timeline of {Path(tl.run_dir).name} ({len(tl.epochs)} epochs, "
                          f"{len(tl.gates)} gates, {len(tl.world)} ranks, state {tl.state}{hidden})", fontsize=10,
                 pad=16)
    _save(fig, out)
    return out


def header_rows(n: int) -> float:
    """Height (in rank rows) of the band above rank 0 that holds the reshard labels."""
    return 2.0 if n <= 16 else 0.075 * n


def _annotate_reshards(ax: Any, tl: RunTimeline, t0: float, span: float, n: int) -> None:
    """Name each reshard (actor ranks old -> new, bytes, seconds) in the band above the ranks, in two
    staggered lanes; a label that would overlap both lanes is left out (the hatching still shows it)."""
    from slurm_rl.inspect.epoch_log import _human_bytes

    band = header_rows(n)
    if len(tl.reshards) > MAX_RESHARD_LABELS:  # one line for all of them: labels would only crowd
        total = sum(r["bytes"] for r in tl.reshards)
        seconds = sorted(r["seconds"] for r in tl.reshards)
        ax.text(0.0, -0.5 - 0.5 * band, f" {len(tl.reshards)} actor reshards (hatched): median "
                f"{seconds[len(seconds) // 2]:.3f}s, max {seconds[-1]:.3f}s, {_human_bytes(total)} moved in all",
                fontsize=8, ha="left", va="center", zorder=6,
                bbox={"boxstyle": "square,pad=0.15", "facecolor": "white", "alpha": 0.9, "linewidth": 0})
        return
    width = 0.085 * span  # about the width of a label at this font size
    lanes: list[list[tuple[float, float]]] = [[], []]  # extents taken in each lane
    for r in tl.reshards:
        x = r["start"] - t0
        right = x > span - width  # near the right edge the label runs leftwards (the legend is there)
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


def _save(fig: Any, out: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
