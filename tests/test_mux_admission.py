"""Conservative inter-group placement and admission control (admission.place)."""

from __future__ import annotations

import pytest

from slurm_rl.mux.admission import ClusterSpec, place
from slurm_rl.mux.analysis import residency_problems, slowdowns
from slurm_rl.mux.model import GroupModel, JobProfile, Pools, SwitchCosts

SW = SwitchCosts(rollout_warm_s=0.01, train_warm_s=0.01, cold_s=0.0, migrate_s=0.0)


def job(name: str, rollout: float, train: float, slo: float = 1.5, responses: int = 4, lanes: int = 4,
        max_response: float | None = None, train_slots: int = 1, rollout_slots: int = 1,
        train_bytes: float = 1e11) -> JobProfile:
    """Every response takes ``rollout`` seconds (a single wave when responses <= lanes)."""
    return JobProfile(name, 10, rollout_slots, train_slots, lanes, ((rollout,) * responses,), (train,),
                      max_response if max_response is not None else rollout, train, slo=slo,
                      rollout_bytes_per_slot=1e10, train_bytes_per_slot=train_bytes, switch=SW)


def group(*members: JobProfile, rollout: int = 1, train: int = 1, gid: int = 0) -> GroupModel:
    return GroupModel(Pools(tuple(range(rollout)), tuple(range(train))), members, gid=gid)


def test_direct_into_a_complementary_group_costs_nothing() -> None:
    a = job("A", 3.0, 1.0)
    b = job("B", 1.0, 3.0)
    p = place(b, [group(a)])
    assert p.kind == "direct" and p.group == 0 and p.delta_cost_per_h == 0.0
    assert set(p.slowdowns) == {"A", "B"} and max(p.slowdowns.values()) < 1.2  # B also waits one turn


def test_scaled_when_more_rollout_slots_keep_the_slos() -> None:
    # throughput-bound rollouts: 8 responses, one lane per slot -> 8 waves on one slot
    a = job("A", 1.0, 2.0, slo=1.3, responses=8, lanes=1)
    b = job("B", 1.0, 2.0, slo=1.3, responses=8, lanes=1)
    p = place(b, [group(a)])
    assert p.kind == "scaled" and p.added_rollout_slots == 1
    assert p.delta_cost_per_h == pytest.approx(8 * 1.0)  # one H20 node
    assert all(s <= 1.3 for s in p.slowdowns.values())


def test_new_group_when_no_group_fits() -> None:
    big = job("big", 2.0, 2.0, train_slots=2)
    p = place(big, [group(job("A", 3.0, 1.0))])
    assert p.kind == "new" and p.group is None and p.train_slots == (0, 1)
    assert p.rejected == {"train_pool": 1}
    assert p.delta_cost_per_h == pytest.approx(8 * 1.0 + 2 * 8 * 2.85)
    assert place(big, []).kind == "new"


def test_refused_on_slo_with_the_reason() -> None:
    p = place(job("X", 1.0, 1.0, slo=0.9), [])
    assert p.kind == "refused" and p.reason.startswith("SLO: even alone")


def test_refused_on_residency_with_the_reason() -> None:
    p = place(job("X", 1.0, 1.0, train_bytes=2e12), [], ClusterSpec(host_bytes_per_slot=1e12))
    assert p.kind == "refused" and p.reason.startswith("residency: even alone") and "host memory" in p.reason


def test_a_full_group_is_turned_down_for_residency() -> None:
    a = job("A", 3.0, 1.0, train_bytes=6e11)
    b = job("B", 1.0, 3.0, train_bytes=6e11)
    g = group(a)
    assert residency_problems(g.with_member(b)) != []
    p = place(b, [g])
    assert p.kind == "new" and p.rejected == {"residency": 1}


def test_existing_members_keep_their_slo() -> None:
    a = job("A", 3.0, 1.0, slo=1.0)  # no slowdown tolerated: any switch breaks it
    b = job("B", 1.0, 3.0, slo=2.0)
    assert slowdowns(group(a).with_member(b)).slowdown["A"] > 1.0
    p = place(b, [group(a)])
    assert p.kind == "new" and p.rejected == {"slo": 1}
    # the same newcomer goes into a group whose member tolerates it
    p2 = place(b, [group(a, gid=0), group(job("A2", 3.0, 1.0, slo=1.5), gid=1)])
    assert p2.kind == "direct" and p2.group == 1


def test_max_length_check_alone_misses_what_expected_times_reveal() -> None:
    # A's responses are far below its max length: its real solo time is short, B's phases dominate
    a = job("A", 0.1, 1.0, slo=1.7, max_response=10.0)
    b = job("B", 5.0, 1.0, slo=3.0)
    g = group(b)
    assert place(a, [g], ClusterSpec(slo_check="conservative")).kind == "direct"
    strict = place(a, [g], ClusterSpec(slo_check="both"))
    assert strict.kind == "new" and strict.rejected == {"slo": 1}


def test_lifetime_cost_prefers_a_new_group_over_keeping_a_big_group_alive() -> None:
    # a long small job would keep a four-node group (whose member is about to finish) alive
    big = job("big", 1.0, 3.0, train_slots=4, rollout_slots=4)
    small = JobProfile("small", 100, 1, 1, 4, ((3.0,) * 4,), (1.0,), 3.0, 1.0, slo=2.0, switch=SW)
    g = GroupModel(Pools(tuple(range(4)), tuple(range(4))), (big,), remaining={"big": 1})
    assert place(small, [g], ClusterSpec(cost_basis="rate")).kind == "direct"
    assert place(small, [g], ClusterSpec(cost_basis="lifetime")).kind == "new"


def test_verdicts_name_the_constraint_each_group_put_up() -> None:
    """Each existing group's verdict: train pool too small, SLO broken by saturation or by the
    cycle, or admissible; the arrival's binding constraint is the weakest one."""
    from slurm_rl.mux.cluster_sim import binding_constraint

    newcomer = job("N", 3.0, 1.0, slo=1.2)
    groups = [group(job("A", 3.0, 1.0), gid=0),  # rollout-bound together: 6 s per lap > 4 * 1.2
              group(job("B", 10.0, 10.0, slo=3.0), gid=1),  # B's 20 s cycle stretches N's 4 s
              group(job("C", 1.0, 3.0), train=2, gid=2)]
    big = job("big", 2.0, 2.0, train_slots=2)
    p = place(newcomer, groups, ClusterSpec(max_added_rollout_slots=0))
    verdict = {v["group"]: v["verdict"] for v in p.verdicts}
    assert verdict[0] == "saturation/conservative" and verdict[1] == "slo_cycle/conservative"
    assert verdict[2] == "direct" and p.kind == "direct" and binding_constraint(p) == "-"
    q = place(newcomer, groups[:2], ClusterSpec(max_added_rollout_slots=0))
    assert q.kind == "new" and binding_constraint(q) == "slo_cycle/conservative"
    r = place(big, groups)
    assert {v["verdict"] for v in r.verdicts if v["group"] != 2} == {"train_pool"}
    assert binding_constraint(place(big, groups[:2])) == "train_pool"
    assert binding_constraint(place(newcomer, [])) == "no group"


def test_delta_basis_packs_directly_where_the_lifetime_basis_opens_a_group() -> None:
    """RollMux's Delta = 0: a group joined as it is adds nothing per hour, so an admissible direct
    placement wins; over the group's life the newcomer's slowing of a long member costs more than
    a short-lived group of its own, so ``lifetime`` opens one."""
    from dataclasses import replace

    long = replace(job("L", 100.0, 100.0, slo=2.0), iterations=1000)
    short = replace(job("S", 150.0, 20.0, slo=3.0), iterations=10)
    g = [group(long)]
    assert place(short, g, ClusterSpec(cost_basis="lifetime")).kind == "new"
    d = place(short, g, ClusterSpec(cost_basis="delta"))
    assert d.kind == "direct" and d.delta_cost_per_h == 0.0 and all(
        s <= {"L": 2.0, "S": 3.0}[n] for n, s in d.slowdowns.items())
