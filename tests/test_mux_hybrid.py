"""Hybrid placement (admission.place_hybrid) and the work-conserving rotation (rotation.decide)."""

from __future__ import annotations

import pytest

from slurm_rl.mux.admission import KINDS, ClusterSpec, place, place_hybrid, predict_colocated
from slurm_rl.mux.analysis import PhaseTimes, meta_iteration
from slurm_rl.mux.cluster_sim import POLICY_NAMES, colocated_seconds, run_mux
from slurm_rl.mux.group_sim import GroupSim, simulate_group_from_phases, with_member
from slurm_rl.mux.model import ColocatedModel, GroupModel, JobProfile, Pools, SwitchCosts
from slurm_rl.mux.rotation import GroupView, Holding, JobView, decide, initial_grant

SW = SwitchCosts(rollout_warm_s=0.01, train_warm_s=0.01, cold_s=0.0, migrate_s=0.0)
SLOTS = {"rollout": (0,), "train": (0,)}


def job(name: str, rollout: float, train: float, slo: float = 1.5, responses: int = 4, lanes: int = 4,
        iterations: int = 10) -> JobProfile:
    return JobProfile(name, iterations, 1, 1, lanes, ((rollout,) * responses,), (train,), rollout, train,
                      slo=slo, rollout_bytes_per_slot=1e10, train_bytes_per_slot=1e11, switch=SW)


def group(*members: JobProfile, gid: int = 0, schedule: str = "round_robin") -> GroupModel:
    return GroupModel(Pools((0,), (0,)), members, gid=gid, schedule=schedule)


# ---------------------------------------------------------------- hybrid placement
def test_colocated_when_cheaper_than_a_new_group() -> None:
    # rollout-bound, one wave (3 responses fit the 3 co-located lanes): as fast on the H800
    j = job("J", 10.0, 1.0, slo=1.5, responses=3)
    d = place_hybrid(j, [], ClusterSpec(), ColocatedModel())
    assert "colocated" in KINDS and d.kind == "colocated" and d.group is None
    c = predict_colocated(j)
    assert d.delta_cost == pytest.approx(c.cost) and d.delta_cost_per_h == pytest.approx(8 * 2.85)
    new = d.options["new"]
    assert d.options["colocated"]["cost"] < new["cost"] and new["cost_per_h"] == pytest.approx(8 + 8 * 2.85)
    assert d.slowdowns["J"] == pytest.approx(c.slowdown) and c.slowdown < 1.01
    assert place(j, []).kind == "new"  # plain mux would open a group


def test_a_new_group_when_co_location_is_slower_than_the_slo_allows() -> None:
    # four responses on four lanes: co-located the lanes shrink to 3, so two waves: 2x the rollout
    j = job("J", 10.0, 1.0, slo=1.2)
    d = place_hybrid(j, [], ClusterSpec(), ColocatedModel())
    assert d.kind == "new" and not d.options["colocated"]["admissible"]
    assert d.options["colocated"]["slowdown"] == pytest.approx((20.0 + 1.02) / 11.0, rel=1e-3)
    assert "co-located" in d.reason


def test_a_group_that_admits_the_job_is_joined() -> None:
    a, b = job("A", 3.0, 1.0), job("B", 1.0, 3.0)
    d = place_hybrid(b, [group(a)], ClusterSpec(), ColocatedModel())
    assert d.kind == "direct" and d.group == 0 and d.delta_cost_per_h == 0.0


def test_refused_for_a_group_runs_colocated_when_that_keeps_the_slo() -> None:
    # host memory too small for a group of its own (rollout state parked on the H20 node)
    j = JobProfile("J", 10, 1, 1, 4, ((10.0,) * 3,), (1.0,), 10.0, 1.0, slo=1.5,
                   rollout_bytes_per_slot=2e12, train_bytes_per_slot=1e11, switch=SW)
    cluster = ClusterSpec(host_bytes_per_slot=1e12)
    assert place(j, [], cluster).kind == "refused"
    d = place_hybrid(j, [], cluster, ColocatedModel())
    assert d.kind == "colocated" and "no group admits it" in d.reason
    # and refused where co-location breaks the SLO too
    tight = JobProfile("T", 10, 1, 1, 4, ((10.0,) * 4,), (1.0,), 10.0, 1.0, slo=1.1,
                       rollout_bytes_per_slot=2e12, train_bytes_per_slot=1e11, switch=SW)
    assert place_hybrid(tight, [], cluster, ColocatedModel()).kind == "refused"


def test_predicted_colocated_time_is_the_simulated_one() -> None:
    j = job("J", 10.0, 1.0, responses=7, iterations=5)
    c = predict_colocated(j)
    assert c.seconds == pytest.approx(colocated_seconds(j, ColocatedModel())[0], rel=1e-9)


def test_hybrid_policy_runs_colocated_jobs_and_counts_them() -> None:
    jobs = [replace_arrival(job("A", 10.0, 1.0, iterations=3, responses=3), 0.0),
            replace_arrival(job("B", 1.0, 3.0), 5.0)]
    secs = {"A": 3 * 11.0, "B": 10 * 4.0}
    assert "hybrid" in POLICY_NAMES
    res = run_mux(jobs, secs, ClusterSpec(), hybrid=ColocatedModel())
    assert res.policy == "hybrid" and res.placement_mix["colocated"] >= 1
    assert res.jobs["A"].placement == "colocated" and res.jobs["A"].finish_s is not None
    assert sum(res.extra["cost_share"].values()) == pytest.approx(1.0, abs=1e-3)


def replace_arrival(j: JobProfile, t: float) -> JobProfile:
    from dataclasses import replace

    return replace(j, arrival_s=t)


# ---------------------------------------------------------------- work-conserving rotation
def _views(schedule: str) -> GroupView:
    # A's turn is next on the rollout pool but A is not waiting; B is
    return GroupView(members=("A", "B"), schedule=schedule,
                     jobs={"A": JobView(SLOTS, 3), "B": JobView(SLOTS, 3, waiting={"rollout": 0})})


def test_work_conserving_skips_a_next_job_that_is_not_ready() -> None:
    grant = initial_grant(SLOTS, ("A", "B"))
    assert decide(grant, _views("round_robin")) is None  # strict: the pool waits for A
    new, events = decide(grant, _views("work_conserving"))
    assert new.pools["rollout"].turn == Holding("B", 0) and new.pools["rollout"].slots[0] == Holding("B", 0)
    assert new.pools["rollout"].cursor == 0  # moved past B: A is next again (one cyclic order)
    assert "rollout: turn of B iteration 0" in events


def test_work_conserving_serves_the_first_ready_job_in_cyclic_order_from_the_cursor() -> None:
    from dataclasses import replace

    from slurm_rl.mux.rotation import PoolGrant

    members = ("A", "B", "C", "D")
    grant = initial_grant(SLOTS, members)
    grant = replace(grant, pools={**grant.pools, "rollout": PoolGrant(slots={0: None}, cursor=2)})
    ready = {"rollout": 0}
    jobs = {"A": JobView(SLOTS, 3, waiting=ready), "B": JobView(SLOTS, 3, waiting=ready),
            "C": JobView(SLOTS, 3), "D": JobView(SLOTS, 3, out=True)}
    new, _ = decide(grant, GroupView(members=members, jobs=jobs, schedule="work_conserving"))
    # C (next) is not ready and D is out: A, not B, is the first ready one after the cursor
    assert new.pools["rollout"].turn.job == "A" and new.pools["rollout"].cursor == 1
    assert decide(grant, GroupView(members=members, jobs=jobs, schedule="round_robin")) is None


def test_unknown_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="schedule"):
        GroupView(members=(), jobs={}, schedule="fifo")
    with pytest.raises(ValueError, match="schedule"):
        GroupSim(Pools((0,), (0,)), schedule="fifo")
    with pytest.raises(ValueError, match="schedule"):
        ClusterSpec(schedule="fifo")


def _tail_pair() -> list[dict]:
    # a long-tailed rollout-heavy job and a short training-heavy one on two rollout slots
    long_tail = [1.0] * 14 + [20.0, 30.0]
    return [{"name": "L", "iterations": 4, "response_s": [long_tail], "train_s": [2.0], "lanes_per_slot": 4},
            {"name": "S", "iterations": 8, "response_s": [[1.0] * 4], "train_s": [6.0], "lanes_per_slot": 4}]


def test_simulator_takes_the_schedule_and_work_conserving_fills_the_tail() -> None:
    kw = dict(tail_fraction=0.8, switch={"rollout": 0.1, "train": 0.1, "migrate": 0.1})
    rr = simulate_group_from_phases((0, 1), (0,), _tail_pair(), schedule="round_robin", **kw)
    wc = simulate_group_from_phases((0, 1), (0,), _tail_pair(), schedule="work_conserving", **kw)
    for res in (rr, wc):
        assert all(j.responses_finished == j.responses_expected for j in res.jobs.values())
    # S trains while L's tail still decodes instead of waiting for L's turn to end
    assert wc.jobs["S"].finish_s < rr.jobs["S"].finish_s
    assert wc.makespan_s <= rr.makespan_s + 1e-9


@pytest.mark.parametrize("join_at", [0.0, 1.0, 3.5, 6.0, 7.25, 11.0, 13.0, 17.5])
def test_work_conserving_joins_never_deadlock_and_keep_one_cyclic_order(join_at: float) -> None:
    def prof(name: str, r: float, t: float) -> JobProfile:
        return JobProfile(name, 5, 1, 1, 4, ((r,) * 4,), (t,), r, t, switch=SwitchCosts(0.5, 1.0, 0.0, 0.5))

    sim = GroupSim(Pools((0, 1), (0,)), tail_fraction=0.8, schedule="work_conserving")
    sim.add_job(prof("A", 5.0, 2.0), 0.0)
    sim.add_job(prof("B", 1.0, 4.0), 0.5)
    sim.add_job(prof("C", 3.0, 3.0), join_at)
    sim.run_until(None)
    assert all(sim.jobs[n].finish_s is not None for n in "ABC")
    assert sorted(sim.members) == ["A", "B", "C"]  # one order, every member once


def test_with_member_keeps_one_order_under_work_conserving() -> None:
    grant, members = with_member(initial_grant(SLOTS, ()), (), "A")
    view = GroupView(members=members, jobs={"A": JobView(SLOTS, 3, waiting={"rollout": 0})},
                     schedule="work_conserving")
    grant, _ = decide(grant, view)
    grant, members = with_member(grant, members, "B")
    n = len(members)
    assert [members[(grant.pools["rollout"].cursor + i) % n] for i in range(n)] == ["B", "A"]
    assert [members[(grant.pools["train"].cursor + i) % n] for i in range(n)] == ["A", "B"]


# ---------------------------------------------------------------- predictions with the schedule
def test_meta_iteration_work_conserving_without_overlap_is_round_robin() -> None:
    # with whole phases on both pools served in one cyclic order, the member whose turn is next is
    # always the first to be ready again: work-conserving changes nothing (its gain needs phases
    # that end out of order, e.g. a rollout whose tail migrated, which the estimate does not model)
    for pts in ([PhaseTimes("L", 2.0, 10.0, 12.0, 2.0), PhaseTimes("S", 1.0, 1.0, 2.0, 2.0),
                 PhaseTimes("M", 1.0, 1.0, 2.0, 2.0)],
                [PhaseTimes("A", 3.0, 1.0, 4.0, 2.0, 0.5, 0.5), PhaseTimes("B", 1.0, 3.0, 4.0, 2.0, 0.5, 0.5)]):
        rr = meta_iteration(pts, schedule="round_robin")
        wc = meta_iteration(pts, schedule="work_conserving")
        assert wc.period_s == pytest.approx(rr.period_s, rel=1e-6)
        for p in pts:
            assert wc.slowdown[p.name] == pytest.approx(rr.slowdown[p.name], rel=1e-6)
            assert wc.period_of(p.name) == pytest.approx(rr.period_s, rel=1e-6)
    with pytest.raises(ValueError, match="schedule"):
        meta_iteration(pts, schedule="fifo")


def test_admission_predicts_with_the_schedule_of_each_group(monkeypatch) -> None:
    import slurm_rl.mux.analysis as analysis

    seen: list[str] = []
    real = analysis.meta_iteration

    def spy(phases, rounds=None, schedule="round_robin", pinned=False):
        seen.append(schedule)
        return real(phases, rounds, schedule, pinned)

    monkeypatch.setattr(analysis, "meta_iteration", spy)
    a, b = job("A", 3.0, 1.0), job("B", 1.0, 3.0)
    d = place(b, [group(a, gid=0, schedule="work_conserving")], ClusterSpec(schedule="round_robin"))
    assert d.kind == "direct" and "work_conserving" in seen and "round_robin" in seen  # group / new group
    seen.clear()
    place(b, [], ClusterSpec(schedule="work_conserving"))
    assert seen and set(seen) == {"work_conserving"}
