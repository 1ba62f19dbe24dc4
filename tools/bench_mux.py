#!/usr/bin/env python3
"""Multiplexing benchmark: a generated trace of RL jobs under solo / colocated / mux, as JSON.

The trace (``slurm_rl.mux.trace``): Poisson arrivals, reasoning / agentic (rollout-heavy,
long tails), rlhf (training-heavy) and balanced jobs of 7B-70B models, SLOs ~ U(1, 2). Policies
(``slurm_rl.mux.cluster_sim``):

* ``solo``: every job its own H20 rollout pool and H800 training pool;
* ``colocated``: every job rollout and training one after the other on its H800s;
* ``mux``: co-execution groups, admission with the SLO checked on max-length *and* expected
  phase times, candidates compared by added cost over the group's expected life;
* ``mux_rollmux``: groups as RollMux builds them: members pinned to rollout slots of their own
  (members on disjoint slots roll out at once), a newcomer placed direct (no added GPUs: Delta = 0,
  preferred whenever admissible), scaled (rollout slots added for it) or new, the SLO checked as
  in ``mux``; ``mux_delta``: Delta = 0 without pinning (one rollout at a time, scaling adds slots to
  the shared pool);
* ``mux_no_tail``: the same without long-tail migration (ablation);
* ``mux_rollmux_check``: ``mux_rollmux`` with the SLO checked as RollMux describes it (max-length
  phase times only);
* ``hybrid``: mux, but a job no group admits runs co-located when the cost model predicts that
  cheaper than a group of its own (or a new group is refused) — ``admission.place_hybrid``;
* ``mux_wc`` / ``hybrid_wc``: the same with the work-conserving rotation (admission predicts with
  it); ``mux_wc_rr_admitted``: groups run work-conserving but admitted on round-robin predictions
  (ablation: what the schedule does to SLOs the placer did not predict with it).

``hybrid_breakdown`` says what reaches RollMux's 1.38x over co-located and what does not (cost and
efficiency of lone groups, shared groups and co-located jobs against the same jobs co-located),
``schedule_pairs`` when work-conserving beats round-robin and when it breaks an SLO (one pair of
representative jobs of two types in one group, under both schedules).

Cost efficiency = useful job-hours (each job's solo duration) per unit of cost (GPU-hours x
relative price: H20 1.0, H800 2.85). When mux falls short of RollMux's figures (1.84x solo,
1.38x colocated, 100 % SLO attainment), ``breakdown`` gives the simulator's own reasons.

``--trace weave``: the trace from the RollMux paper's statistics (``slurm_rl.mux.trace_weave``) under
the paper's baselines (Solo-D, veRL co-located on H800, Gavel+ as read here) and ``mux``,
``mux_rollmux``, ``mux_delta``, ``mux_rollmux_check``, ``hybrid``: ratios, SLO attainment,
placement mix, $/h and the trace's statistics beside the paper's. ``--arrivals POLICY``: every
arrival's admission decision and binding constraint as a table.

    python tools/bench_mux.py [--trace default|weave] [--jobs 200] [--seeds 0] [--interarrival 900] [--slo 1,2]
                              [--tail-fraction 0.8] [--arrivals mux]
"""

from __future__ import annotations

import argparse
from pathlib import Path
import json
import statistics
import sys
import time
from typing import Any

from dataclasses import replace

from slurm_rl.mux.admission import ClusterSpec
from slurm_rl.mux.cluster_sim import (
    ColocatedModel,
    PolicyResult,
    efficiency_ratio,
    run_colocated,
    run_gavel_plus,
    run_mux,
    run_solo,
    solo_results,
    solo_seconds,
)
from slurm_rl.mux.group_sim import simulate_group
from slurm_rl.mux.model import GPU_PRICE, JobProfile, Pools
from slurm_rl.mux.trace import TraceSpec, generate
from slurm_rl.mux.trace_weave import USD_PER_GPU_HOUR, WeaveSpec, generate_weave, statistics_table

TARGET = {"mux/solo": 1.84, "mux/colocated": 1.38, "slo_attainment": 1.0}
MUX_VARIANTS = {
    "mux": dict(check="both", basis="lifetime", tail=True),
    "mux_rollmux": dict(check="both", basis="delta", tail=True, pin=True),
    "mux_delta": dict(check="both", basis="delta", tail=True),
    "mux_no_tail": dict(check="both", basis="lifetime", tail=False),
    "mux_rollmux_check": dict(check="conservative", basis="delta", tail=True, pin=True),
    "hybrid": dict(check="both", basis="lifetime", tail=True, hybrid=True),
    "mux_wc": dict(check="both", basis="lifetime", tail=True, schedule="work_conserving"),
    "hybrid_wc": dict(check="both", basis="lifetime", tail=True, hybrid=True, schedule="work_conserving"),
    "mux_wc_rr_admitted": dict(check="both", basis="lifetime", tail=True, schedule="round_robin",
                               run_schedule="work_conserving"),
}
TARGET_HYBRID = {"hybrid/colocated": 1.0, "hybrid/solo": 1.3, "slo_attainment": 1.0}
#: the weave trace: the paper's baselines, our mux (RollMux's order), the previous order, the paper's
#: SLO check alone, and the hybrid placer
WEAVE_VARIANTS = ("mux", "mux_rollmux", "mux_delta", "mux_rollmux_check", "hybrid")
#: [P]'s placement mix on its trace (share of arrivals)
PAPER_MIX = {"direct": 0.605, "scaled": 0.15, "new": 0.245}
PAPER_USD_PER_H = {"mux": 510.0, "solo": 940.0, "colocated": 710.0}


def _class_rows(res: PolicyResult, coloc: PolicyResult, jobs: dict[str, JobProfile]) -> dict[str, Any]:
    """Cost, useful job-hours and efficiency against the same jobs co-located, for lone groups
    (never two jobs at once), shared groups and co-located jobs of a mux/hybrid run."""
    peak = {g["gid"]: g["peak"] for g in res.groups}
    rows = {g["gid"]: g for g in res.groups}
    classes: dict[str, dict[str, Any]] = {c: {"jobs": 0, "cost": 0.0, "job_hours": 0.0, "colocated_cost": 0.0,
                                              "busy_cost": 0.0} for c in ("lone_groups", "shared_groups",
                                                                          "colocated_jobs")}
    seen: set[int] = set()
    price = 8 * GPU_PRICE["H800"] / 3600
    for name, o in res.jobs.items():
        if o.finish_s is None:
            continue
        c_out = coloc.jobs[name]
        c_cost = (c_out.finish_s - c_out.arrival_s) * jobs[name].train_slots * price
        if o.placement == "colocated":
            cls = classes["colocated_jobs"]
            cls["cost"] += c_cost
            cls["busy_cost"] += c_cost * res.extra.get("colocated_busy_fraction", 0.0)
        else:
            cls = classes["shared_groups" if peak[o.group] >= 2 else "lone_groups"]
            if o.group not in seen:
                seen.add(o.group)
                g = rows[o.group]
                wr, wt = g["rollout_slots"] * GPU_PRICE["H20"], g["train_slots"] * GPU_PRICE["H800"]
                cls["cost"] += g["cost"]
                cls["busy_cost"] += g["cost"] * (g["rollout_busy"] * wr + g["train_busy"] * wt) / (wr + wt)
        cls["jobs"] += 1
        cls["job_hours"] += o.solo_s / 3600
        cls["colocated_cost"] += c_cost
    total = sum(c["cost"] for c in classes.values()) or 1.0
    out = {}
    for k, c in classes.items():
        out[k] = {"jobs": c["jobs"], "cost_share": round(c["cost"] / total, 4),
                  "useful_job_hours": round(c["job_hours"], 1),
                  "cost_per_job_hour": round(c["cost"] / c["job_hours"], 3) if c["job_hours"] else None,
                  "vs_same_jobs_colocated": round(c["colocated_cost"] / c["cost"], 3) if c["cost"] else None,
                  "bubble_share_of_cost": round(1 - c["busy_cost"] / c["cost"], 3) if c["cost"] else None}
    return out


def hybrid_breakdown(res: dict[str, PolicyResult], jobs: list[JobProfile], secs: dict[str, float],
                     ratios: dict[str, float]) -> dict[str, Any]:
    """What reaches RollMux's 1.38x over co-located and what does not, from the runs' figures."""
    by_name = {j.name: j for j in jobs}
    coloc, solo = res["colocated"], res["solo"]
    price = 8 * GPU_PRICE["H800"] / 3600
    # per job, without any sharing: co-located where that keeps its SLO and is cheaper, else solo
    best = 0.0
    cheaper = 0
    for j in jobs:
        c = coloc.jobs[j.name]
        c_cost = (c.finish_s - c.arrival_s) * j.train_slots * price
        s_cost = secs[j.name] * 8 * (j.rollout_slots * GPU_PRICE["H20"] + j.train_slots * GPU_PRICE["H800"]) / 3600
        best += c_cost if c.slo_met and c_cost < s_cost else s_cost
        cheaper += c_cost < s_cost
    hy = res["hybrid"]
    classes = _class_rows(hy, coloc, by_name)
    lines = [
        f"hybrid {ratios['hybrid/colocated']:.2f}x co-located, {ratios['hybrid/solo']:.2f}x solo at "
        f"{hy.slo_attainment:.0%} SLO attainment; placement {dict(hy.placement_mix)}.",
        f"co-located jobs: {classes['colocated_jobs']['cost_share']:.0%} of hybrid's cost, at exactly co-located "
        f"efficiency (1.00x) by construction; co-location costs less than solo for "
        f"{cheaper} jobs but keeps the SLO of "
        f"{sum(o.slo_met for o in coloc.jobs.values())}/{len(jobs)}.",
        f"shared groups: {classes['shared_groups']['cost_share']:.0%} of the cost at "
        f"{classes['shared_groups']['vs_same_jobs_colocated']}x the efficiency of the same jobs co-located "
        f"(bubble {classes['shared_groups']['bubble_share_of_cost']} of their cost): sharing is the only part "
        f"that can beat co-location, and RollMux's 1.38x needs it on most of the work.",
        f"lone groups: {classes['lone_groups']['cost_share']:.0%} of the cost at "
        f"{classes['lone_groups']['vs_same_jobs_colocated']}x (bubble {classes['lone_groups']['bubble_share_of_cost']}"
        f" of their cost): jobs whose co-located slowdown breaks their SLO, or that a group of their own "
        f"serves cheaper; they pay the disaggregation bubble in full.",
        f"without sharing, the best per-job choice (co-located where cheaper and within the SLO, else "
        f"solo) reaches {coloc.cost / best:.3f}x co-located and {solo.cost / best:.3f}x solo: the ceiling of "
        f"placement alone. Mux on its own ({ratios['mux/colocated']:.2f}x co-located) leaves "
        f"{res['mux'].extra['cost_share_by_concurrent_jobs'].get('1', 0):.0%} of its cost in groups running one job; "
        f"with SLOs ~U(1,2) most candidate groups are turned down ({dict(res['mux'].rejected)}).",
    ]
    return {"classes": classes, "no_sharing_best_vs_colocated": round(coloc.cost / best, 3),
            "no_sharing_best_vs_solo": round(solo.cost / best, 3), "lines": lines}


def schedule_pairs(jobs: list[JobProfile], tail_fraction: float) -> list[dict[str, Any]]:
    """One representative job per type (median solo iteration, one node per pool), every pair and a
    few triples in one group on two rollout nodes (so the long tail migrates) and one training node, under round-robin and
    work-conserving: each member's slowdown, whether an SLO of 1.5 holds for all, and the group's
    cost efficiency against running its members solo."""
    reps: dict[str, JobProfile] = {}
    for kind in sorted({j.kind for j in jobs}):
        js = sorted((j for j in jobs if j.kind == kind and j.train_slots == 1 and j.rollout_slots == 1),
                    key=lambda j: j.solo_iteration_s())
        if js:
            reps[kind] = replace(js[len(js) // 2], arrival_s=0.0, slo=1.5, name=kind)
    kinds = sorted(reps)
    combos = [(a, b) for i, a in enumerate(kinds) for b in kinds[i:]]
    combos += [c for c in (("agentic", "rlhf", "rlhf"), ("reasoning", "rlhf", "rlhf"), ("balanced", "rlhf", "rlhf"),
                           ("reasoning", "balanced", "rlhf")) if all(k in reps for k in c)]
    out = []
    for combo in combos:
        members = [replace(reps[k], name=f"{k}{i}") for i, k in enumerate(combo)]
        row: dict[str, Any] = {"group": "+".join(combo)}
        for sched in ("round_robin", "work_conserving"):
            res = simulate_group(Pools((0, 1), (0,)), members, tail_fraction, record=False, schedule=sched)
            slows = {n: round(r.slowdown, 3) for n, r in res.jobs.items() if r.slowdown is not None}
            solo_h = sum(r.solo_s for r in res.jobs.values()) / 3600
            row[sched] = {"slowdown": slows, "slo_1.5_kept": all(v <= 1.5 + 1e-9 for v in slows.values()),
                          "vs_solo": round(solo_h / (res.makespan_s / 3600), 3)}
        out.append(row)
    return out


def trace_profile(jobs: list[JobProfile]) -> dict[str, Any]:
    """Per job type: count, phase seconds, rollout/training ratio, tail share, and how much the
    max-length (conservative) profile inflates each phase."""
    out: dict[str, Any] = {}
    for kind in sorted({j.kind for j in jobs}):
        js = [j for j in jobs if j.kind == kind]
        r = [j.expected_rollout_s() for j in js]
        t = [j.expected_train_s() for j in js]
        tail = [j.tail(0, 0.8)[1] / j.rollout_seconds(0) for j in js]
        out[kind] = {
            "jobs": len(js),
            "rollout_s": round(statistics.mean(r), 1), "train_s": round(statistics.mean(t), 1),
            "rollout_over_train": round(statistics.median(a / b for a, b in zip(r, t)), 2),
            "tail_share_of_rollout": round(statistics.mean(tail), 3),
            "conservative_rollout_x": round(statistics.mean(j.conservative_rollout_s() / x for j, x in zip(js, r)), 2),
            "conservative_train_x": round(statistics.mean(j.train_max_s / x for j, x in zip(js, t)), 2),
            "job_hours": round(sum(j.iterations * j.solo_iteration_s() for j in js) / 3600, 1),
        }
    return out


def breakdown(res: dict[str, PolicyResult], ratios: dict[str, float], profile: dict[str, Any]) -> list[str]:
    """Why mux lands where it does, from the simulation's own figures."""
    mux, solo, paper = res["mux"], res["solo"], res["mux_rollmux_check"]
    share = mux.extra.get("cost_share_by_concurrent_jobs", {})
    lines = [
        f"{share.get('1', 0.0):.0%} of mux's cost is spent on groups running one job (no member whose "
        f"SLO, cycle and residency fit was there when it arrived, or its partners had finished); "
        f"{share.get('2', 0.0):.0%} on two jobs, "
        f"{sum(v for k, v in share.items() if int(k) >= 3):.0%} on three or more.",
        f"H800 (training) busy {solo.busy_fraction('H800'):.0%} solo -> {mux.busy_fraction('H800'):.0%} mux; "
        f"H20 (rollout) busy {solo.busy_fraction('H20'):.0%} -> {mux.busy_fraction('H20'):.0%}. "
        f"H800s are {GPU_PRICE['H800'] / (1 + GPU_PRICE['H800']):.0%} of a 1:1 node pair's price, and most "
        f"job-hours are rollout-bound, so the expensive pool stays mostly idle unless training-heavy "
        f"partners of a similar cycle are present.",
        f"candidate groups turned down at admission: {dict(mux.rejected)} (slo: a member's slowdown "
        f"would exceed its SLO; train_pool: the group's training pool is smaller than the job's layout).",
        f"rollout slots that were decoding used {mux.extra.get('rollout_lane_fraction', 0):.0%} of their "
        f"request lanes (the long tail); tail migration gains {ratios['mux/mux_no_tail']:.2f}x in cost efficiency.",
    ]
    infl = {k: (v["conservative_rollout_x"], v["conservative_train_x"]) for k, v in profile.items()}
    lines.append(
        "max-length profiles inflate (rollout, training) by " +
        ", ".join(f"{k} {a:.1f}x/{b:.1f}x" for k, (a, b) in infl.items()) +
        f": unevenly across types, so RollMux's max-length-only SLO check admitted placements that "
        f"then missed SLOs (attainment {paper.slo_attainment:.1%}, misses "
        f"{paper.summary()['slo_misses_by_kind']}) at {ratios['mux_rollmux_check/solo']:.2f}x solo; "
        f"checking expected times too keeps {mux.slo_attainment:.1%}.")
    return lines


def run_policies(jobs: list, variants: tuple[str, ...], tail_fraction: float, tail_slots: int,
                 colocated: ColocatedModel, gavel_plus: bool = False
                 ) -> tuple[dict[str, PolicyResult], dict[str, float]]:
    """``jobs`` alone (Solo-D), co-located, optionally under Gavel+, and under each of ``MUX_VARIANTS``' named
    ``variants``; and each job's solo seconds."""
    solo = solo_results(jobs)
    secs = solo_seconds(solo)
    res: dict[str, PolicyResult] = {"solo": run_solo(jobs, solo),
                                    "colocated": run_colocated(jobs, secs, model=colocated)}
    if gavel_plus:
        res["gavel_plus"] = run_gavel_plus(jobs, res["solo"], res["colocated"], model=colocated)
    for name in variants:
        v = MUX_VARIANTS[name]
        res[name] = run_mux(jobs, secs, ClusterSpec(slo_check=v["check"], cost_basis=v["basis"],
                                                    schedule=v.get("schedule", "round_robin"),
                                                    pin_rollout=v.get("pin", False)),
                            tail_fraction=tail_fraction if v["tail"] else 1.0, tail_slots=tail_slots,
                            hybrid=colocated if v.get("hybrid") else None, name=name,
                            run_schedule=v.get("run_schedule"))
    return res, secs


def run_seed(spec: TraceSpec, tail_fraction: float, tail_slots: int, colocated: ColocatedModel) -> dict[str, Any]:
    t0 = time.perf_counter()
    jobs = generate(spec)
    res, secs = run_policies(jobs, tuple(MUX_VARIANTS), tail_fraction, tail_slots, colocated)
    ratios = {
        "mux/solo": efficiency_ratio(res["mux"], res["solo"]),
        "mux/colocated": efficiency_ratio(res["mux"], res["colocated"]),
        "colocated/solo": efficiency_ratio(res["colocated"], res["solo"]),
        "mux_rollmux/solo": efficiency_ratio(res["mux_rollmux"], res["solo"]),
        "mux_rollmux/colocated": efficiency_ratio(res["mux_rollmux"], res["colocated"]),
        "mux_rollmux/mux": efficiency_ratio(res["mux_rollmux"], res["mux"]),
        "mux_delta/solo": efficiency_ratio(res["mux_delta"], res["solo"]),
        "mux_delta/colocated": efficiency_ratio(res["mux_delta"], res["colocated"]),
        "mux_no_tail/solo": efficiency_ratio(res["mux_no_tail"], res["solo"]),
        "mux/mux_no_tail": efficiency_ratio(res["mux"], res["mux_no_tail"]),
        "mux_rollmux_check/solo": efficiency_ratio(res["mux_rollmux_check"], res["solo"]),
        "mux_rollmux_check/colocated": efficiency_ratio(res["mux_rollmux_check"], res["colocated"]),
        "hybrid/solo": efficiency_ratio(res["hybrid"], res["solo"]),
        "hybrid/colocated": efficiency_ratio(res["hybrid"], res["colocated"]),
        "hybrid/mux": efficiency_ratio(res["hybrid"], res["mux"]),
        "mux_wc/solo": efficiency_ratio(res["mux_wc"], res["solo"]),
        "mux_wc/colocated": efficiency_ratio(res["mux_wc"], res["colocated"]),
        "mux_wc/mux": efficiency_ratio(res["mux_wc"], res["mux"]),
        "hybrid_wc/solo": efficiency_ratio(res["hybrid_wc"], res["solo"]),
        "hybrid_wc/colocated": efficiency_ratio(res["hybrid_wc"], res["colocated"]),
        "hybrid_wc/hybrid": efficiency_ratio(res["hybrid_wc"], res["hybrid"]),
        "mux_wc_rr_admitted/solo": efficiency_ratio(res["mux_wc_rr_admitted"], res["solo"]),
    }
    profile = trace_profile(jobs)
    met = (ratios["mux/solo"] >= TARGET["mux/solo"] and ratios["mux/colocated"] >= TARGET["mux/colocated"]
           and res["mux"].slo_attainment >= TARGET["slo_attainment"])
    out: dict[str, Any] = {
        "seed": spec.seed,
        "jobs": len(jobs),
        "trace_span_h": round(max(j.arrival_s for j in jobs) / 3600, 1),
        "trace": profile,
        "policies": {k: v.summary() for k, v in res.items()},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "target_met": met,
    }
    out["target_hybrid_met"] = (ratios["hybrid/colocated"] >= TARGET_HYBRID["hybrid/colocated"]
                                and ratios["hybrid/solo"] >= TARGET_HYBRID["hybrid/solo"]
                                and res["hybrid"].slo_attainment >= TARGET_HYBRID["slo_attainment"])
    if not met:
        out["breakdown"] = breakdown(res, ratios, profile)
    out["hybrid_breakdown"] = hybrid_breakdown(res, jobs, secs, ratios)
    out["schedule_pairs"] = schedule_pairs(jobs, tail_fraction)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def usd_per_h(res: PolicyResult, span_h: float) -> float:
    """The policy's bill in [P]'s dollars (H20 $1.85 per GPU-hour) per hour of ``span_h``."""
    return res.cost * USD_PER_GPU_HOUR["H20"] / GPU_PRICE["H20"] / span_h if span_h else 0.0


def run_weave_seed(spec: WeaveSpec, tail_fraction: float, tail_slots: int, colocated: ColocatedModel,
                   variants: tuple[str, ...] = WEAVE_VARIANTS) -> tuple[dict[str, Any], dict[str, PolicyResult]]:
    """The weave trace of ``spec`` under the paper's baselines (Solo-D, veRL co-located on H800, Gavel+ as
    read here), our mux and the hybrid placer: ratios, SLO attainment, placement mix, $/h, statistics."""
    t0 = time.perf_counter()
    jobs = generate_weave(spec)
    res, _ = run_policies(jobs, variants, tail_fraction, tail_slots, colocated, gavel_plus=True)
    span_h = res["solo"].makespan_s / 3600
    ratios = {f"{a}/{b}": round(efficiency_ratio(res[a], res[b]), 3)
              for a in (*variants, "gavel_plus", "colocated") for b in ("solo", "colocated", "gavel_plus") if a != b}
    mux = res["mux"]
    n = len(jobs)
    out: dict[str, Any] = {
        "seed": spec.seed, "jobs": n,
        "statistics": statistics_table(jobs, usd_per_h(res["solo"], span_h)),
        "ratios": ratios,
        "slo_attainment": {k: round(r.slo_attainment, 4) for k, r in res.items()},
        "placement_mix": {k: dict(res[k].placement_mix) for k in variants},
        "placement_share": {k: {m: round(c / n, 3) for m, c in res[k].placement_mix.items()} for k in variants},
        "usd_per_h_over_solo_span": {k: round(usd_per_h(r, span_h), 1) for k, r in res.items()},
        "binding": {k: _binding_counts(res[k]) for k in variants},
        "gavel_plus_mix": res["gavel_plus"].extra["gavel_plus_mix"],
        "policies": {k: v.summary() for k, v in res.items()},
        "target_met": (ratios["mux/solo"] >= TARGET["mux/solo"] and ratios["mux/colocated"] >= TARGET["mux/colocated"]
                       and mux.slo_attainment >= TARGET["slo_attainment"]),
    }
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out, res


def _binding_counts(res: PolicyResult) -> dict[str, dict[str, int]]:
    """decision -> binding constraint -> arrivals."""
    out: dict[str, dict[str, int]] = {}
    for a in res.arrivals:
        d = out.setdefault(a["decision"], {})
        d[a["binding"]] = d.get(a["binding"], 0) + 1
    return out


def arrivals_table(res: PolicyResult) -> str:
    """Every arrival of a mux run as a text table: the job, the decision, the groups it saw with each
    verdict's count, and the binding constraint (``cluster_sim.binding_constraint``)."""
    cols = ("job", "t_h", "kind", "model_b", "slots", "slo", "decision", "added", "groups", "binding", "verdicts")
    rows = [[str(a[c]) if c != "verdicts" else " ".join(f"{k}:{v}" for k, v in sorted(a[c].items()))
             for c in cols] for a in res.arrivals]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(x.ljust(w) for x, w in zip(r, widths)) for r in rows]
    lines.append("")
    lines.append(f"{res.policy}: decision -> binding constraint (arrivals)")
    for d, b in sorted(_binding_counts(res).items()):
        lines.append(f"  {d:9s} " + ", ".join(f"{k} {v}" for k, v in sorted(b.items(), key=lambda kv: -kv[1])))
    return "\n".join(lines)


def statistics_text(rows: list[dict[str, Any]]) -> str:
    w = max(len(r["quantity"]) for r in rows)
    return "\n".join([f"{'quantity'.ljust(w)}  {'paper':>10}  ours"] +
                     [f"{r['quantity'].ljust(w)}  {str(r['paper']):>10}  {r['ours']}" for r in rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seeds", default="0", help="comma-separated trace seeds")
    ap.add_argument("--interarrival", type=float, default=TraceSpec.mean_interarrival_s,
                    help="mean seconds between arrivals (Poisson)")
    ap.add_argument("--slo", default="1,2", help="SLOs drawn uniformly from LO,HI")
    ap.add_argument("--tail-fraction", type=float, default=0.8)
    ap.add_argument("--tail-slots", type=int, default=1)
    ap.add_argument("--live", nargs="*", metavar="GROUP.yaml",
                    help="instead of the trace: run these group files live (emulated), each job alone too, and "
                         "compare with the simulator (default: configs/examples/mux/group_2x8.yaml)")
    ap.add_argument("--h800-decode-speed", type=float, default=ColocatedModel.decode_speed,
                    help="colocated: per-request decode speed on an H800 relative to an H20")
    ap.add_argument("--trace", choices=("default", "weave"), default="default",
                    help="default: the generated RollMux-like trace; weave: the trace from the RollMux paper's "
                         "statistics (slurm_rl.mux.trace_weave)")
    ap.add_argument("--arrivals", metavar="POLICY", default=None,
                    help="instead of JSON: every arrival of this mux policy (e.g. mux) as a table, per seed, with "
                         "the admission decision and the constraint that bound")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.live is not None:
        from live_mux import live_section

        files = args.live or [str(Path(__file__).resolve().parents[1] / "configs/examples/mux/group_2x8.yaml")]
        json.dump({"live": [live_section(Path(f)) for f in files], "wall_s": round(time.perf_counter() - t0, 1)},
                  sys.stdout, indent=1)
        print()
        return 0
    colocated = ColocatedModel(decode_speed=args.h800_decode_speed)
    seeds = [int(s) for s in args.seeds.split(",")]
    lo, hi = (float(x) for x in args.slo.split(","))
    if args.trace == "weave" or args.arrivals:
        return _main_weave(args, seeds, (lo, hi), colocated, t0)
    runs = [run_seed(TraceSpec(jobs=args.jobs, seed=s, mean_interarrival_s=args.interarrival, slo=(lo, hi)),
                     args.tail_fraction, args.tail_slots, colocated) for s in seeds]
    result: dict[str, Any] = {
        "prices_per_gpu_hour": GPU_PRICE,
        "colocated_model": {"decode_speed": colocated.decode_speed, "lane_factor": colocated.lane_factor},
        "mux_variants": MUX_VARIANTS,
        "target": TARGET,
        "target_hybrid": TARGET_HYBRID,
        "runs": runs,
    }
    if len(runs) > 1:
        result["mean_ratios"] = {k: round(statistics.mean(r["ratios"][k] for r in runs), 3) for k in runs[0]["ratios"]}
        result["mean_slo_attainment"] = {k: round(statistics.mean(r["policies"][k]["slo_attainment"] for r in runs), 4)
                                         for k in runs[0]["policies"]}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


def _main_weave(args: argparse.Namespace, seeds: list[int], slo: tuple[float, float], colocated: ColocatedModel,
                t0: float) -> int:
    """``--trace weave`` (JSON) and ``--arrivals POLICY`` (text tables) on either trace."""
    if args.arrivals is not None and args.arrivals not in MUX_VARIANTS:
        print(f"--arrivals: got {args.arrivals!r}; allowed: {sorted(MUX_VARIANTS)}", file=sys.stderr)
        return 2
    runs, tables = [], []
    for seed in seeds:
        if args.trace == "weave":
            wspec = WeaveSpec(jobs=args.jobs, seed=seed, slo=slo)
            variants = WEAVE_VARIANTS if args.arrivals is None else (args.arrivals,)
            if "mux" not in variants:
                variants = ("mux", *variants)
            run, res = run_weave_seed(wspec, args.tail_fraction, args.tail_slots, colocated, variants)
            runs.append(run)
        else:
            jobs = generate(TraceSpec(jobs=args.jobs, seed=seed, mean_interarrival_s=args.interarrival, slo=slo))
            secs = solo_seconds(solo_results(jobs))
            v = MUX_VARIANTS[args.arrivals]
            res = {args.arrivals: run_mux(jobs, secs, ClusterSpec(slo_check=v["check"], cost_basis=v["basis"],
                                                                  schedule=v.get("schedule", "round_robin"),
                                                                  pin_rollout=v.get("pin", False)),
                                          tail_fraction=args.tail_fraction if v["tail"] else 1.0,
                                          tail_slots=args.tail_slots,
                                          hybrid=colocated if v.get("hybrid") else None, name=args.arrivals)}
        if args.arrivals is not None:
            tables.append(f"# trace {args.trace}, seed {seed}, policy {args.arrivals}\n" + arrivals_table(res[args.arrivals]))
    if args.arrivals is not None:
        print("\n\n".join(tables))
        return 0
    result: dict[str, Any] = {
        "trace": "weave", "prices_usd_per_gpu_hour": USD_PER_GPU_HOUR, "target": TARGET,
        "paper": {"placement_share": PAPER_MIX, "usd_per_h": PAPER_USD_PER_H,
                  "ratios": {"mux/solo": 1.84, "mux/colocated": 1.38, "colocated/solo": 1.32}},
        "mux_variants": {k: MUX_VARIANTS[k] for k in WEAVE_VARIANTS}, "runs": runs,
    }
    if len(runs) > 1:
        keys = runs[0]["ratios"]
        result["mean_ratios"] = {k: round(statistics.mean(r["ratios"][k] for r in runs), 3) for k in keys}
        result["min_ratios"] = {k: round(min(r["ratios"][k] for r in runs), 3) for k in keys}
        result["mean_slo_attainment"] = {k: round(statistics.mean(r["slo_attainment"][k] for r in runs), 4)
                                         for k in runs[0]["slo_attainment"]}
        result["mean_placement_share"] = {
            k: {m: round(statistics.mean(r["placement_share"][k].get(m, 0) for r in runs), 3)
                for m in runs[0]["placement_share"][k]} for k in runs[0]["placement_share"]}
        result["mean_usd_per_h"] = {k: round(statistics.mean(r["usd_per_h_over_solo_span"][k] for r in runs), 1)
                                    for k in runs[0]["usd_per_h_over_solo_span"]}
    result["target_met_every_seed"] = all(r["target_met"] for r in runs)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    json.dump(result, sys.stdout, indent=1)
    print()
    print("\n" + statistics_text(runs[0]["statistics"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
