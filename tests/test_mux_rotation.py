"""The intra-group rotation (rotation.decide) as the group simulator drives it."""

from __future__ import annotations

import re

import pytest

from slurm_rl.mux.analysis import PhaseTimes, cycle, load, meta_iteration, saturated
from slurm_rl.mux.group_sim import GroupSim, simulate_group_from_phases, with_member
from slurm_rl.mux.model import JobProfile, Pools, SwitchCosts
from slurm_rl.mux.rotation import GroupView, JobView, decide, initial_grant


def spec(name: str, responses: list[float], train: float, iterations: int = 4, lanes: int = 8, **kw) -> dict:
    return {"name": name, "iterations": iterations, "response_s": [responses], "train_s": [train],
            "lanes_per_slot": lanes, **kw}


def turns(events, pool: str) -> list[tuple[str, int]]:
    out = []
    for _, e in events:
        if e.startswith(f"{pool}: turn of "):
            job, _, it = e[len(f"{pool}: turn of "):].split()
            out.append((job, int(it)))
    return out


def test_round_robin_order_with_three_jobs_over_several_meta_iterations() -> None:
    jobs = [spec("A", [6.0] * 4, 3.0), spec("B", [2.0] * 4, 5.0), spec("C", [4.0] * 4, 4.0)]
    res = simulate_group_from_phases((0, 1), (0,), jobs, tail_fraction=1.0)
    expected = [(j, k) for k in range(4) for j in ("A", "B", "C")]
    assert turns(res.events, "rollout") == expected
    assert turns(res.events, "train") == expected
    assert all(j.iterations_done == 4 for j in res.jobs.values())


def test_strict_order_the_pool_waits_for_the_job_whose_turn_is_next() -> None:
    # decide() alone: B waits for the rollout pool, but it is A's turn and A is not waiting yet
    grant = initial_grant({"rollout": (0,), "train": (0,)}, ("A", "B"))
    slots = {"rollout": (0,), "train": (0,)}
    view = GroupView(members=("A", "B"), jobs={"A": JobView(slots, 3), "B": JobView(slots, 3, waiting={"rollout": 0})})
    assert decide(grant, view) is None
    view_a = GroupView(members=("A", "B"), jobs={"A": JobView(slots, 3, waiting={"rollout": 0}),
                                                  "B": JobView(slots, 3, waiting={"rollout": 0})})
    new, _ = decide(grant, view_a)
    assert new.pools["rollout"].turn.job == "A"
    # in the simulator: B's rollout (short) is done long before A's, but B trains only after A
    res = simulate_group_from_phases((0,), (0,), [spec("A", [10.0] * 4, 1.0, iterations=2),
                                                 spec("B", [1.0] * 4, 1.0, iterations=2)], tail_fraction=1.0)
    busy = sorted((i.start, i.job, i.iteration) for i in res.timeline if i.pool == "train" and i.kind == "busy")
    assert [(j, k) for _, j, k in busy] == [("A", 0), ("B", 0), ("A", 1), ("B", 1)]


@pytest.mark.parametrize("phases, sat", [
    ([(3.0, 1.0), (1.0, 3.0)], True),  # complementary: load 4 == cycle 4
    ([(3.0, 1.0), (3.0, 1.0)], True),  # both rollout-heavy: rollout pool is the bottleneck
    ([(2.0, 2.0), (1.0, 1.0)], False),  # load 3 < cycle 4
])
def test_saturation_rule_and_meta_iteration_agree_with_the_simulation(phases, sat) -> None:
    pts = [PhaseTimes(f"J{i}", r, t, r + t, 2.0) for i, (r, t) in enumerate(phases)]
    assert saturated(pts) is sat
    m = meta_iteration(pts)
    assert m.period_s == pytest.approx(max(load(pts), cycle(pts)))
    # the event simulation of the same group (one response per rollout, no switches) repeats
    # with that period once it is in steady state
    jobs = [spec(p.name, [p.rollout_s], p.train_s, iterations=8, lanes=1) for p in pts]
    res = simulate_group_from_phases((0,), (0,), jobs, tail_fraction=1.0, record=True)
    starts = sorted(i.start for i in res.timeline if i.pool == "rollout" and i.job == "J0")
    assert starts[-1] - starts[-2] == pytest.approx(m.period_s)


def _tail_jobs() -> list[dict]:
    long_tail = [1.0] * 14 + [20.0, 30.0]  # 14 short responses, two long ones
    return [spec("A", long_tail, 2.0, iterations=3, lanes=4), spec("B", long_tail, 2.0, iterations=3, lanes=4)]


def test_tail_migration_slots_move_only_after_release_and_every_response_finishes_once() -> None:
    res = simulate_group_from_phases((0, 1, 2, 3), (0,), _tail_jobs(), tail_fraction=0.8, tail_slots=1,
                                     switch={"rollout": 0.5, "migrate": 1.0})
    tails = [e for _, e in res.events if "reached its tail" in e]
    assert tails and all(re.search(r"keeps slots \[\d\], revoked \[\d", e) for e in tails)  # one slot kept
    # per slot, intervals of different jobs never overlap: a revoked slot is used by the next job
    # only after its holder migrated and released it
    by_slot: dict[tuple[str, int], list] = {}
    for i in res.timeline:
        by_slot.setdefault((i.pool, i.slot), []).append(i)
    for ivs in by_slot.values():
        ivs.sort(key=lambda i: (i.start, i.end))
        for a, b in zip(ivs, ivs[1:]):
            if a.job != b.job:
                assert b.start >= a.end - 1e-9, (a, b)
    migrate_ends = {(i.slot, i.job, i.iteration): i.end for i in res.timeline if i.kind == "migrate"}
    assert migrate_ends
    handed_over = 0
    for (slot, job, it), end in migrate_ends.items():
        nxt = [i for i in by_slot[("rollout", slot)] if i.job != job and i.start > end - 1.0 - 1e-9]
        assert all(i.start >= end - 1e-9 for i in nxt)  # not during the migration
        handed_over += bool(nxt)
    assert handed_over > 0
    for j in res.jobs.values():
        assert j.responses_finished == j.responses_expected == (16, 16, 16)
        assert j.migrated_responses > 0


def test_tail_migration_shortens_the_group() -> None:
    kw = dict(switch={"rollout": 0.5, "migrate": 1.0})
    with_tail = simulate_group_from_phases((0, 1, 2, 3), (0,), _tail_jobs(), tail_fraction=0.8, **kw)
    without = simulate_group_from_phases((0, 1, 2, 3), (0,), _tail_jobs(), tail_fraction=1.0, **kw)
    assert with_tail.makespan_s < without.makespan_s


def _profile(name: str, rollout: float, train: float, iterations: int = 5) -> JobProfile:
    return JobProfile(name, iterations, 1, 1, 4, ((rollout,) * 4,), (train,), rollout, train,
                      switch=SwitchCosts(0.5, 1.0, 0.0, 0.5))


def test_a_job_out_of_the_rotation_frees_its_slots_and_the_others_continue() -> None:
    sim = GroupSim(Pools((0, 1), (0,)), tail_fraction=0.8)
    for j in (_profile("A", 5.0, 2.0), _profile("B", 3.0, 4.0), _profile("C", 2.0, 2.0)):
        sim.add_job(j, 0.0)
    sim.run_until(9.0)
    sim.fail_job("A")
    assert all(h is None or h.job != "A" for p in ("rollout", "train") for h in sim.grant.pools[p].slots.values())
    sim.run_until(None)
    res = sim.result(solo_s={"A": 1.0, "B": 1.0, "C": 1.0})
    assert res.jobs["A"].failed and res.jobs["A"].finish_s is None
    for name in ("B", "C"):
        assert res.jobs[name].iterations_done == 5 and res.jobs[name].finish_s is not None
    assert any(e == "A failed" for _, e in res.events)
    assert max(i.end for i in res.timeline if i.job == "A") <= 9.0 + 1e-9


@pytest.mark.parametrize("join_at", [0.0, 1.0, 3.5, 6.0, 7.25, 11.0, 13.0, 17.5])
def test_a_job_joining_a_running_group_never_deadlocks(join_at: float) -> None:
    sim = GroupSim(Pools((0, 1), (0,)), tail_fraction=0.8)
    sim.add_job(_profile("A", 5.0, 2.0), 0.0)
    sim.add_job(_profile("B", 1.0, 4.0), 0.5)
    sim.add_job(_profile("C", 3.0, 3.0), join_at)
    sim.run_until(None)  # raises on a stall
    assert all(sim.jobs[n].finish_s is not None for n in "ABC")


def test_with_member_appends_in_admission_order() -> None:
    slots = {"rollout": (0,), "train": (0,)}
    grant, members = with_member(initial_grant(slots, ()), (), "A")
    view = GroupView(members=members, jobs={"A": JobView(slots, 3, waiting={"rollout": 0})})
    grant, _ = decide(grant, view)  # A's rollout turn; its training is still to come
    grant, members = with_member(grant, members, "B")
    grant, members = with_member(grant, members, "C")
    n = len(members)
    # rollout: B then C (A had its turn); train: A first (its rollout ran), then B, then C
    assert [members[(grant.pools["rollout"].cursor + i) % n] for i in range(n)] == ["B", "C", "A"]
    assert [members[(grant.pools["train"].cursor + i) % n] for i in range(n)] == ["A", "B", "C"]


def test_a_phase_completes_when_its_last_release_comes_after_its_slots_were_freed() -> None:
    """Tail migration leaves A's iteration-0 rollout on slot 1 only; slot 0's rank was never granted and
    releases it as skipped once the samples are all in -- here *after* slot 1 was released and freed
    (seen live when another job died holding slot 0 during its own tail). The phase must still
    complete, so A's training can be granted."""
    from dataclasses import replace

    from slurm_rl.mux.rotation import Holding, PoolGrant

    slots = {"rollout": (0, 1), "train": (2,)}
    grant = initial_grant({"rollout": (0, 1), "train": (2,)}, ("A",))
    rollout = PoolGrant(slots={0: None, 1: Holding("A", 0)}, turn=None, cursor=0)  # the tail's slot
    grant = replace(grant, pools={**grant.pools, "rollout": rollout},
                    started={"A": {"rollout": 0, "train": -1}})
    first = GroupView(members=("A",), jobs={"A": JobView(slots, 2, released={("rollout", 0): frozenset({1})})})
    grant, events = decide(grant, first)  # slot 1 released and freed; slot 0 not released yet
    assert grant.pools["rollout"].slots == {0: None, 1: None} and grant.done["A"]["rollout"] == -1, events
    late = GroupView(members=("A",), jobs={"A": JobView(slots, 2, waiting={"train": 0},
                                                        released={("rollout", 0): frozenset({0, 1})})})
    grant, events = decide(grant, late)
    assert grant.done["A"]["rollout"] == 0 and "A: rollout of iteration 0 complete" in events, events
    assert grant.pools["train"].turn == Holding("A", 0), events  # training is granted
