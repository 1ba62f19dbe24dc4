#!/usr/bin/env python3
"""Time of one placement decision against live groups, as JSON.

The live groups are those the ``mux`` policy of ``tools/bench_mux.py`` formed on its trace (seed 0,
200 jobs): every group with every job it ever held, all live at once (200 jobs in total), and the
same set ten times over (2,000 jobs, jobs and groups renamed). Each decision places one arriving
job of another trace (seed 1; the first decision fills each profile's memo of its rollout
seconds per slot count) with :func:`~slurm_rl.mux.admission.place` and
:func:`~slurm_rl.mux.admission.place_hybrid` (both schedules), as the live placer
(``slurm-rl mux place``) would, each group predicted under each schedule; figures are per
decision: mean, p50, max over the arrivals.

    python tools/bench_placer.py [--arrivals 10] [--copies 1,10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

from slurm_rl.mux.admission import ClusterSpec, place, place_hybrid
from slurm_rl.mux.cluster_sim import run_mux, solo_results, solo_seconds
from slurm_rl.mux.model import ColocatedModel, GroupModel, JobProfile, Pools
from slurm_rl.mux.trace import TraceSpec, generate

CLUSTER = ClusterSpec(slo_check="both", cost_basis="lifetime")  # bench_mux's ``mux`` variant


def live_groups(jobs: list[JobProfile], copies: int, cluster: ClusterSpec) -> list[GroupModel]:
    """The groups mux formed on ``jobs``, each with all the jobs it held, ``copies`` times."""
    secs = solo_seconds(solo_results(jobs))
    res = run_mux(jobs, secs, cluster)
    by_name = {j.name: j for j in jobs}
    members: dict[int, list[JobProfile]] = {}
    for name, o in sorted(res.jobs.items(), key=lambda kv: kv[1].arrival_s):
        if o.group is not None:
            members.setdefault(o.group, []).append(by_name[name])
    rows = {g["gid"]: g for g in res.groups}
    out = []
    for c in range(copies):
        for gid, ms in sorted(members.items()):
            pools = Pools(tuple(range(rows[gid]["rollout_slots"])), tuple(range(rows[gid]["train_slots"])),
                          cluster.gpus_per_slot, cluster.host_bytes_per_slot)
            renamed = tuple(replace(m, name=f"{m.name}.{c}") for m in ms)
            out.append(GroupModel(pools=pools, members=renamed, gid=c * 10_000 + gid, schedule=cluster.schedule))
    return out


def time_decisions(fn, arrivals: list[JobProfile], groups: list[GroupModel]) -> dict[str, Any]:
    times, kinds = [], {}
    for job in arrivals:
        t0 = time.perf_counter()
        d = fn(job, groups)
        times.append(time.perf_counter() - t0)
        kinds[d.kind] = kinds.get(d.kind, 0) + 1
    times.sort()
    return {"mean_s": round(statistics.mean(times), 4), "p50_s": round(times[len(times) // 2], 4),
            "max_s": round(times[-1], 4), "decisions": kinds}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arrivals", type=int, default=10)
    ap.add_argument("--copies", default="1,10", help="comma-separated copies of the 200-job group set")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    jobs = generate(TraceSpec(jobs=200, seed=0))
    arrivals = generate(TraceSpec(jobs=args.arrivals, seed=1))
    colocated = ColocatedModel()
    out: dict[str, Any] = {"target": {"jobs_200_s": 1.0, "rollmux_2000_jobs_s": 0.591}, "runs": []}
    formed = live_groups(jobs, 1, CLUSTER)  # the groups mux formed (round-robin), predicted under each schedule
    base = {s: [replace(g, schedule=s) for g in formed] for s in ("round_robin", "work_conserving")}
    for copies in (int(c) for c in args.copies.split(",")):
        for schedule in ("round_robin", "work_conserving"):
            cluster = replace(CLUSTER, schedule=schedule)
            groups = [replace(g, members=tuple(replace(m, name=f"{m.name.rsplit('.', 1)[0]}.{c}") for m in g.members),
                              gid=c * 10_000 + g.gid) for c in range(copies) for g in base[schedule]]
            row = {"schedule": schedule, "groups": len(groups), "jobs": sum(len(g.members) for g in groups),
                   "place": time_decisions(lambda j, gs: place(j, gs, cluster), arrivals, groups),
                   "place_hybrid": time_decisions(lambda j, gs: place_hybrid(j, gs, cluster, colocated),
                                                  arrivals, groups)}
            out["runs"].append(row)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
