"""The simulated asynchronous run (``slurm_rl.scheduler.async_pipeline``): with staleness 0 it is the
synchronous run, a rollout never starts from weights more than ``k`` versions old, it gains only where the
rollout has ranks of its own, and a hand-computed schedule."""

from __future__ import annotations

import pytest

from slurm_rl.scheduler.async_pipeline import pipeline, simulate_async
from slurm_rl.scheduler.profiles import math_rl
from slurm_rl.scheduler.report import IterationReport, SimReport

GPUS = {"actor": 2, "rollout": 4, "inference": 2}


def _report(rows: list[tuple[float, float, float]]) -> SimReport:
    """Iterations of (rollout end, iteration time, actor busy GPU-seconds)."""
    out = SimReport(policy="static", gpus=8, use_pre_process_policy=False, use_wait_before_last_iter_policy=False,
                    seed=0)
    for j, (g, t, actor) in enumerate(rows):
        out.iterations.append(IterationReport(iteration=j, time_s=t, busy_gpu_s={"actor": actor, "inference": 0.0},
                                              phases={"rollout_end_s": g}))
    return out


def test_staleness_zero_is_the_synchronous_run() -> None:
    report = _report([(10.0, 14.0, 6.0), (9.0, 13.0, 6.0), (11.0, 15.0, 6.0)])
    sync = pipeline(report, 0, GPUS)
    assert sync.total_time_s == pytest.approx(14.0 + 13.0 + 15.0)
    assert [it.staleness for it in sync.iterations] == [0, 0, 0] and not sync.overlap


def test_a_hand_computed_schedule_with_staleness_one() -> None:
    """Rollout 10 s, the tail after it 4 s, the actor 3 s per iteration (6 GPU-s on 2 GPUs):
    it0 decodes 0-10, trains to 14; it1 starts at 10 (weights version 0 allowed) and decodes to 20, trains to
    max(20 + 4, 14 + 3) = 24; it2 needs version 1 (it0 trained, at 14): starts at 20, ends 30, trains to 34."""
    report = _report([(10.0, 14.0, 6.0)] * 3)
    a = pipeline(report, 1, GPUS)
    assert [(it.generate_start_s, it.generate_end_s, it.train_end_s) for it in a.iterations] == [
        (0.0, 10.0, 14.0), (10.0, 20.0, 24.0), (20.0, 30.0, 34.0)]
    assert [(it.policy_version, it.staleness) for it in a.iterations] == [(0, 0), (0, 1), (1, 1)]
    assert a.total_time_s == 34.0 and a.sync_time_s == 42.0 and a.overlap


def test_staleness_never_exceeds_k_and_more_staleness_is_never_slower() -> None:
    report = _report([(10.0, 30.0, 40.0), (12.0, 31.0, 40.0), (8.0, 29.0, 40.0), (10.0, 30.0, 40.0),
                      (11.0, 30.0, 40.0)])
    times = []
    for k in range(4):
        run = pipeline(report, k, GPUS)
        assert all(0 <= it.staleness <= k for it in run.iterations)
        times.append(run.total_time_s)
    assert times == sorted(times, reverse=True) and times[1] < times[0]
    # the actor (20 s per iteration) bounds the overlap: never faster than its own work
    assert times[-1] >= 5 * 20.0


def test_a_rollout_sharing_the_actors_ranks_gains_nothing() -> None:
    report = _report([(10.0, 14.0, 6.0)] * 3)
    shared = pipeline(report, 2, GPUS, overlap=False)
    assert shared.total_time_s == pipeline(report, 0, GPUS).total_time_s and not shared.overlap


@pytest.mark.slow
def test_math_rl_async_on_its_best_split_beats_the_synchronous_static_run() -> None:
    """The math-RL profile at 8 GPUs, 4 iterations: staleness 1 on the best split it finds is faster than the
    synchronous run on the configured placement, and its samples are at most 1 version old."""
    doc = math_rl(8, num_iterations=4)
    sync = simulate_async(doc, [0], seed=0, search=False)[0]
    one = simulate_async(doc, [1], seed=0)[1]
    assert one.total_time_s < sync.total_time_s
    assert max(it.staleness for it in one.iterations) <= 1
    assert sorted(r for ranks in one.placement.values() for r in ranks) == list(range(8))


def test_a_run_with_staleness_under_auto_is_refused_and_plan_chooses_its_schedule_at_launch() -> None:
    """``auto`` moves ranks inside a synchronous iteration: an async run under it is refused, the message naming
    ``plan``; ``plan`` chooses the schedule once (``scheduler.async_plan``): on math-RL at 8 GPUs the gate-bound
    async run at bound 1 loses to plan's own synchronous schedule (measured 237.9 s against 198.9: the run goes
    synchronous, bound 0); partial rollout wins at bounds 1 and 2 (172.3 and 143.9 s, the inference on the actor's
    4 ranks: its split, static from then on, the bound kept)."""
    from omegaconf import OmegaConf

    from slurm_rl.config import config_from_mapping
    from slurm_rl.placement import ConfigError
    from slurm_rl.scheduler.async_plan import plan_async, plans_async

    doc = math_rl(8, num_iterations=3)
    doc["algorithm"] = {"max_staleness": 1}
    doc["scheduler"]["policy"] = "auto"
    doc["cluster"]["auto_scheduler"] = True
    with pytest.raises(ConfigError) as err:
        config_from_mapping(doc)
    assert any(i.key == "scheduler.policy" and "plan chooses" in i.allowed for i in err.value.issues)
    doc["scheduler"]["policy"] = "plan"
    cfg = config_from_mapping(doc)
    assert plans_async(cfg)
    overrides, chosen = plan_async(cfg)
    assert overrides == ["algorithm.max_staleness=0"] and chosen["policy"] == "plan"
    assert chosen["synchronous_plan_s"] <= chosen["async_s"]
    doc["rollout"] = {"partial_rollout": True}
    for bound in (1, 2):
        doc["algorithm"] = {"max_staleness": bound}
        overrides, chosen = plan_async(config_from_mapping(doc))
        assert overrides[1:] == ["scheduler.policy=static", "cluster.auto_scheduler=false"]
        assert chosen["max_staleness"] == bound and chosen["async_s"] < chosen["synchronous_plan_s"]
        planned = config_from_mapping(OmegaConf.to_container(OmegaConf.merge(
            OmegaConf.create(doc), OmegaConf.from_dotlist(overrides)), resolve=True))
        assert planned.scheduler.policy == "static" and not plans_async(planned)
        ranks = {c: p.ranks for c, p in planned.placement.components.items()}
        assert sorted({r for rs in ranks.values() for r in rs}) == list(range(8))
        assert not set(ranks["rollout"]) & (set(ranks["actor"]) | set(ranks["inference"]))


def test_compare_modes_prints_the_asynchronous_rows(tmp_path, capsys) -> None:
    """``slurm-rl simulate --compare-modes`` on an 8-GPU math-RL config: staleness 1 and 2 beside the modes, the
    rollout waiting at the gates and with partial rollout, each on the split it chose, with the staleness of each
    iteration at most its bound and the overrides that run it."""
    import json
    import subprocess
    import sys

    import yaml

    path = tmp_path / "math8.yaml"
    path.write_text(yaml.safe_dump(math_rl(8, num_iterations=3)))
    proc = subprocess.run([sys.executable, "-m", "slurm_rl.cli", "simulate", str(path), "--compare-modes", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["asynchronous"]["rows"]
    assert [(r["max_staleness"], r["partial_rollout"]) for r in rows] == [(1, False), (2, False), (1, True), (2, True)]
    for r in rows:
        assert max(r["staleness"]) <= r["max_staleness"] and sum(r["gpus"].values()) == 8
        assert r["mean_iteration_s"] > 0
    from slurm_rl.scheduler.cli_bridge import print_modes

    print_modes(json.loads(proc.stdout))
    text = capsys.readouterr().out
    assert "asynchronous, staleness 1:" in text and "algorithm.max_staleness=1 'cluster.component_placement={actor: " in text
    assert "asynchronous, staleness 2, partial rollout:" in text
    assert "algorithm.max_staleness=2 rollout.partial_rollout=true 'cluster.component_placement={actor: " in text


def _stream_setup(iterations: int = 4):
    from slurm_rl.config import config_from_mapping
    from slurm_rl.scheduler.simulate import build_setup

    return build_setup(config_from_mapping(math_rl(8, num_iterations=iterations)), seed=0)[0]


def test_partial_rollout_never_draws_a_sample_more_than_the_bound_ahead_nor_trains_it_later() -> None:
    """``async_stream``: with partial rollout the requests of iteration ``j`` start once the rollout holds version
    ``j - lead`` (the first iteration draws ``0 .. lead`` with version 0), every iteration ends after the one
    before it, and no iteration is shorter than its own training on the actor's GPUs."""
    from slurm_rl.scheduler.async_stream import stream

    setup = _stream_setup()
    actor_gpus = len(setup.initial["actor"])
    for lead in (1, 2):
        run = stream(setup, lead)
        assert run.partial_rollout is False and run.overlap  # set by simulate_async, which picks the placement
        assert [it.policy_version for it in run.iterations] == [max(0, j - lead) for j in range(4)]
        assert [it.staleness for it in run.iterations] == [min(j, lead) for j in range(4)]
        assert run.rollout_occupancy is not None and 0 < run.rollout_occupancy <= 1
        ends = [0.0] + [it.train_end_s for it in run.iterations]
        assert ends == sorted(ends) and run.total_time_s == ends[-1]
        # the actor trains at least one iteration's tokens per iteration: 2 GPUs at the cost model's law
        assert all(b - a >= 0.99 * setup.cost.seconds("actor", setup.batch.samples_per_iteration * setup.prompt_len,
                                                       actor_gpus) for a, b in zip(ends, ends[1:]))
    with pytest.raises(ValueError, match="lead 0"):
        stream(setup, 0)


@pytest.mark.slow
def test_partial_rollout_overlaps_the_long_tail_the_gate_waits_for() -> None:
    """On math-RL's long tail (8 GPUs, 8 iterations) the rollout's requests carrying over the gates run a long
    run's iterations (after the first, before the pipeline drains) faster than the gate-bound async run and the
    synchronous one on the same placement, and faster at bound 2 than at 1 (measured 172.3 and 143.9 s against
    237.9 and 323.4, on the inference on the actor's 4 ranks and 4 rollout ranks); ``simulate_async`` reports the
    placement (every rank, the rollout's its own) and that it modelled partial rollout."""
    doc = math_rl(8, num_iterations=8)
    gate = simulate_async(doc, [1], seed=0)[1]
    partial = simulate_async(doc, [1, 2], seed=0, partial=True)
    for k, run in partial.items():
        assert run.partial_rollout and max(it.staleness for it in run.iterations) <= k
        assert run.steady_iteration_s < gate.steady_iteration_s
        assert run.steady_iteration_s < run.sync_time_s / 8
        assert sorted({r for ranks in run.placement.values() for r in ranks}) == list(range(8))
        rollout = set(run.placement["rollout"])
        assert rollout and not rollout & (set(run.placement["actor"]) | set(run.placement["inference"]))
    assert partial[2].steady_iteration_s < partial[1].steady_iteration_s


@pytest.mark.parametrize("offload", [False, True], ids=["resident", "parked"])
def test_ranks_the_actor_shares_with_the_inference_do_one_thing_at_a_time(offload: bool) -> None:
    """``async_stream`` on verl's fully async layout (the inference on the actor's 4 ranks, the rollout on 4 of its
    own): the shared ranks never score and train at once; with the actor's state resident they interleave (an
    iteration's first mini-batch trains before its last samples are scored, as verl's Trainer scores and trains
    each batch it takes), parked (``actor.offload_*``) they score the iteration whole, then train."""
    from slurm_rl.config import config_from_mapping
    from slurm_rl.scheduler.async_stream import stream
    from slurm_rl.scheduler.simulate import build_setup

    doc = math_rl(8, num_iterations=4)
    doc["cluster"]["component_placement"] = {"actor,inference": "0-3", "rollout": "4-7"}
    doc["actor"] = {"offload_weight": offload}
    setup = build_setup(config_from_mapping(doc), seed=0)[0]
    assert setup.offloads is offload
    spans = stream(setup, 2).spans
    ordered = sorted(spans, key=lambda s: s[2])
    assert all(a[3] <= b[2] + 1e-9 for a, b in zip(ordered, ordered[1:])), "scoring and training overlap"
    for j in range(4):
        first_training = min(s[2] for s in spans if s[:2] == ("training", j))
        last_scoring = max(s[3] for s in spans if s[:2] == ("scoring", j))
        assert (first_training < last_scoring) is not offload, (j, first_training, last_scoring)
