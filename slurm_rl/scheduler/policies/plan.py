"""``plan``: move GPUs when a forecast of the iteration's critical path says it pays.

The iteration ends when the actor's last mini-batch ends; that mini-batch needs every sample,
so the critical path is ``max(data end, actor work before it) + last mini-batch``, where *data
end* is when rollout and inference are done. ``plan`` forecasts both sides from the run's own
measurements (``slurm_rl.scheduler.forecast``) and, at every call, picks among the placements
reachable now the one with the earliest forecast end:

1. Iteration boundary: the iteration-start placement. The actor's GPUs decode (its state waits
   on its ranks, as with RLinf's pre-process), and inference keeps only as many GPUs as keep
   pace with the samples' arrival as measured last iteration (completion curve in rollout
   instance-seconds, and inference speed); the rest decode too. Or, with ``cfg.time_slicing``,
   every component on every rank (a collocated iteration, its ranks time-sliced: no decision
   inside it) where the measured iterations say that is faster (``_time_sliced_if_faster``); that
   decision is made even where the last iteration ran collocated too (the placement is kept, and the
   coordinator records why).
2. Repair (as ``auto``): a component with work and no ranks gets its ranks back.
3. The actor is inside a mini-batch: no change.
4. Receding horizon: the placements reachable now form a ladder of actor DP sizes, each taking
   idle ranks, finished inference ranks, then whole rollout instances (their requests migrate);
   a held-back actor comes back on its own ranks. For every step (stage 1) and every bigger step
   the actor could grow into after its next mini-batch (stage 2) the iteration's end is forecast
   (rollout on the stages' instances, mini-batches no earlier than their data arrived last
   iteration, a switch per DP change costing its latency plus the share of the actor's state
   that moves, every mini-batch that starts once the data is in on every GPU); a held-back
   actor may also wait until its data is about in, or two switch latencies (its latest start),
   or until all the data is in and then take every GPU (an expensive actor would otherwise lock
   a mini-batch onto a few). Stage 1 of the best pair is applied, but only when it gains more
   than one switch latency over no change, or takes no working GPUs (ties: fewer rollout
   instances released, then the bigger actor). Finished rollout / inference give all their
   ranks up.
5. Cold start (no mini-batch or decode speed measured yet, or under a tenth of the responses
   seen): RLinf's rules with pre-process (``auto+pre_process``), until the forecast can be fitted;
   but the held-back actor comes back only once its first mini-batch's data is in (its GPUs
   decode until then instead of waiting for data).

The ladder's steps are the actor rank counts some tensor-parallel choice can use (a valid DP
size, each TP group inside one node); a decision whose actor ranks do not suit the size in force
carries the smallest choice that does (``placement_ops.with_actor_tp``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from slurm_rl.scheduler import defaults
from slurm_rl.scheduler.collocated import on_every_rank, shares_ranks
from slurm_rl.scheduler.forecast import Forecast, piecewise_seconds
from slurm_rl.scheduler.history import CURVE_POINTS
from slurm_rl.scheduler.placement_ops import (
    choose_actor_tp,
    idle_ranks,
    iteration_start_placement,
    rollout_instances,
    take_groups,
    with_actor_tp,
)
from slurm_rl.scheduler.policies.auto import decide_auto, starved_components
from slurm_rl.scheduler.state import Decision, RankMap, SchedState, valid_dp_sizes


def decide_plan(state: SchedState) -> Decision | None:
    """The ``plan`` policy (see the module docstring)."""
    return with_actor_tp(state, _decide(state))


def _decide(state: SchedState) -> Decision | None:
    if state.phase == "start" or (state.phase == "end" and state.iteration + 1 < state.num_iterations):
        nxt = state.iteration if state.phase == "start" else state.iteration + 1
        start = plan_start_placement(state)
        why = (f"plan: iteration-start placement for iteration {nxt} (actor {len(start['actor'])}, "
               f"rollout {len(start['rollout'])}, inference {len(start['inference'])} ranks)")
        sliced, note = _time_sliced_if_faster(state)
        if sliced is not None:
            start, why = sliced, note
        elif note:
            why = f"{why}; {note}"
        if state.current == start and sliced is None:  # a collocated start is said even when in force (kept)
            return None
        return Decision(start, why, boundary="iteration")
    if state.phase == "end" or shares_ranks(state.current):
        return None  # a time-sliced iteration's ranks switch phases on their own until its end
    held = _held_back(state)
    starved = starved_components(_with_pre_process(state))
    if starved:
        lend = dataclasses.replace(state.cfg, use_pre_process_policy=True)
        repair = iteration_start_placement(state.initial, lend) if held else dict(state.initial)
        if repair != state.current:
            return Decision(repair, f"plan repair: {', '.join(starved)} hold no ranks but have work",
                            boundary="minibatch")
    if state.actor.busy:
        return None
    fc = _forecast(state)
    if fc is None:
        waiting = state.rollout.outstanding > 0 or not state.inference.finished
        if held and waiting and _data_in(state) < state.batch.global_batch_size:
            return None  # cold start: the held-back actor comes back once its first data is in
        d = decide_auto(_with_pre_process(state))
        return None if d is None else dataclasses.replace(d, reason=f"plan (cold start, RLinf rules): {d.reason}")
    return _best(state, fc, held)


def plan_start_placement(state: SchedState) -> RankMap:
    """The placement every iteration starts from under ``plan`` (rule 1)."""
    cfg = state.cfg
    start = iteration_start_placement(state.initial, dataclasses.replace(cfg, use_pre_process_policy=True))
    inf = start["inference"]
    h = state.history
    if not inf or h is None or not h.curve or h.inference[0] <= 0:
        return start
    fc_probe = Forecast.fit(h, state.rollout.total, state.rollout.total, cfg.max_running_requests,
                            defaults.SWITCH_LATENCY_S)
    if fc_probe is None:
        return start
    # a learned bias that lengthens the rollout is not trusted here: inference is sized for the
    # faster of the two (were the rollout quicker than forecast, inference would end it late)
    fc_probe = dataclasses.replace(fc_probe, bias=min(1.0, fc_probe.bias))
    rtp = cfg.rollout_ranks_per_instance
    total = state.rollout.total
    everything = fc_probe.rollout_view(total, 0, total)
    # samples arrive as the rollout's work progresses: the last iteration's curve in rollout
    # instance-seconds, so a placement that changed under it (the actor taking rollout GPUs
    # early or late) does not distort its shape (a history without it: the curve in seconds)
    work = h.curve_work if len(h.curve_work) == CURVE_POINTS and h.curve_work[-1] > 0 else None

    def keeps_pace(keep: int) -> bool:
        instances = (len(start["rollout"]) + len(inf) - keep) // rtp
        # the deadline: the shorter of the forecast and the last measured rollout (inference must
        # never become the critical path because the forecast was pessimistic)
        deadline = min(everything.seconds(instances), h.curve[-1] * _curve_scale(state, instances))
        return fc_probe.inference_keeps_pace(total, keep, deadline, shape=work)

    # the fewest inference ranks that keep pace (whole rollout instances lent): more ranks, and
    # the fewer rollout instances that leaves, only make keeping pace easier, so bisect
    keeps = [k for k in range(1, len(inf) + 1) if (len(inf) - k) % rtp == 0]
    lo, hi = 0, len(keeps)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if keeps_pace(keeps[mid]) else (mid + 1, hi)
    if lo < len(keeps):
        lent = len(inf) - keeps[lo]
        start["rollout"] = tuple(sorted(start["rollout"] + inf[:lent]))
        start["inference"] = inf[lent:]
    return start


def _time_sliced_if_faster(state: SchedState) -> tuple[RankMap | None, str]:
    """Every component on every rank (collocated, time-sliced) for the next iteration, and why; None: the
    next iteration starts disaggregated (with a note where a forecast ruled co-location out). Only where
    ``cfg.time_slicing`` allows it.

    Each mode is judged by its measured iterations (the mean of its latest ``defaults.TIME_SLICING_WINDOW``,
    ``History.mode_iteration_s``, the run's first iteration left out: it measures the start): the first
    iteration runs collocated (it needs no forecast; the run starts so: ``live_state.start_placement``), the
    next disaggregated, the third collocated again (measured now), then the faster of the two, trying the other
    again once its latest measurement is ``defaults.TIME_SLICING_RETRY`` iterations old (response lengths
    drift as a run trains). Collocated counts as faster only by ``defaults.TIME_SLICING_MARGIN``: a
    disaggregated iteration right after a collocated one has a colder forecast than the next ones. A try of
    co-location is skipped where :func:`collocated_forecast_s` exceeds the disaggregated iterations measured
    by ``defaults.TIME_SLICING_FORECAST_MARGIN``; a try of disaggregation (not measured yet, or measured slower)
    where the collocated iteration just measured left less decode idle in its rollout than the work a
    disaggregated iteration could overlap with it (:func:`collocated_spare_gpu_s`). No forecast of a whole
    disaggregated iteration is used: the receding horizon's, made at its start, missed the simulated iterations
    by 16-25 %."""
    if not state.cfg.time_slicing:
        return None, ""
    h = state.history
    nxt = state.iteration if state.phase == "start" else state.iteration + 1
    window = defaults.TIME_SLICING_WINDOW
    sliced = h.mode_iteration_s(True, window) if h is not None else None
    apart = h.mode_iteration_s(False, window) if h is not None else None
    if h is None or not h.iteration_s:
        chosen, why = True, "the first iteration: no forecast needed"
    elif apart is None:
        chosen, why = False, f"disaggregated not measured yet (collocated: {sliced[0]:.1f}s)" if sliced else ""
    elif sliced is None:
        chosen, why = True, f"collocated not measured yet (disaggregated: {apart[0]:.1f}s)"
    else:
        faster = sliced[0] < apart[0] * (1.0 - defaults.TIME_SLICING_MARGIN)
        slower_age = apart[1] if faster else sliced[1]
        chosen = (not faster) if slower_age > defaults.TIME_SLICING_RETRY else faster
        why = (f"collocated iterations took {sliced[0]:.1f}s (the latest {sliced[1]} ago), disaggregated "
               f"{apart[0]:.1f}s ({apart[1]} ago)" + ("; the slower mode tried again" if chosen != faster else ""))
    probe = apart is None or (sliced is not None and sliced[0] < apart[0] * (1.0 - defaults.TIME_SLICING_MARGIN))
    spare = collocated_spare_gpu_s(state) if not chosen and probe else None
    if spare is not None and spare[0] < spare[1]:  # a try of disaggregation: not where it cannot pay
        chosen, why = True, (f"disaggregated not tried: the collocated iteration's rollout left {spare[0]:.0f} "
                             f"GPU-seconds of decode idle, less than the {spare[1]:.0f} of scoring and training a "
                             f"disaggregated one could overlap with its rollout")
    if not chosen:
        return None, ""
    if apart is not None and (sliced is None or sliced[1] > defaults.TIME_SLICING_RETRY):
        forecast = collocated_forecast_s(state)  # a try of co-location: not where it cannot pay
        if forecast is not None and forecast > apart[0] * (1.0 + defaults.TIME_SLICING_FORECAST_MARGIN):
            return None, (f"collocated not tried: its forecast {forecast:.1f}s, disaggregated iterations took "
                          f"{apart[0]:.1f}s")
    why = f"plan: iteration {nxt} collocated (every component on every rank, time-sliced): {why}"
    return on_every_rank(state.initial, tuple(state.world_ranks)), why


def collocated_spare_gpu_s(state: SchedState) -> tuple[float, float] | None:
    """Where the last iteration ran collocated: the GPU-seconds its rollout left idle (every GPU from the
    iteration's release to its last response, less the decode its responses' tokens need at full load, from the
    fitted decode step) and the GPU-seconds of the work a disaggregated iteration could overlap with its rollout
    (scoring every sample and every mini-batch but the last, at the pace measured). None where that iteration was
    not collocated or these cannot be fitted.

    A disaggregated iteration gains by doing that work during the rollout's tail, and it can only do so in the
    decode capacity the tail leaves idle: where that is less than the work, co-location is faster. Measured on
    the simulated workloads (idle / work): math-RL 1.6-1.7 and agentic 9.5-11, where disaggregated iterations are
    7-15 % and 2-5 % faster; training-heavy 0.29-0.39 and short responses 0.19-0.36, where they are 1 % faster to
    11 % slower; on the live emulated 8-rank test run 1.4-1.8, where they are 10-20 % faster."""
    h, cfg = state.history, state.cfg
    if h is None or not h.iteration_s or not h.time_sliced or not h.time_sliced[-1] or h.rollout_end_s <= 0:
        return None
    total, world = state.rollout.total, len(state.world_ranks)
    fc = Forecast.fit(h, total, total, cfg.max_running_requests, defaults.SWITCH_LATENCY_S)
    if fc is None or fc.inf_gpu_s_per_sample is None:
        return None
    m = cfg.max_running_requests
    need = total * fc.mean_length() * fc.step_s(m) / m * cfg.rollout_ranks_per_instance
    idle = world * h.rollout_end_s - need
    dp = max(1, world // state.tp)
    scoring = total * fc.inf_gpu_s_per_sample if state.initial.get("inference") else 0.0
    work = scoring + max(0, state.actor.minibatches_total - 1) * fc.minibatch_s(dp) * world
    return idle, work


def collocated_forecast_s(state: SchedState) -> float | None:
    """Forecast seconds of the next iteration run collocated: the actor parks (``cfg.phase_switch_s``), every
    rank decodes, then scores, then the actor comes back (a reshard where its DP was another) and trains every
    mini-batch at DP world, each phase change a switch; None without a forecast, or where the actor cannot
    train on every rank. (Measured against the simulated collocated iterations: 69.0 s against 72-75 s on
    short responses at 8 GPUs, 207.2 s against 227 s and 237.6 s against 245 s on math-RL at 8 and 64: 3-9 %
    short, hence the margin of ``defaults.TIME_SLICING_FORECAST_MARGIN``.)"""
    cfg, world, tp = state.cfg, len(state.world_ranks), state.tp
    total = state.rollout.total
    fc = None if state.history is None else Forecast.fit(state.history, total, total, cfg.max_running_requests,
                                                         defaults.SWITCH_LATENCY_S)
    dp = world // tp
    if fc is None or dp * tp != world or dp not in state.actor_valid_dp_sizes():
        return None
    seconds = fc.switch_s + cfg.phase_switch_s  # the actor parks and every rank decodes
    seconds += fc.rollout_view(total, 0, total).seconds(world // cfg.rollout_ranks_per_instance)
    if state.initial.get("inference"):
        seconds += fc.switch_s + fc.inference_s(state.inference.total, world)
    seconds += fc.switch(_state_dp(state), dp) + cfg.phase_switch_s
    return seconds + state.actor.minibatches_total * fc.minibatch_s(dp)


def _with_pre_process(state: SchedState) -> SchedState:
    return dataclasses.replace(state, cfg=dataclasses.replace(state.cfg, use_pre_process_policy=True))


def _held_back(state: SchedState) -> bool:
    return (not state.current["actor"] and bool(state.initial["actor"])
            and state.actor.minibatches_done == 0 and not state.actor.busy)


def _forecast(state: SchedState) -> Forecast | None:
    if state.history is None:
        return None
    return Forecast.fit(state.history, state.rollout.total, state.rollout.finished,
                        state.cfg.max_running_requests, defaults.SWITCH_LATENCY_S)


@dataclass(frozen=True)
class _Step:
    """A placement reachable now: actor DP, rollout instances left, instances released."""

    dp: int
    placement: RankMap
    instances: int
    released: int


def _ladder(state: SchedState, held: bool) -> list[_Step]:
    """Reachable placements by ascending actor DP; the first is the base (no growth). Each
    takes idle ranks, finished inference ranks, then whole rollout instances, in that order, so
    every step holds the ranks of the smaller ones."""
    cur, cfg = state.current, state.cfg
    out = state.rollout.outstanding
    world, gbs, mbs = len(state.world_ranks), state.batch.global_batch_size, state.batch.micro_batch_size
    instances = rollout_instances(cur["rollout"], cfg.rollout_ranks_per_instance)
    free: list[tuple[int, ...]] = [(r,) for r in idle_ranks(state.world_ranks, cur)]
    if state.inference.finished:
        free.extend((r,) for r in cur["inference"])
    base = cur["actor"]
    own = set(state.initial["actor"])
    if held and own <= set(cur["rollout"]) | {r for g in free for r in g}:
        # the actor comes back on its own ranks (its state is there); their instances leave
        back = [i for i in instances if own & set(i)]
        instances = [i for i in instances if not own & set(i)]
        base = tuple(sorted(own))
        free = [(r,) for g in back for r in g if r not in own] + [g for g in free if g[0] not in own]
    if not out:  # rollout finished: its ranks are free
        taken = {r for g in free for r in g} | set(base)
        free.extend((r,) for r in cur["rollout"] if r not in taken)
        instances = []
    n_fixed = len(free)
    free.extend(instances)
    keep_inf = () if state.inference.finished else cur["inference"]
    # the actor rank counts some tensor-parallel choice can use, ascending (the base first)
    sizes = [len(base)] + sorted({dp * tp for tp in cfg.tp_choices for dp in valid_dp_sizes(gbs, mbs, world // tp)
                                  if dp * tp > len(base)})
    steps = []
    for n in sizes:
        need = n - len(base)
        taken, used = take_groups(free, need)
        if len(taken) < need:
            break
        released = max(0, used - n_fixed)
        if out and released >= len(instances):
            break  # rollout keeps at least one instance while it has work
        actor = tuple(sorted(base + taken))
        tp = choose_actor_tp(actor, state.tp, world, cfg, gbs, mbs)
        if tp is None:
            if need:
                continue  # no tensor-parallel size suits these ranks (e.g. a TP group across nodes)
            tp = state.tp
        placement: RankMap = {
            "actor": actor,
            "rollout": tuple(r for inst in instances[released:] for r in inst),
            "inference": keep_inf,
        }
        steps.append(_Step(n // tp, placement, len(instances) - released, released))
    return steps


def _ready_s(state: SchedState, fc: Forecast, index: int) -> float:
    """Seconds from now until the data of mini-batch ``index`` (of the iteration) is in, as the
    last iteration's completion curve says (0 when it is in already or there is no curve)."""
    need = (index + 1) * state.batch.global_batch_size
    if _data_in(state) >= need or len(fc.curve) < CURVE_POINTS:
        return 0.0
    frac = need / state.rollout.total * CURVE_POINTS
    i = min(CURVE_POINTS - 1, int(frac))
    lo = fc.curve[i - 1] if i else 0.0
    at = lo + (fc.curve[i] - lo) * (frac - i)
    rtp = state.cfg.rollout_ranks_per_instance
    at *= _curve_scale(state, (len(state.world_ranks) - len(state.current["inference"])) // rtp)
    return max(0.0, at - state.elapsed_s)


def _curve_scale(state: SchedState, instances: int) -> float:
    """How much later than the last iteration's completion curve says the samples come on ``instances``
    rollout instances: 1, unless the last iteration ran collocated (every rank decoded: as much later as
    fewer instances decode now)."""
    h = state.history
    if h is None or not h.time_sliced or not h.time_sliced[-1]:
        return 1.0
    return (len(state.world_ranks) // state.cfg.rollout_ranks_per_instance) / max(1, instances)


def _data_in(state: SchedState) -> int:
    """Samples the actor's mini-batches can be cut from now (complete groups through inference)."""
    if state.actor.samples_ready is not None:
        return state.actor.samples_ready
    return state.inference.done


def _state_dp(state: SchedState) -> int:
    """DP of the ranks holding the actor's state now (a held-back actor keeps it where it was)."""
    tp = state.tp
    if state.current["actor"]:
        return len(state.current["actor"]) // tp
    if state.actor.state_dp is not None:
        return state.actor.state_dp
    return len(state.initial["actor"]) // tp


def _best(state: SchedState, fc: Forecast, held: bool) -> Decision | None:
    """Receding horizon: for every placement reachable now (stage 1) and every bigger one the
    actor could grow into after its next mini-batch (stage 2), forecast the iteration's end;
    apply the stage 1 of the best pair. A held-back actor may also wait: until its first
    mini-batch's data is about in, or until all the data is in (then it takes every GPU)."""
    cur = state.current
    ro = state.rollout
    out = ro.outstanding
    view = fc.rollout_view(ro.total, ro.running, ro.pending)
    inf_left = state.inference.total - state.inference.done
    inf_s = fc.inference_s(inf_left, 0 if state.inference.finished else len(cur["inference"]))
    first = state.actor.minibatches_done
    left = state.actor.minibatches_total - first
    dps = state.actor_valid_dp_sizes()
    final_dp = max(dps) if dps else 0
    dp_now = _state_dp(state)
    ladder = _ladder(state, held)
    if not ladder:
        return None
    all_instances = len(rollout_instances(cur["rollout"], state.cfg.rollout_ranks_per_instance)) if out else 0
    ready = [_ready_s(state, fc, first + i) for i in range(left)]
    cache: dict[int, float] = {}

    def roll(k: int) -> float:
        if k not in cache:
            cache[k] = view.seconds(k) if out else 0.0
        return cache[k]

    def finish(k0: int, t0: float, dp0: int, plan: list[_Step]) -> float:
        """End of the iteration when the rollout keeps ``k0`` instances until the actor (on DP
        ``dp0`` from ``t0``) starts its next mini-batch, the actor trains mini-batch ``i`` on
        ``plan[min(i, -1)]`` (each change of its DP costs a switch; the rollout follows the
        step's instances from then) until the data is in, then on every GPU."""
        def walk(data_end: float) -> tuple[float, int, list[tuple[int, float]]]:
            """The actor's mini-batches before the last: (when they end, its DP then, the
            rollout's (instances, from time) changes up to the data's end)."""
            segments: list[tuple[int, float]] = []
            t, k, dp = t0, k0, dp0
            for i in range(max(0, left - 1)):
                wide = max(t, ready[i]) >= data_end
                step = plan[min(i, len(plan) - 1)]
                want = final_dp if wide else step.dp
                if want != dp:
                    if not wide and step.instances != k:
                        segments.append((step.instances, t))
                        k = step.instances
                    t += fc.switch(dp, want)
                    dp = want
                t = max(t, ready[i]) + fc.minibatch_s(dp)
            return t, dp, segments

        # the rollout's end follows the plan's steps; then the same walk with every GPU after it
        data_end = max(piecewise_seconds(roll, k0, walk(math.inf)[2]), inf_s)
        t, dp, _ = walk(data_end)
        if left <= 1 and plan[0].dp != dp:
            t, dp = t + fc.switch(dp, plan[0].dp), plan[0].dp
        end = max(t, data_end)
        return end + (fc.switch(dp, final_dp) if dp < final_dp else 0.0) + fc.minibatch_s(final_dp)

    options: list[tuple[float, int, int, RankMap]] = []  # (end, released, -dp, placement)
    for i, s1 in enumerate(ladder):
        moved = s1.placement["actor"] != cur["actor"]
        t0 = fc.switch(dp_now, s1.dp) if moved else 0.0
        score = min(finish(s1.instances, t0, s1.dp, [s1, s2]) for s2 in ladder[i:])
        options.append((score, s1.released, -s1.dp, s1.placement))
    if held and (out or not state.inference.finished):
        # wait until all the data is in, then take every GPU; or (rollout running) until the
        # first mini-batch's data is about in: rollout and inference keep their GPUs meanwhile
        score = max(roll(all_instances), inf_s) + fc.switch(dp_now, final_dp) + left * fc.minibatch_s(final_dp)
        if out:
            wait = max(2 * fc.switch_s, (ready[0] if ready else 0.0) - fc.switch_s)
            score = min([score] + [finish(all_instances, wait, dp_now, [s2, s3])
                                   for j, s2 in enumerate(ladder) for s3 in ladder[j:]])
        options.insert(0, (score, 0, 0, {"actor": (), "rollout": cur["rollout"] if out else (),
                                         "inference": ladder[0].placement["inference"]}))
    stay = options[0]
    best = min(options, key=lambda o: (o[0], o[1], o[2]))
    takes_work = _differs_in_work(best[3], stay[3])
    sw = fc.switch_s
    chosen = best if best[0] < stay[0] - sw or (best[0] <= stay[0] and not takes_work) else stay
    placement = chosen[3]
    if placement == cur:
        return None
    leaving = tuple(r for r in cur["rollout"] if r not in set(placement["rollout"]))
    parts = []
    if placement["actor"] != cur["actor"]:
        parts.append(f"actor {len(cur['actor'])} -> {len(placement['actor'])} ranks")
    if leaving:
        parts.append(f"rollout releases {len(leaving)} ranks ({out} requests outstanding)")
    if state.inference.finished and cur["inference"]:
        parts.append(f"inference finished, releases {len(cur['inference'])} ranks")
    parts.append(f"forecast end in {chosen[0]:.1f}s vs {stay[0]:.1f}s without change")
    return Decision(placement, "plan: " + "; ".join(parts), migrate_from=leaving if out else (),
                    boundary="minibatch" if placement["actor"] != cur["actor"] else "now",
                    forecast_end_s=round(state.elapsed_s + chosen[0], 3))


def _differs_in_work(a: RankMap, b: RankMap) -> bool:
    """True when ``a`` takes GPUs from a component that is working in ``b`` (not free ones)."""
    return bool(set(b["rollout"]) - set(a["rollout"]))
