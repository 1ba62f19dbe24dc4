"""Predict a co-execution group of ordinary run configs (for the live comparison).

Each config (``runtime.device: emulated``) is simulated alone by the single-job simulator
(:mod:`slurm_rl.scheduler.simulator`, the ``static`` policy on its configured placement). From
that run we take, per iteration:

* the rollout phase: every response's length in dispatch order, hence its decode seconds on one
  rollout rank (``length / decode_tokens_per_s``: exact with ``decode_fixed_fraction = 1``, the
  full-batch speed otherwise), with ``max_running_requests / rollout_ranks_per_instance``
  responses per rank at once; the simulator's own finish times give the tail curve
  (``rollout_s``, ``t_tail_s``: when ``tail_fraction`` of the responses were done);
* the training phase (inference + actor, after the whole rollout, as inside a group): the
  simulator's busy seconds of inference and actor, pipelined mini-batch by mini-batch when they
  sit on different ranks (``I/n + A/n + (n-1) max(I/n, A/n)`` for ``n`` equal mini-batches), in
  sequence when they share ranks.

Then :func:`~.group_sim.simulate_group` runs the jobs on the group's pools with the given switch
seconds (the same rotation policy as the live group scheduler). A job's ranks sit on the first
slots of each pool (as many as its config has rollout ranks / inference+actor ranks).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from slurm_rl.config import Config
from slurm_rl.mux.group_sim import simulate_group, solo_time
from slurm_rl.mux.model import JobProfile, Pools, SwitchCosts
from slurm_rl.scheduler.policies import make_policy
from slurm_rl.scheduler.simulate import build_setup
from slurm_rl.scheduler.simulator import Simulation, SimSetup


class _Recording(Simulation):
    """The single-job simulator, also recording each iteration's response lengths and finish times."""

    def __init__(self, setup: SimSetup) -> None:
        super().__init__(setup, make_policy("static", setup.policy_cfg), policy_name="static")
        self.lengths: list[list[int]] = []
        self.finishes: list[list[float]] = []

    def _start_iteration(self, it: int) -> None:
        super()._start_iteration(it)
        self.lengths.append([r.length for r in self.requests])
        self.finishes.append([])

    def _finish_request(self, rid: int) -> bool:
        self.finishes[-1].append(self.t - self.t_start)
        return super()._finish_request(rid)


def _pipelined(inference_s: float, actor_s: float, minibatches: int, shared: bool) -> float:
    if shared:
        return inference_s + actor_s
    n = max(1, minibatches)
    i, a = inference_s / n, actor_s / n
    return i + a + (n - 1) * max(i, a)


def job_profile(cfg: Config, name: str, tail_fraction: float = 0.8, switch: SwitchCosts = SwitchCosts(),
                seed: int | None = None) -> tuple[JobProfile, dict[str, Any]]:
    """(profile, figures) of one emulated config, from its single-job simulation."""
    setup, _ = build_setup(cfg, policy="static", seed=seed)  # the configured placement, held
    sim = _Recording(setup)
    report = sim.run()
    pc = setup.policy_cfg
    g = pc.rollout_ranks_per_instance
    roll = setup.initial["rollout"]
    inf, act = setup.initial["inference"], setup.initial["actor"]
    train_ranks = sorted(set(inf) | set(act))
    if not roll or not act:
        raise ValueError(f"{name}: a group member needs rollout and actor ranks, got {dict(setup.initial)}")
    speed = setup.cost.decode_tokens_per_s(g, pc.max_running_requests, pc.max_running_requests)
    response_s = tuple(tuple(max(1e-9, ln / speed) for ln in lens) for lens in sim.lengths)
    shared = bool(set(inf) & set(act))
    train_s = tuple(_pipelined(it.busy_gpu_s["inference"] / max(1, len(inf)),
                               it.busy_gpu_s["actor"] / max(1, len(act)),
                               setup.batch.minibatches_per_iteration, shared) for it in report.iterations)
    mean_len = sum(sum(x) for x in sim.lengths) / max(1, sum(len(x) for x in sim.lengths))
    max_len = setup.lengths.max_len
    scale = (setup.prompt_len + max_len) / (setup.prompt_len + mean_len)
    prof = JobProfile(
        name=name, iterations=setup.num_iterations, rollout_slots=len(roll), train_slots=len(train_ranks),
        lanes_per_slot=max(1, pc.max_running_requests // g), response_s=response_s, train_s=train_s,
        max_response_s=max_len / speed, train_max_s=max(train_s) * scale, max_response_len=max_len,
        mean_response_len=mean_len, switch=switch)
    rollout_s = [max(f) if f else 0.0 for f in sim.finishes]
    tails = []
    for f in sim.finishes:
        done = sorted(f)
        k = max(1, math.ceil(tail_fraction * len(done) - 1e-9))
        tails.append(done[min(len(done), k) - 1] if done else 0.0)
    figures = {
        "rollout_ranks": len(roll), "train_ranks": len(train_ranks), "iterations": setup.num_iterations,
        "responses": len(sim.lengths[0]) if sim.lengths else 0,
        "rollout_s": [round(x, 4) for x in rollout_s],
        "t_tail_s": [round(x, 4) for x in tails],
        "train_s": [round(x, 4) for x in train_s],
        "single_job_iteration_s": [round(it.time_s, 4) for it in report.iterations],
        "single_job_total_s": round(report.total_time_s, 4),
    }
    return prof, figures


def predict_group(configs: Sequence[Config], names: Sequence[str], rollout_slots: tuple[int, ...],
                  train_slots: tuple[int, ...], tail_fraction: float = 0.8, tail_slots: int = 1,
                  switch_s: Mapping[str, float] | None = None, seed: int | None = None,
                  timeline: bool = False, schedule: str = "round_robin") -> dict[str, Any]:
    """Predicted run of ``configs`` as one group on ``rollout_slots`` / ``train_slots``.

    ``switch_s``: seconds of a warm switch per pool (``rollout``, ``train``; e.g. the emulated
    ``mux.park_s``), and optionally ``migrate`` (tail hand-off) and ``cold`` (state loading
    before a job joins). ``schedule``: the rotation's schedule in force (``round_robin`` or
    ``work_conserving``, as the group's ``schedule``). Returns ``makespan_s``, per job
    ``finish_s`` / ``solo_s`` (alone on its own ranks, same phase model) / ``slowdown``,
    ``sequential_s`` (the jobs one after another as ordinary runs: the sum of their single-job
    simulated totals), ``sequential_phased_s`` (the sum of ``solo_s``), ``speedup_vs_sequential``,
    per-pool busy/bubble shares, each job's phase figures (``jobs``), the rotation's events and, with ``timeline``, the per-slot intervals.
    """
    if len(configs) != len(names) or len(set(names)) != len(names):
        raise ValueError("predict_group: one distinct name per config")
    sw = dict(switch_s or {})
    unknown = set(sw) - {"rollout", "train", "migrate", "cold"}
    if unknown:
        raise ValueError(f"switch_s: unknown keys {sorted(unknown)}, allowed rollout, train, migrate, cold")
    switch = SwitchCosts(rollout_warm_s=float(sw.get("rollout", 0.0)), train_warm_s=float(sw.get("train", 0.0)),
                         cold_s=float(sw.get("cold", 0.0)), migrate_s=float(sw.get("migrate", 0.0)))
    profiles, figures, ra, ta = [], {}, {}, {}
    for cfg, name in zip(configs, names):
        prof, fig = job_profile(cfg, name, tail_fraction, switch, seed)
        if prof.rollout_slots > len(rollout_slots) or prof.train_slots > len(train_slots):
            raise ValueError(f"{name}: needs {prof.rollout_slots} rollout and {prof.train_slots} train slots, "
                             f"the group has {len(rollout_slots)} and {len(train_slots)}")
        profiles.append(prof)
        figures[name] = fig
        ra[name] = tuple(rollout_slots[:prof.rollout_slots])
        ta[name] = tuple(train_slots[:prof.train_slots])
    solo = {p.name: solo_time(p, gpus_per_slot=1) for p in profiles}
    res = simulate_group(Pools(tuple(rollout_slots), tuple(train_slots), gpus_per_slot=1), profiles,
                         tail_fraction, tail_slots, ra, ta, record=True, solo_s=solo, schedule=schedule)
    sequential = sum(f["single_job_total_s"] for f in figures.values())
    out: dict[str, Any] = {
        "makespan_s": round(res.makespan_s, 4),
        "finish_s": {n: round(j.finish_s, 4) if j.finish_s is not None else None for n, j in res.jobs.items()},
        "solo_s": {n: round(s, 4) for n, s in solo.items()},
        "slowdown": {n: round(j.slowdown, 4) if j.slowdown is not None else None for n, j in res.jobs.items()},
        "sequential_s": round(sequential, 4),
        "sequential_phased_s": round(sum(solo.values()), 4),
        "speedup_vs_sequential": round(sequential / res.makespan_s, 4) if res.makespan_s else None,
        "pools": {p: {"slots": s.slots, "busy_fraction": round(s.busy_fraction, 4),
                      "bubble_fraction": round(s.bubble_fraction, 4)} for p, s in res.pools.items()},
        "migrated_responses": {n: j.migrated_responses for n, j in res.jobs.items()},
        "jobs": figures,
        "tail_fraction": tail_fraction, "tail_slots": tail_slots, "schedule": schedule,
        "switch_s": {"rollout": switch.rollout_warm_s, "train": switch.train_warm_s,
                     "migrate": switch.migrate_s, "cold": switch.cold_s},
        "events": [{"t": t, "event": e} for t, e in res.events],
    }
    if timeline:
        out["timeline"] = [{"pool": i.pool, "slot": i.slot, "job": i.job, "iteration": i.iteration,
                            "start": round(i.start, 4), "end": round(i.end, 4), "kind": i.kind}
                           for i in res.timeline]
    return out
