"""Cluster-level simulation of the multiplexing policies, and the group prediction of run configs."""

from __future__ import annotations

from dataclasses import replace
import math
from pathlib import Path

import pytest
import yaml

from emulated_configs import emulated_config
from slurm_rl.config import config_from_yaml_text
from slurm_rl.mux.admission import ClusterSpec
from slurm_rl.mux.cluster_sim import (
    POLICY_NAMES,
    efficiency_ratio,
    run_mux,
    simulate_cluster,
    solo_results,
    solo_seconds,
)
from slurm_rl.mux.group_sim import simulate_group, solo_time
from slurm_rl.mux.model import GPU_PRICE, JobProfile, Pools, SwitchCosts, slots_cost_per_hour
from slurm_rl.mux.predict import job_profile, predict_group
from slurm_rl.mux.trace import TraceSpec, generate

SMALL = TraceSpec(jobs=16, seed=7, mean_interarrival_s=300.0, iterations=(3, 6), units=16, patterns=2)


@pytest.fixture(scope="module")
def small():
    jobs = generate(SMALL)
    return jobs, simulate_cluster(jobs, POLICY_NAMES)


def test_trace_is_seeded_and_mixed() -> None:
    a, b = generate(TraceSpec(jobs=200, seed=3)), generate(TraceSpec(jobs=200, seed=3))
    assert a == b and len(a) == 200
    assert {j.kind for j in a} == {"reasoning", "agentic", "rlhf", "balanced"}
    assert all(1.0 <= j.slo <= 2.0 for j in a) and len({j.model_b for j in a}) == 4
    gaps = [y.arrival_s - x.arrival_s for x, y in zip(a, a[1:])]
    assert all(g > 0 for g in gaps) and 600 < sum(gaps) / len(gaps) < 1200
    heavy = [j for j in a if j.kind == "reasoning"]
    assert all(j.tail(0, 0.8)[1] > 0.3 * j.rollout_seconds(0) for j in heavy)  # long tails


def test_costs_add_up_and_slo_attainment_is_counted_right(small) -> None:
    jobs, res = small
    for r in res.values():
        assert r.cost == pytest.approx(sum(h * GPU_PRICE[g] for g, h in r.gpu_hours.items()))
        assert all(r.busy_gpu_hours[g] <= h + 1e-6 for g, h in r.gpu_hours.items())
        served = r.served
        met = sum(1 for j in served if (j.finish_s - j.arrival_s) / j.solo_s <= j.slo + 1e-9)
        assert r.slo_attainment == pytest.approx(met / len(served))
        assert r.job_hours_per_cost == pytest.approx(r.useful_job_hours / r.cost)
    solo = res["solo"]
    assert solo.cost == pytest.approx(sum(
        o.solo_s / 3600 * slots_cost_per_hour(j.rollout_slots, j.train_slots) for j, o in
        zip(jobs, (solo.jobs[j.name] for j in jobs))))
    assert solo.slo_attainment == 1.0
    assert res["colocated"].useful_job_hours == pytest.approx(solo.useful_job_hours)
    mux = res["mux"]
    assert sum(mux.placement_mix.values()) == len(jobs)
    admitted = len(jobs) - mux.placement_mix["refused"]
    assert sum(k * n for k, n in mux.group_sizes["members_over_lifetime"].items()) == admitted
    assert mux.cost == pytest.approx(sum(g["cost"] for g in mux.groups), rel=1e-3)
    assert sum(mux.extra["cost_share_by_concurrent_jobs"].values()) == pytest.approx(1.0, abs=1e-3)
    assert efficiency_ratio(mux, solo) == pytest.approx(mux.job_hours_per_cost / solo.job_hours_per_cost)


def test_checking_expected_times_too_keeps_more_slos(small) -> None:
    # jobs of 3-6 iterations: one iteration with a max-length response weighs a lot, so even the
    # stricter check is an estimate here (the 200-job bench keeps every SLO with it)
    jobs, res = small
    secs = solo_seconds(solo_results(jobs))
    safe = run_mux(jobs, secs, ClusterSpec(slo_check="both", cost_basis="lifetime"))
    assert safe.slo_attainment >= res["mux"].slo_attainment and safe.slo_attainment >= 0.9
    assert all(o.finish_s is not None for o in safe.jobs.values())


def test_a_complementary_pair_costs_much_less_in_one_group() -> None:
    sw = SwitchCosts(1.0, 4.0, 30.0, 2.0)
    a = JobProfile("A", 20, 1, 1, 8, ((300.0,) * 8,), (80.0,), 300.0, 80.0, slo=1.3, switch=sw)
    b = JobProfile("B", 20, 1, 1, 8, ((80.0,) * 8,), (300.0,), 80.0, 300.0, slo=1.3, switch=sw)
    res = simulate_group(Pools((0,), (0,)), [a, b], tail_fraction=0.8)
    assert all(j.slo_met for j in res.jobs.values())
    solo_cost = sum(solo_time(j) for j in (a, b)) * slots_cost_per_hour(1, 1)
    group_cost = res.makespan_s * slots_cost_per_hour(1, 1)
    assert solo_cost / group_cost > 1.7
    assert res.pools["rollout"].busy_fraction > 0.8 and res.pools["train"].busy_fraction > 0.8


def _config(tmp: Path, name: str, **emulated):
    cfg = emulated_config(tmp / name, iterations=3)
    cfg["emulated"].update(emulated)
    return config_from_yaml_text(yaml.safe_dump(cfg))


def test_predict_group_of_two_emulated_configs(tmp_path: Path) -> None:
    roll = _config(tmp_path, "roll", rollout_s_per_token=4e-6, response_len_mean=128, response_len_max=512)
    train = _config(tmp_path, "train", actor_s_per_token=3e-5, response_len_mean=32, response_len_max=64)
    prof, fig = job_profile(roll, "roll")
    # the profile reproduces the single-job simulator's rollout phase, tail included
    assert [round(prof.rollout_seconds(k), 4) for k in range(3)] == fig["rollout_s"]
    assert all(0 < t <= r for t, r in zip(fig["t_tail_s"], fig["rollout_s"]))
    out = predict_group([roll, train], ["roll", "train"], (2, 3, 4, 5), (0, 1, 6, 7), tail_fraction=0.8,
                        tail_slots=1, switch_s={"rollout": 0.01, "train": 0.02})
    assert set(out["finish_s"]) == {"roll", "train"} and out["makespan_s"] == max(out["finish_s"].values())
    assert max(out["solo_s"].values()) <= out["makespan_s"] + 1e-9
    assert out["makespan_s"] < out["sequential_phased_s"]
    assert out["speedup_vs_sequential"] == pytest.approx(out["sequential_s"] / out["makespan_s"], rel=1e-3)
    assert all(s >= 0.99 for s in out["slowdown"].values())
    assert all(0 < p["busy_fraction"] <= 1 for p in out["pools"].values())
    assert all(math.isfinite(v) for v in out["jobs"]["train"]["train_s"])
    with pytest.raises(ValueError, match="rollout and 4 train slots"):
        predict_group([roll], ["roll"], (2, 3, 4, 5), (0, 1), 0.8, 1, {})


def test_pinned_rollout_slots_roll_out_at_once_as_the_meta_iteration_predicts() -> None:
    """RollMux's pinning: three rollout-heavy jobs, each on a rollout slot of its own, share one
    training slot. Pinned, their rollouts overlap and the lap is one rollout plus one training
    (~4 s); on a shared rollout pool it is the three rollouts back to back (~9 s). The group
    simulator (driven by the rotation) and the meta-iteration estimate agree on both, and no slot
    ever serves two jobs at once."""
    from slurm_rl.mux.analysis import group_meta
    from slurm_rl.mux.group_sim import GroupSim
    from slurm_rl.mux.model import GroupModel

    sw = SwitchCosts(rollout_warm_s=0.01, train_warm_s=0.01, cold_s=0.0, migrate_s=0.0)
    jobs = [JobProfile(n, 10, 1, 1, 4, ((3.0,) * 4,), (1.0,), 3.0, 1.0, slo=3.0, switch=sw) for n in "ABC"]
    pin = {"A": (0,), "B": (1,), "C": (2,)}
    pools = Pools((0, 1, 2), (0,))
    for pinned, lap in ((True, 4.02), (False, 9.03)):
        sim = GroupSim(pools, 1.0, 1, pin_rollout=pinned)
        for j in jobs:
            sim.add_job(j, 0.0, rollout=pin[j.name])
        sim.run_until(None)
        m = group_meta(GroupModel(pools, tuple(jobs), rollout_assign=pin, pin_rollout=pinned), conservative=False)
        assert m.period_s == pytest.approx(lap, abs=0.02)
        finish = max(j.finish_s for j in sim.jobs.values())
        assert finish == pytest.approx(10 * lap, rel=0.05)  # ten laps, the first without switches
        for pool, slot in sim.slots:
            busy = sorted((i.start, i.end) for i in sim.timeline if i.pool == pool and i.slot == slot)
            assert all(b[0] >= a[1] - 1e-9 for a, b in zip(busy, busy[1:]))


def test_pinned_admission_scales_with_slots_of_its_own() -> None:
    """Pinned, a rollout-heavy newcomer that the group's one rollout slot cannot take within the
    SLOs gets a rollout slot added for it alone (``scaled``), and the group keeps every SLO."""
    from slurm_rl.mux.admission import place
    from slurm_rl.mux.model import GroupModel

    sw = SwitchCosts(rollout_warm_s=0.01, train_warm_s=0.01, cold_s=0.0, migrate_s=0.0)
    a, b = (JobProfile(n, 10, 1, 1, 4, ((3.0,) * 4,), (1.0,), 3.0, 1.0, slo=1.2, switch=sw) for n in "AB")
    g = GroupModel(Pools((0,), (0,)), (a,), rollout_assign={"A": (0,)}, pin_rollout=True)
    d = place(b, [g], ClusterSpec(pin_rollout=True))
    assert d.kind == "scaled" and d.rollout_slots == (1,) and d.added_rollout_slots == 1
    assert all(s <= 1.2 for s in d.slowdowns.values())
    assert place(b, [replace(g, pin_rollout=False)], ClusterSpec()).kind == "new"  # one rollout at a time: no room
    with pytest.raises(ValueError, match="pin_rollout"):
        ClusterSpec(pin_rollout=True, schedule="work_conserving")
