"""The ``plan`` policy: its forecast, the history it learns from, its decisions, its simulated runs."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from slurm_rl.scheduler import defaults
from slurm_rl.scheduler.forecast import Forecast, LengthForecast, piecewise_seconds, quantiles
from slurm_rl.scheduler.history import (
    NUM_BUCKETS,
    DecodeFit,
    History,
    Tick,
    length_bucket,
)
from slurm_rl.scheduler.recorder import HistoryRecorder
from slurm_rl.scheduler.placement_ops import placement_problems
from slurm_rl.scheduler.policies import decide_auto, decide_plan, make_policy
from slurm_rl.scheduler.policies.plan import collocated_forecast_s, collocated_spare_gpu_s
from slurm_rl.scheduler.policies.plan import plan_start_placement
from slurm_rl.config import config_from_mapping
from slurm_rl.scheduler.profiles import PROFILES, math_rl
from slurm_rl.scheduler.simulate import simulate
from slurm_rl.scheduler.state import (
    ActorProgress,
    BatchSpec,
    InferenceProgress,
    PolicyConfig,
    RolloutProgress,
    SchedState,
    derive_phase,
)

INITIAL = {"actor": (0, 1), "rollout": (2, 3, 4, 5), "inference": (6, 7)}
TOTAL, GBS = 1024, 256


def hist_of(lengths: list[int]) -> tuple[int, ...]:
    h = [0] * NUM_BUCKETS
    for n in lengths:
        h[length_bucket(n)] += 1
    return tuple(h)


def lognormal_lengths(n: int, mean: float = 1000.0, sigma: float = 1.0, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    mu = math.log(mean) - sigma ** 2 / 2
    return [max(1, min(16384, int(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def learned_history(alpha: float = 0.006, beta: float = 0.0002, mb_s: float = 40.0) -> History:
    """A history as after one iteration: lengths, a decode line, mini-batches at DP 2 and 4,
    inference speed, a completion curve, switch latencies."""
    fit = DecodeFit()
    for b in (4, 16, 64):
        fit = fit.add(b, alpha + beta * b, 1.0)
    lengths = lognormal_lengths(TOTAL)
    return History(iterations_done=1, lengths=hist_of(lengths), decode=fit,
                   minibatches=((2, mb_s, 1000), (4, mb_s / 2, 1000)), inference=(TOTAL, 20.0),
                   curve=tuple(10.0 * (i + 1) for i in range(10)), iteration_s=(200.0,),
                   switches=(0.5,), longest=max(lengths))


def state(*, running: int = 0, pending: int = 0, finished: int | None = None, inference_done: int = 0,
          mb_done: int = 0, busy: bool = False, current: dict | None = None, phase: str | None = None,
          history: History | None = None, elapsed_s: float = 0.0, iteration: int = 1) -> SchedState:
    finished = TOTAL - running - pending if finished is None else finished
    rollout = RolloutProgress(running, pending, finished, TOTAL)
    actor = ActorProgress(mb_done * GBS, TOTAL, mb_done, TOTAL // GBS, busy)
    return SchedState(iteration=iteration, num_iterations=3, phase=phase or derive_phase(rollout, actor),
                      world_ranks=tuple(range(8)), initial=INITIAL, current=current or INITIAL,
                      rollout=rollout, inference=InferenceProgress(inference_done, TOTAL), actor=actor,
                      batch=BatchSpec(GBS, 4, TOTAL), cfg=PolicyConfig(max_running_requests=64),
                      elapsed_s=elapsed_s, history=history)


# -- forecast ------------------------------------------------------------------------------------

def test_length_quantiles_follow_the_histogram() -> None:
    lengths = lognormal_lengths(20000, seed=1)
    lf = LengthForecast.from_hist(hist_of(lengths))
    ordered = sorted(lengths)
    for p in (0.1, 0.5, 0.9, 0.99):
        exact = ordered[int(p * len(ordered))]
        assert abs(lf.quantile(p) / exact - 1) < 0.2, (p, lf.quantile(p), exact)  # a bucket is 19 % wide
    assert abs(lf.mean / (sum(lengths) / len(lengths)) - 1) < 0.05
    for n in (100, 1000, 5000):
        assert abs(lf.quantile(lf.cdf(n)) / n - 1) < 0.05
    assert quantiles((), [0.5]) is None


def test_cold_start_extrapolates_the_unfinished_tail() -> None:
    lengths = sorted(lognormal_lengths(4000, seed=2))
    seen = lengths[:2000]  # half finished: the shorter half
    lf = LengthForecast.from_hist(hist_of(seen), known_fraction=0.5)
    assert lf.quantile(0.25) < lf.quantile(0.75) < lf.quantile(0.99)
    assert lf.quantile(0.9) > max(seen) * 0.8  # the tail reaches past what finished so far
    assert abs(lf.quantile(0.9) / lengths[3600] - 1) < 0.5
    # with no longest response of an earlier iteration, the forecast's longest is the expected
    # longest of the iteration's samples (the lognormal itself has no end)
    fit = DecodeFit().add(4, 0.007, 1.0)
    h = History(current_lengths=hist_of(seen), decode=fit, minibatches=((2, 40.0, 1000),))
    fc = Forecast.fit(h, 4000, 2000, 64, 0.5)
    assert fc is not None and fc.length(1.0) == pytest.approx(lf.quantile(1 - 0.5 / 4000))
    assert max(lengths) / 3 < fc.length(1.0) < max(lengths) * 3
    assert fc.rollout_view(4000, 2, 0).seconds(4) < 0.007 * max(lengths) * 3


def test_decode_line_recovers_the_cost_law() -> None:
    fit = DecodeFit()
    for b in range(1, 65):
        fit = fit.add(b, 0.0064 + 0.000233 * b, 0.5)
    alpha, beta = fit.line()  # type: ignore[misc]
    assert alpha == pytest.approx(0.0064, rel=1e-6) and beta == pytest.approx(0.000233, rel=1e-6)
    one_load = DecodeFit().add(64, 0.02, 1.0).add(64, 0.02, 1.0)
    assert one_load.line() == pytest.approx((0.02, 0.0))  # no spread benefit assumed
    assert DecodeFit().line() is None


def test_minibatch_fit_recovers_scaling_and_normalises_tokens() -> None:
    h = dataclasses.replace(learned_history(), minibatches=(
        (2, 100.0 / 2 ** 0.9, 1000), (4, 200.0 / 4 ** 0.9, 2000), (8, 100.0 / 8 ** 0.9, 1000)))
    fc = Forecast.fit(h, TOTAL, TOTAL, 64, 0.5)
    assert fc is not None
    assert fc.mb_scaling == pytest.approx(0.9, abs=1e-6)
    assert fc.minibatch_s(1) == pytest.approx(100.0 * 4000 / 3 / 1000, rel=1e-6)  # mean tokens 1333


def test_rollout_forecast_more_instances_never_slower() -> None:
    fc = Forecast.fit(learned_history(), TOTAL, TOTAL, 64, 0.5)
    assert fc is not None
    for running, pending, finished, elapsed in ((256, 768, 0, 0.0), (200, 0, 824, 30.0), (5, 0, 1019, 60.0)):
        view = fc.rollout_view(TOTAL, running, pending)
        times = [view.seconds(k) for k in (1, 2, 4, 8)]
        assert all(a >= b - 1e-9 for a, b in zip(times, times[1:])), times
        assert view.seconds(0) == math.inf
    assert fc.rollout_view(TOTAL, 0, 0).seconds(4) == 0.0


def reference_rollout(lengths: list[int], k: int, m: int, alpha: float, beta: float,
                      cut: tuple[float, int] | None = None,
                      every: float = 5.0) -> tuple[float, list[tuple[float, int, int, int, int]]]:
    """A rollout by brute force: FIFO dispatch onto ``k`` instances of ``m`` slots, a decode step
    of ``alpha + beta * running`` per instance; ``cut = (t, k2)`` moves the running requests onto
    ``k2`` instances at ``t``. Its end and snapshots (t, running, pending, finished, instances)."""
    inst: list[list[float]] = [[] for _ in range(k)]
    pending, t, finished, snaps, nxt = list(reversed(lengths)), 0.0, 0, [], 0.0
    while pending or any(inst):
        if cut and t >= cut[0] and len(inst) != cut[1]:
            flat = [r for x in inst for r in x]
            inst = [flat[i::cut[1]] for i in range(cut[1])]
        for x in inst:
            while len(x) < m and pending:
                x.append(float(pending.pop()))
        if t >= nxt:
            snaps.append((t, sum(map(len, inst)), len(pending), finished, len(inst)))
            nxt += every
        dt = min(min(x) * (alpha + beta * len(x)) for x in inst if x)
        dt = min(dt, nxt - t, cut[0] - t if cut and t < cut[0] else math.inf)
        for i, x in enumerate(inst):
            if x:
                left = [r - dt / (alpha + beta * len(x)) for r in x]
                inst[i] = [r for r in left if r > 1e-6]
                finished += len(x) - len(inst[i])
        t += dt
    return t, snaps


@pytest.mark.parametrize("k, cut", [(8, None), (24, None), (24, (60.0, 8))])
def test_rollout_forecast_follows_a_brute_force_rollout(k: int, cut: tuple[float, int] | None) -> None:
    # 4096 requests; 8 instances turn their slots over 8 times, 24 barely twice; the cut moves
    # the tail onto fewer instances after the queue drained (the forecast knows the instances then)
    n, m, alpha, beta = 4096, 64, 0.006, 0.0002
    lengths = lognormal_lengths(n, seed=3)
    fit = DecodeFit()
    for load in (4, 16, 64):
        fit = fit.add(load, alpha + beta * load, 1.0)
    h = History(iterations_done=1, lengths=hist_of(lengths), decode=fit, minibatches=((2, 40.0, 1000),),
                longest=max(lengths))
    fc = Forecast.fit(h, n, n, m, 0.5)
    end, snaps = reference_rollout(lengths, k, m, alpha, beta, cut)
    ratios = []
    for t, running, pending, _, instances in snaps:
        if end - t >= 0.25 * end:  # the last requests alone are a coin toss
            view = dataclasses.replace(fc, drain_instances=0 if pending else k).rollout_view(n, running, pending)
            ratios.append((end - t) / view.seconds(instances))
    assert len(ratios) >= 10 and all(0.85 <= r <= 1.15 for r in ratios), [round(r, 2) for r in ratios]


def test_rollout_on_changing_instances_is_a_piecewise_forecast() -> None:
    # 100 instance-seconds of work: a fifth done on 4 instances by t = 5, the rest on 2
    assert piecewise_seconds(lambda k: 100.0 / k, 4, [(2, 5.0)]) == pytest.approx(5.0 + 0.8 * 50.0)
    assert piecewise_seconds(lambda k: 100.0 / k, 4, [(2, 30.0)]) == pytest.approx(25.0)  # done before


def test_forecast_needs_measurements() -> None:
    assert Forecast.fit(History(), TOTAL, 0, 64, 0.5) is None
    no_minibatch = dataclasses.replace(learned_history(), minibatches=())
    assert Forecast.fit(no_minibatch, TOTAL, TOTAL, 64, 0.5) is None


# -- history ----------------------------------------------------------------------------------------

def tick(iteration: int, elapsed: float, finished: int, **kw) -> Tick:
    base = dict(iteration=iteration, elapsed_s=elapsed, samples=100, finished=finished,
                inference_done=kw.pop("inference_done", 0), groups_ready=finished, inference_gpus=2,
                max_running=8, running=min(8, 100 - finished), instances=2,
                inference_busy_gpu_s=kw.pop("busy", 0.0), lengths=hist_of([50] * finished))
    base.update(kw)
    return Tick(**base)  # type: ignore[arg-type]


def test_recorder_folds_an_iteration_into_the_history() -> None:
    rec = HistoryRecorder()
    for i in range(11):
        rec.observe(tick(0, 2.0 * i, 10 * i, inference_done=10 * i, busy=1.0 * i,
                         decode=((4.0, 0.01),), minibatch=(2, 3.0, 100) if i == 5 else None,
                         switch_s={3: 0.4, 6: 2.4}.get(i), switch_fraction=0.5 if i == 6 else 0.0,
                         longest=50))
    h = rec.end_iteration(25.0)
    assert h.iterations_done == 1 and h.iteration_s == (25.0,)
    assert sum(h.lengths) == 100 and h.current_lengths == ()
    assert h.curve == tuple(2.0 * i for i in range(1, 11))
    assert h.curve_work == tuple(2 * 2.0 * i for i in range(1, 11))  # 2 instances all along
    assert h.inference == (100.0, 10.0)
    assert h.minibatches == ((2, 3.0, 100),) and h.switches == (0.4,)
    assert h.reshards == ((0.5, 2.4),)  # the growth that moved half the actor's state
    assert h.state_move_s(h.switch_s) == pytest.approx((2.4 - 0.4) / 0.5)
    assert h.decode.line() == pytest.approx((0.01, 0.0))
    assert h.longest == 50
    again = rec.observe(tick(0, 30.0, 100))  # a late tick of the closed iteration changes nothing
    assert again == h
    rec.observe(tick(1, 1.0, 10))
    assert rec.history.iterations_done == 1 and sum(rec.history.current_lengths) == 10
    assert History.from_json(h.to_json()) == h


def test_a_resumed_recorder_ignores_the_iterations_its_history_holds() -> None:
    """A run stopped at the gate of iteration 2 and resumed: its ranks' progress files may still report
    iteration 1 when the resumed coordinator starts observing. Folding those ticks in again counted
    iteration 1 twice (``iterations_done`` 5 after 4 iterations, seen once in a whole-suite run of
    tests/test_plan_live.py's resumed ``plan`` run)."""
    first = HistoryRecorder()
    for k in range(2):
        for i in range(3):
            first.observe(tick(k, 1.0 * i, 50 * i))
        first.end_iteration(3.0)
    saved = History.from_json(first.history.to_json())
    rec = HistoryRecorder(saved, first_iteration=2)
    assert rec.observe(tick(1, 5.0, 100)) == saved  # a stale tick of iteration 1
    for k in (2, 3):
        for i in range(3):
            rec.observe(tick(k, 1.0 * i, 50 * i))
        rec.end_iteration(3.0)
    assert rec.history.iterations_done == 4 and len(rec.history.iteration_s) == 4


def test_completion_curve_in_instance_seconds_counts_the_tail_at_the_drain() -> None:
    rec = HistoryRecorder()
    # 4 instances while requests queue; the queue drains at 5 s (finished + running = all), then
    # the actor takes 3 instances: the tail still counts on the 4 there were at the drain
    for i in range(11):
        rec.observe(tick(0, 1.0 * i, 10 * i, running=40 if i < 5 else 100 - 10 * i,
                         instances=4 if i <= 5 else 1))
    h = rec.end_iteration(12.0)
    assert h.curve == tuple(1.0 * i for i in range(1, 11))
    assert h.curve_work == tuple(4.0 * i for i in range(1, 11))


# -- decisions -------------------------------------------------------------------------------------

def test_cold_start_uses_rlinf_rules_with_pre_process() -> None:
    start = state(pending=TOTAL, finished=0, phase="start", iteration=0)
    d = decide_plan(start)
    assert d is not None and d.boundary == "iteration"
    assert d.placement == {"actor": (), "rollout": (0, 1, 2, 3, 4, 5), "inference": (6, 7)}
    lent = {"actor": (), "rollout": (0, 1, 2, 3, 4, 5), "inference": (6, 7)}
    d = decide_plan(state(running=100, finished=700, inference_done=300, current=lent, iteration=0))
    assert d is not None and "cold start" in d.reason
    assert d.placement["actor"] == (0, 1)  # pre-process: the actor comes back on its own ranks


def test_cold_start_actor_comes_back_once_its_first_data_is_in() -> None:
    # the rules would start the actor (half the requests outstanding), but no mini-batch of data
    # came out of inference yet: its GPUs keep decoding; the rules apply once the data is in
    lent = {"actor": (), "rollout": (0, 1, 2, 3, 4, 5), "inference": (6, 7)}
    early = state(running=300, pending=200, inference_done=GBS - 1, current=lent, iteration=0)
    assert decide_auto(dataclasses.replace(early, cfg=dataclasses.replace(early.cfg, use_pre_process_policy=True)))
    assert decide_plan(early) is None
    d = decide_plan(dataclasses.replace(early, inference=InferenceProgress(GBS, TOTAL)))
    assert d is not None and "cold start" in d.reason and d.placement["actor"] == (0, 1)
    # live, inference scores samples as they come: the complete groups at the cutter decide
    scored = dataclasses.replace(early, inference=InferenceProgress(2 * GBS, TOTAL),
                                 actor=dataclasses.replace(early.actor, samples_ready=GBS - 16))
    assert decide_plan(scored) is None
    ready = dataclasses.replace(scored, actor=dataclasses.replace(early.actor, samples_ready=GBS))
    assert decide_plan(ready) is not None


def test_iteration_start_shrinks_inference_that_keeps_pace() -> None:
    s = state(pending=TOTAL, finished=0, phase="start", history=learned_history())
    start = plan_start_placement(s)
    assert start["actor"] == ()
    assert len(start["inference"]) == 1 and start["inference"] == (7,)
    assert start["rollout"] == (0, 1, 2, 3, 4, 5, 6)
    slow = dataclasses.replace(learned_history(), inference=(TOTAL, 400.0))  # inference 20x slower
    assert plan_start_placement(dataclasses.replace(s, history=slow))["inference"] == (6, 7)


def test_held_actor_waits_while_it_has_slack_and_starts_when_critical() -> None:
    lent = {"actor": (), "rollout": (0, 1, 2, 3, 4, 5, 6), "inference": (7,)}
    early = state(running=448, pending=176, finished=400, inference_done=300, current=lent,
                  history=learned_history(mb_s=1.0), elapsed_s=5.0)
    assert decide_plan(early) is None  # cheap actor, far from the tail: rollout keeps the GPUs
    no_data = state(running=448, pending=476, finished=100, current=lent,
                    history=learned_history(mb_s=400.0), elapsed_s=5.0)
    assert decide_plan(no_data) is None  # its first mini-batch is not in for another ~20 s
    # an expensive actor and a long tail ahead (decode 10x slower; its 200 longest requests share
    # the instances, so fewer of them slow it little): start on part of the GPUs
    critical = state(running=200, pending=0, inference_done=500, current=lent,
                     history=learned_history(mb_s=400.0, alpha=0.06), elapsed_s=200.0)
    d = decide_plan(critical)
    assert d is not None and "forecast end" in d.reason
    assert set(INITIAL["actor"]) <= set(d.placement["actor"])
    assert set(d.migrate_from) == set(lent["rollout"]) - set(d.placement["rollout"])
    assert d.boundary == "minibatch"
    assert d.placement["inference"] == (7,)  # inference keeps its ranks until it finished


def test_held_actor_waits_for_the_data_when_every_gpu_then_wins() -> None:
    # an expensive actor (400 s a mini-batch at DP 2) and a short rollout ahead: starting on part
    # of the GPUs would lock a mini-batch onto them, so the actor waits and then takes all 8
    lent = {"actor": (), "rollout": (0, 1, 2, 3, 4, 5, 6), "inference": (7,)}
    short = state(running=448, pending=176, finished=400, inference_done=300, current=lent,
                  history=learned_history(mb_s=400.0), elapsed_s=5.0)
    assert decide_plan(short) is None
    # rollout done, inference about to finish: wait for its rank rather than start on DP 4
    almost = state(finished=TOTAL, inference_done=TOTAL - 8, current={**lent, "rollout": ()},
                   history=learned_history(mb_s=400.0), elapsed_s=60.0)
    assert decide_plan(almost) is None
    done = dataclasses.replace(almost, inference=InferenceProgress(TOTAL, TOTAL))
    d = decide_plan(done)
    assert d is not None and d.placement["actor"] == tuple(range(8))


def test_switch_forecast_charges_the_state_that_moves() -> None:
    h = dataclasses.replace(learned_history(), switches=(0.5,), reshards=((0.5, 10.5), (0.75, 15.5)))
    fc = Forecast.fit(h, TOTAL, 0, 64, 0.1)
    assert fc is not None and fc.state_move_s == pytest.approx(20.0)
    assert fc.switch(2, 8) == pytest.approx(0.5 + 20.0 * 0.75)
    assert fc.switch(8, 2) == pytest.approx(0.5)  # shrinking (or coming back onto holders) moves nothing


def test_finished_components_give_every_rank_to_the_actor() -> None:
    cur = {"actor": (0, 1, 2, 3), "rollout": (4, 5), "inference": (6, 7)}
    d = decide_plan(state(finished=TOTAL, inference_done=TOTAL, mb_done=3, current=cur,
                          history=learned_history(), elapsed_s=100.0))
    assert d is not None
    assert d.placement == {"actor": tuple(range(8)), "rollout": (), "inference": ()}
    assert decide_plan(state(running=10, finished=TOTAL - 10, mb_done=1, busy=True, current=cur,
                             history=learned_history(), elapsed_s=50.0)) is None  # inside a mini-batch


def test_make_policy_knows_plan() -> None:
    assert make_policy("plan", PolicyConfig()) is decide_plan


# -- simulated runs --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def math8_runs() -> dict:
    doc = math_rl(8, num_iterations=3)
    doc["scheduler"]["time_slicing"] = False  # plan's own disaggregated schedule (its collocated iterations: below)
    cfg = config_from_mapping(doc)
    return {p: simulate(cfg, policy=p) for p in ("static", "auto+pre_process", "plan")}


def test_plan_beats_static_and_the_rules_after_it_learned(math8_runs: dict) -> None:
    static, rules, plan = (math8_runs[p] for p in ("static", "auto+pre_process", "plan"))
    assert plan.total_time_s < 0.75 * static.total_time_s
    # iteration 0 is a cold start (RLinf's rules); from then on the forecast decides
    assert "cold start" in " ".join(d["reason"] for d in plan.iterations[0].decisions)
    learned = [d["reason"] for it in plan.iterations[1:] for d in it.decisions]
    assert any(r.startswith("plan: actor") for r in learned)
    assert not any("cold start" in r for r in learned)
    # each decision of the receding horizon says when it expects the iteration to end (the rules forecast
    # nothing): after the decision, and within a fifth of the iteration's actual end
    for it in plan.iterations[1:]:
        said = [d for d in it.decisions if "forecast end in" in d["reason"]]
        assert said and all("forecast_end_s" in d for d in said)
        for d in said:
            ahead = float(d["reason"].split("forecast end in ")[1].split("s")[0])
            assert d["forecast_end_s"] == pytest.approx(d["t"] + ahead, abs=0.1), d
            assert abs(d["forecast_end_s"] - it.time_s) < 0.2 * it.time_s, (d, it.time_s)
    assert not any("forecast_end_s" in d for it in rules.iterations for d in it.decisions)
    assert sum(it.time_s for it in plan.iterations[1:]) < sum(it.time_s for it in rules.iterations[1:])


def test_plan_decisions_are_usable_and_timed(math8_runs: dict) -> None:
    plan = math8_runs["plan"]
    assert plan.decide_ms()["calls"] > 0
    for it in plan.iterations:
        assert it.bounds["tail_s"] <= it.time_s and it.bounds["work_s"] <= it.time_s
        assert it.phases["rollout_end_s"] <= it.phases["last_minibatch_start_s"] <= it.time_s


@pytest.mark.slow
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_runs_under_plan(profile: str) -> None:
    cfg = config_from_mapping(PROFILES[profile](8, num_iterations=2))
    report = simulate(cfg, policy="plan")
    assert len(report.iterations) == 2
    world = range(8)
    for it in report.iterations:
        for d in it.decisions:
            if d.get("time_sliced"):  # every component on every rank, the ranks switching phases
                assert set(d["placement"].values()) == {len(world)}, d
            else:
                assert sum(d["placement"].values()) <= len(world), d


@pytest.mark.parametrize(("profile", "expected"), [
    # short responses and training-heavy on 8 GPUs: collocated (72-77 s, 229-237 s an iteration) beats plan's
    # disaggregated schedule (81-83 s, 229-244 s); the collocated iteration's rollout leaves 47-67 (270-311)
    # GPU-seconds of decode idle against 260 (930) of work after it, so disaggregation is not even tried
    ("short_response", [True, True, True, True]),
    ("train_heavy", [True, True, True, True]),
    # math-RL: the long tail leaves GPUs that only a disaggregated schedule fills (193-204 s against 222-234 s);
    # the forecast of a collocated iteration (217 s) rules out trying co-location again
    ("math_rl", [True, False, False, False]),
])
def test_plan_runs_each_iteration_in_the_mode_measured_faster(profile: str, expected: list[bool]) -> None:
    """``scheduler.time_slicing``: plan runs the first iteration collocated (epoch 0 puts every component on
    every rank, the actor built there, as the live run starts; that iteration does not count), the second
    disaggregated, the third collocated unless the forecast of a collocated iteration rules it out, then the one
    whose measured iterations were faster (collocated by a margin of 2 %); the simulator time-slices the ranks of a collocated iteration as a static collocated run."""
    report = simulate(config_from_mapping(PROFILES[profile](8, num_iterations=4)), policy="plan")
    firsts = [next((d for d in it.decisions if d.get("boundary") == "iteration"), None) for it in report.iterations]
    # epoch 0 is collocated already: plan keeps it at gate 0, and says why (as at every gate that keeps co-location)
    assert firsts[0]["time_sliced"] and "the first iteration" in firsts[0]["reason"], firsts[0]
    modes = [True]
    for first in firsts[1:]:  # none: the iteration-start placement in force already
        modes.append(bool(first.get("time_sliced")) if first is not None else modes[-1])
    assert modes == expected, [f["reason"] for f in firsts]
    times = [it.time_s for it in report.iterations]
    if modes[1]:  # disaggregation not tried: the collocated iterations leave too little decode idle
        assert all("disaggregated not tried" in f["reason"] for f in firsts[1:]), [f["reason"] for f in firsts]
    elif modes[2]:  # measured both: the faster runs next
        sliced, apart = times[2], times[1]
        assert modes[3] == (sliced < (1 - defaults.TIME_SLICING_MARGIN) * apart), times
    else:
        assert "collocated not tried: its forecast" in firsts[2]["reason"], firsts[2]
    # a collocated iteration: rollout, then inference, then the actor on every rank (each phase's time-slice)
    phases = [d["reason"] for d in report.iterations[0].decisions if d["reason"].startswith("time-sliced")]
    assert phases[:3] == ["time-sliced: rollout 8", "time-sliced: inference 8", "time-sliced: actor 8"], phases


def test_plan_properties_on_random_placements() -> None:
    """Every plan decision on a sample of generated states is a usable placement (the
    hypothesis suite checks the same properties more broadly)."""
    s = state(running=300, pending=0, finished=724, inference_done=600, mb_done=1,
              current={"actor": (0, 1), "rollout": (2, 3, 4, 5), "inference": (6, 7)},
              history=learned_history(mb_s=300.0), elapsed_s=80.0)
    d = decide_plan(s)
    assert d is not None
    assert placement_problems(d.placement, s.world_ranks, s.cfg, GBS, 4) == []


def test_plan_picks_the_mode_its_measurements_say_is_faster() -> None:
    """The boundary decision as a pure function of the history: each mode's mean over its latest 4 measured
    iterations, collocated only when 2 % faster, and the slower mode tried again once its latest measurement is
    16 iterations old."""
    cfg = dataclasses.replace(PolicyConfig(max_running_requests=64), time_slicing=True)
    everywhere = {c: tuple(range(8)) for c in INITIAL}

    def boundary(times: tuple[float, ...], sliced: tuple[bool, ...]) -> dict:
        h = dataclasses.replace(learned_history(), iteration_s=times, time_sliced=sliced)
        s = dataclasses.replace(state(finished=TOTAL, inference_done=TOTAL, mb_done=TOTAL // GBS, history=h),
                                cfg=cfg)
        assert s.phase == "end"
        d = decide_plan(s)
        return d.placement if d is not None else s.current

    start = dataclasses.replace(state(pending=TOTAL, finished=0, phase="start", iteration=0), cfg=cfg)
    d = decide_plan(start)
    assert d is not None and d.placement == everywhere and "first iteration" in d.reason
    assert boundary((70.0,), (True,)) != everywhere  # disaggregated not measured yet
    # ... unless the collocated iteration's rollout left less decode idle than the work a disaggregated iteration
    # could overlap with it (scoring, and every mini-batch but the last: 260 GPU-seconds here): on 8 GPUs its last
    # response at 40 s leaves 17 GPU-seconds idle (its tokens need 303 at full load); at 90 s, 417
    for rollout_end, tried in ((40.0, False), (90.0, True)):
        h = dataclasses.replace(learned_history(), iteration_s=(100.0,), time_sliced=(True,), rollout_end_s=rollout_end)
        s = dataclasses.replace(state(finished=TOTAL, inference_done=TOTAL, mb_done=TOTAL // GBS, history=h), cfg=cfg)
        idle, work = collocated_spare_gpu_s(s)  # type: ignore[misc]
        assert (idle >= work) == tried, (idle, work)
        d = decide_plan(s)
        assert d is not None and (d.placement != everywhere) == tried, d
        assert ("disaggregated not tried" in d.reason) == (not tried), d.reason
    # a disaggregated iteration measured faster is never skipped so
    h = dataclasses.replace(learned_history(), iteration_s=(85.0, 70.0, 90.0), time_sliced=(True, False, True),
                            rollout_end_s=40.0)
    s = dataclasses.replace(state(finished=TOTAL, inference_done=TOTAL, mb_done=TOTAL // GBS, history=h), cfg=cfg)
    assert decide_plan(s).placement != everywhere
    assert boundary((70.0, 85.0), (True, False)) == everywhere
    assert boundary((84.0, 85.0), (True, False)) != everywhere  # under the margin: disaggregated
    assert boundary((85.0, 70.0), (False, True)) == everywhere
    # the mean of each mode's latest 4: a lucky disaggregated iteration does not hide slower ones
    assert boundary((60.0, 80.0, 82.0, 84.0, 86.0, 70.0), (False,) * 5 + (True,)) == everywhere
    assert boundary((60.0, 80.0, 70.0), (False, False, True)) != everywhere  # (60 + 80) / 2 = 70: no gain
    assert boundary((85.0,) + (70.0,) * 15, (False,) + (True,) * 15) == everywhere  # disaggregated 16 ago: out
    assert boundary((85.0,) + (70.0,) * 16, (False,) + (True,) * 16) != everywhere  # 17 ago: tried again
    # co-location not measured yet is tried, unless its forecast exceeds the disaggregated iterations by 10 %
    h = dataclasses.replace(learned_history(), iteration_s=(70.0, 1.0), time_sliced=(True, False), iterations_done=2)
    s = dataclasses.replace(state(finished=TOTAL, inference_done=TOTAL, mb_done=TOTAL // GBS, history=h), cfg=cfg)
    forecast = collocated_forecast_s(s)
    assert forecast is not None and forecast > 1.1
    d = decide_plan(s)
    assert d is not None and d.placement != everywhere and "collocated not tried: its forecast" in d.reason
    d = decide_plan(dataclasses.replace(start, cfg=PolicyConfig(max_running_requests=64)))  # time_slicing off
    assert d is None or d.placement != everywhere
    rec = HistoryRecorder()  # the recorder marks an iteration collocated from its ticks
    for k, sliced in enumerate((True, False, True)):
        rec.observe(Tick(iteration=k, elapsed_s=1.0, samples=TOTAL, finished=TOTAL, inference_done=TOTAL,
                         groups_ready=TOTAL, inference_gpus=0 if sliced else 2, max_running=64, running=0,
                         instances=8, inference_busy_gpu_s=5.0, lengths=(), time_sliced=sliced))
        h = rec.end_iteration(10.0 + k)
    # the run's first iteration (10 s) measures the start, not its mode
    assert h.time_sliced == (True, False, True) and h.mode_iteration_s(True, 4) == (12.0, 1)
    assert h.mode_iteration_s(False, 4) == (11.0, 2)
    h = dataclasses.replace(h, iterations_done=40)  # the first iteration long out of the kept ones: all count
    assert h.mode_iteration_s(True, 4) == (11.0, 1)  # the mean of 10 and 12
    # a collocated iteration's inference pace counts only while no disaggregated one measured it
    assert h.inference == (2 * TOTAL, 10.0)
