"""Two runs side by side (e.g. ``static`` vs ``auto``): seconds per iteration, GPU-seconds per
component, bubbles, switch figures, and one PNG with both reward curves and both timings."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from slurm_rl.inspect.summary import run_report_json
from slurm_rl.placement import COMPONENTS


def compare_json(run_a: str | Path, run_b: str | Path) -> dict[str, Any]:
    """Both runs' figures (``a``, ``b``) and ``missing`` of each."""
    out: dict[str, Any] = {}
    for key, run in (("a", run_a), ("b", run_b)):
        r = run_report_json(run)
        comps = r["components"]
        out[key] = {
            "run_dir": r["run_dir"], "facts": r["facts"], "components": comps,
            "bubble_s": None if any(c["bubble_s"] is None for c in comps.values())
            else sum(c["bubble_s"] for c in comps.values()),
            "held_s": sum(c["held_s"] for c in comps.values()),
            "seconds_per_iteration": [row.get("seconds") for row in r["metrics"]],
            "reward": [row.get("reward_mean") for row in r["metrics"]],
            "switch": r["switch"], "missing": r["missing"],
        }
    return out


def _f(value: Any, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def format_compare(doc: dict[str, Any]) -> str:
    """The comparison as a text table: one column per run."""
    a, b = doc["a"], doc["b"]
    name = lambda r: f"{Path(r['run_dir']).name} ({r['facts'].get('policy', '?')})"  # noqa: E731
    w = max(24, len(name(a)), len(name(b)))
    lines = [f"  {'':<26} {name(a):>{w}} {name(b):>{w}}"]

    def row(label: str, va: Any, vb: Any, fmt: str = "{:.1f}") -> None:
        lines.append(f"  {label:<26} {_f(va, fmt):>{w}} {_f(vb, fmt):>{w}}")

    fa, fb = a["facts"], b["facts"]
    lines.append(f"  {'state':<26} {fa['state']:>{w}} {fb['state']:>{w}}")
    row("iterations done", fa["iterations_done"], fb["iterations_done"], "{}")
    row("seconds per iteration", fa["s_per_iteration"], fb["s_per_iteration"], "{:.2f}")
    row("training seconds", fa["train_s"], fb["train_s"], "{:.1f}")
    row("epochs", fa["epochs"], fb["epochs"], "{}")
    for label in sorted(set(a["components"]) | set(b["components"]),
                        key=lambda x: (x == "idle", "+" in x, COMPONENTS.index(x)
                                       if x in COMPONENTS else 9)):
        ca, cb = a["components"].get(label, {}), b["components"].get(label, {})
        row(f"{label} GPU-s held", ca.get("held_s"), cb.get("held_s"))
        if label != "idle":  # a rank without a role does no work
            row(f"{label} GPU-s busy", ca.get("busy_s"), cb.get("busy_s"))
        row(f"{label} bubble GPU-s", ca.get("bubble_s"), cb.get("bubble_s"))
    row("bubble GPU-s, all", a["bubble_s"], b["bubble_s"])
    row("switch latency p50 s", a["switch"]["latency_s"]["p50"], b["switch"]["latency_s"]["p50"], "{:.3f}")
    row("requests migrated", a["switch"]["migrated_requests"], b["switch"]["migrated_requests"], "{}")
    last = lambda xs: next((x for x in reversed(xs) if x is not None), None)  # noqa: E731
    row("last mean reward", last(a["reward"]), last(b["reward"]), "{:.3f}")
    for key in ("a", "b"):
        for m in doc[key]["missing"]:
            lines.append(f"  ! {Path(doc[key]['run_dir']).name}: {m}")
    return "\n".join(lines)


def write_compare_png(doc: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Reward curves, seconds per iteration, and GPU-seconds per component (busy / reshard / bubble)
    of both runs in one figure; needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(path)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    names = {k: f"{Path(doc[k]['run_dir']).name} ({doc[k]['facts'].get('policy', '?')})" for k in ("a", "b")}
    colours = {"a": "#7f7f7f", "b": "#d62728"}
    for ax, key, title in ((axes[0], "reward", "mean reward per iteration"),
                           (axes[1], "seconds_per_iteration", "seconds per iteration")):
        for k in ("a", "b"):
            pts = [(i, v) for i, v in enumerate(doc[k][key]) if v is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, color=colours[k], label=names[k])
        ax.set_title(title, fontsize=10)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("iteration")
        if key == "seconds_per_iteration":
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[2]
    labels = [lb for lb in COMPONENTS if lb in doc["a"]["components"] or lb in doc["b"]["components"]]
    labels += sorted((set(doc["a"]["components"]) | set(doc["b"]["components"])) - set(labels))
    width = 0.38
    for i, k in enumerate(("a", "b")):
        xs = [j + (i - 0.5) * width for j in range(len(labels))]
        comps = [doc[k]["components"].get(lb, {}) for lb in labels]
        busy = [c.get("busy_s") or 0.0 for c in comps]
        switch = [c.get("switch_s") or 0.0 for c in comps]
        bubble = [c.get("bubble_s") if c.get("bubble_s") is not None else c.get("held_s", 0.0) for c in comps]
        ax.bar(xs, busy, width, color=colours[k], label=f"{names[k]}: busy")
        ax.bar(xs, switch, width, bottom=busy, color="black")
        ax.bar(xs, bubble, width, bottom=[b + s for b, s in zip(busy, switch)], color=colours[k], alpha=0.3,
               hatch="//", edgecolor="white", label=f"{names[k]}: bubble (idle)")
        for x, c in zip(xs, comps):
            if c.get("held_s"):
                ax.text(x, c["held_s"], f"{c['held_s']:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("GPU-seconds in the training window")
    ax.set_title("GPU-seconds per component: busy / reshard (black) / bubble", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    fig.suptitle(f"{names['a']}  vs  {names['b']}", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
