"""A cluster directory on one screen: its groups and the placer's decisions (``slurm-rl inspect CLUSTER_DIR``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from slurm_rl.mux.live import PLACEMENTS_FILE, read_cluster, read_placements


def is_cluster_dir(path: Path) -> bool:
    """A directory a placer wrote to (it holds ``placements.jsonl``)."""
    return (Path(path) / PLACEMENTS_FILE).is_file()


def cluster_report_json(cluster_dir: str | Path) -> dict[str, Any]:
    """The groups (state, GPUs, members in the rotation, Slurm job) and every placement decision."""
    root = Path(cluster_dir)
    groups = read_cluster(root, profiles=False)
    return {
        "cluster_dir": str(root),
        "groups": [{"name": g.name, "state": g.state, "why": g.why, "gpus": g.gpus, "colocated": g.colocated,
                    "pools": {p: list(s) for p, s in g.pools.items()}, "members": [m.name for m in g.members],
                    "out": dict(g.out), "sbatch_job": g.sbatch_job} for g in groups],
        "held_gpus": sum(g.gpus for g in groups if g.holds_gpus),
        "placements": read_placements(root),
    }


def _clip(text: Any, width: int) -> str:
    s = "" if text is None else str(text)
    return s if len(s) <= width else s[:width - 1] + "…"


def cluster_report(cluster_dir: str | Path, reason_width: int = 70) -> str:
    """Text: a table of the groups, then one row per placement (time, job, kind, group, decision ms, reason)."""
    doc = cluster_report_json(cluster_dir)
    lines = [f"cluster dir {doc['cluster_dir']}: {len(doc['groups'])} groups, {doc['held_gpus']} GPUs held", ""]
    lines.append(f"{'group':<22} {'state':<9} {'gpus':>4}  {'slurm job':<10} members")
    for g in doc["groups"]:
        members = ", ".join(g["members"]) or "-"
        if g["out"]:
            members += f" (out: {', '.join(sorted(g['out']))})"
        lines.append(f"{_clip(g['name'], 22):<22} {g['state']:<9} {g['gpus']:>4}  {g['sbatch_job'] or '-':<10} {members}")
    lines += ["", f"{'time':<19} {'job':<16} {'kind':<9} {'group':<14} {'ms':>8}  reason"]
    for r in doc["placements"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(r.get("time", 0.0))))
        act = r.get("action") or {}
        kind = r.get("kind", "?") + ("!" if act.get("error") else "")
        lines.append(f"{when:<19} {_clip(r.get('job'), 16):<16} {kind:<9} {_clip(r.get('group') or '-', 14):<14} "
                     f"{float(r.get('decision_ms', 0.0)):>8.1f}  {_clip(r.get('reason'), reason_width)}")
        if act.get("sbatch_job"):
            lines.append(f"{'':<19} {'':<16} submitted as Slurm job {act['sbatch_job']}")
        if act.get("error"):
            lines.append(f"{'':<19} {'':<16} failed: {_clip(act['error'], reason_width + 20)}")
    if not doc["placements"]:
        lines.append("(no placements)")
    return "\n".join(lines)
