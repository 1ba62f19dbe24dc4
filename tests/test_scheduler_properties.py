"""Properties of the auto and plan policies over generated states (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_profiles import examples

from slurm_rl.scheduler.history import NUM_BUCKETS, DecodeFit, History

from slurm_rl.scheduler.placement_ops import placement_problems
from slurm_rl.scheduler.policies import decide_auto, decide_plan, starved_components
from slurm_rl.scheduler.state import (
    ActorProgress,
    BatchSpec,
    InferenceProgress,
    PolicyConfig,
    RolloutProgress,
    SchedState,
    derive_phase,
    valid_dp_sizes,
)


@st.composite
def placements(draw: st.DrawFn, world: int, cfg: PolicyConfig, dps: list[int],
               allow_empty_actor: bool, ordered: bool) -> dict[str, tuple[int, ...]]:
    """A usable placement: valid actor DP, whole rollout instances, the rest inference/idle."""
    ranks = list(range(world))
    if not ordered:
        ranks = draw(st.permutations(ranks))
    atp, rtp = cfg.actor_ranks_per_instance, cfg.rollout_ranks_per_instance
    room = world - (rtp + 1 if ordered else 1)  # the initial placement holds every component
    choices = [dp for dp in dps if dp * atp <= room] + ([0] if allow_empty_actor else [])
    dp = draw(st.sampled_from(choices))
    actor, rest = ranks[:dp * atp], ranks[dp * atp:]
    if ordered:  # the initial placement holds every component
        n_inst = draw(st.integers(1, (len(rest) - 1) // rtp))
    else:
        n_inst = draw(st.integers(0, len(rest) // rtp))
    rollout, rest = rest[:n_inst * rtp], rest[n_inst * rtp:]
    n_inf = draw(st.integers(1 if ordered else 0, len(rest)))
    return {"actor": tuple(actor), "rollout": tuple(rollout), "inference": tuple(rest[:n_inf])}


@st.composite
def states(draw: st.DrawFn) -> SchedState:
    rtp = draw(st.sampled_from([1, 2]))
    atp = draw(st.sampled_from([1, 2]))
    world = draw(st.integers(3, 16).map(lambda n: 2 * n))
    mbs = draw(st.sampled_from([1, 2, 4]))
    gbs = mbs * draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]))
    n_mb = draw(st.integers(1, 6))
    total = gbs * n_mb
    cfg = PolicyConfig(
        max_running_requests=draw(st.integers(1, 64)),
        rollout_ranks_per_instance=rtp, actor_ranks_per_instance=atp,
        pre_process_threshold=draw(st.sampled_from([0.25, 0.5, 0.75])),
        use_pre_process_policy=draw(st.booleans()),
        use_wait_before_last_iter_policy=draw(st.booleans()))
    dps = valid_dp_sizes(gbs, mbs, world // atp)
    initial = draw(placements(world, cfg, dps, allow_empty_actor=False, ordered=True))
    current = draw(placements(world, cfg, dps, allow_empty_actor=True, ordered=False))
    finished = draw(st.integers(0, total))
    running = draw(st.integers(0, total - finished))
    pending = total - finished - running
    inf_done = draw(st.integers(0, finished))
    mb_done = draw(st.integers(0, inf_done // gbs))
    busy = draw(st.booleans()) if mb_done < n_mb and inf_done - mb_done * gbs >= gbs else False
    rollout = RolloutProgress(running, pending, finished, total)
    actor = ActorProgress(mb_done * gbs, total, mb_done, n_mb, busy)
    history = draw(st.one_of(st.none(), histories()))
    return SchedState(
        iteration=draw(st.integers(0, 2)), num_iterations=3, phase=derive_phase(rollout, actor),
        world_ranks=tuple(range(world)), initial=initial, current=current, rollout=rollout,
        inference=InferenceProgress(inf_done, total), actor=actor,
        batch=BatchSpec(gbs, mbs, total), cfg=cfg, history=history,
        elapsed_s=draw(st.floats(0.0, 500.0)))


@st.composite
def histories(draw: st.DrawFn) -> History:
    """What a run may have measured: any lengths, decode line, mini-batch and inference speeds."""
    counts = draw(st.lists(st.integers(0, 50), min_size=NUM_BUCKETS, max_size=NUM_BUCKETS))
    alpha = draw(st.floats(1e-4, 0.1))
    beta = draw(st.floats(0.0, 0.01))
    fit = DecodeFit().add(1, alpha + beta, 1.0).add(64, alpha + 64 * beta, 1.0)
    mbs = tuple((draw(st.sampled_from([1, 2, 4, 8])), draw(st.floats(0.01, 500.0)), draw(st.integers(0, 10**6)))
                for _ in range(draw(st.integers(0, 3))))
    curve = tuple(sorted(draw(st.lists(st.floats(0.0, 300.0), min_size=10, max_size=10))))
    return History(iterations_done=draw(st.integers(0, 3)), lengths=tuple(counts), decode=fit,
                   minibatches=mbs, inference=(draw(st.floats(0.0, 1e4)), draw(st.floats(0.0, 1e4))),
                   curve=draw(st.sampled_from([(), curve])), switches=(draw(st.floats(0.0, 30.0)),),
                   longest=draw(st.integers(0, 20000)))


POLICIES = {"auto": decide_auto, "plan": decide_plan}


def _actor_may_be_empty(s: SchedState, policy: str) -> bool:
    if policy == "plan":  # plan lends the actor's GPUs until its first mini-batch
        return (s.actor.minibatches_done == 0 and not s.actor.busy) or s.actor.minibatches_done >= s.actor.minibatches_total
    return s.cfg.use_pre_process_policy or s.actor.minibatches_done >= s.actor.minibatches_total


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=states())
def test_decision_is_a_usable_placement(policy: str, s: SchedState) -> None:
    """Never assigns a GPU twice, never leaves the allocation, always a valid actor DP."""
    d = POLICIES[policy](s)
    if d is None:
        return
    problems = placement_problems(d.placement, s.world_ranks, s.cfg, s.batch.global_batch_size,
                                  s.batch.micro_batch_size,
                                  allow_empty_actor=_actor_may_be_empty(s, policy))
    assert problems == [], (d, problems)
    assert set(d.migrate_from) <= set(s.current["rollout"])
    assert not set(d.migrate_from) & set(d.placement["rollout"])


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=states())
def test_no_component_with_work_is_starved(policy: str, s: SchedState) -> None:
    """After the decision, every component that still has work holds ranks."""
    d = POLICIES[policy](s)
    if policy == "plan":  # plan holds the actor back like the pre-process policy
        s = SchedState(**{**s.__dict__, "cfg": PolicyConfig(**{**s.cfg.__dict__, "use_pre_process_policy": True})})
    placement = s.current if d is None else d.placement
    if s.phase in ("start", "end"):
        return  # between iterations the iteration-start placement is restored as a whole
    assert starved_components(s, placement) == [], (s, d)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=states())
def test_decisions_converge(policy: str, s: SchedState) -> None:
    """Level-triggered: applying a decision and asking again reaches a fixed point quickly."""
    decide = POLICIES[policy]
    for _ in range(4):
        d = decide(s)
        if d is None:
            return
        s = SchedState(**{**s.__dict__, "current": d.placement})
    assert decide(s) is None


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=states())
def test_plan_keeps_rollout_and_inference_from_growing_mid_iteration(s: SchedState) -> None:
    """Inside an iteration plan only shrinks rollout and inference (the runtime refuses growth)."""
    d = decide_plan(s)
    if d is None or d.boundary == "iteration" or s.phase in ("start", "end") or d.reason.startswith("plan repair"):
        return
    for comp in ("rollout", "inference"):
        assert set(d.placement[comp]) <= set(s.current[comp]), (comp, s, d)
