"""Asynchronous RL with bounded staleness, simulated: the rollout runs up to ``k`` policy versions ahead.

A synchronous iteration generates its samples with the weights of the iteration before it, then finishes
scoring and training them: the rollout's GPUs wait for the actor and the actor's wait for the samples (the
data dependency). With staleness ``k`` (``algorithm.max_staleness``; AReaL's ``max_head_offpolicyness``) the
rollout of iteration ``j`` may start from the weights trained up to iteration ``j - k - 1``, so it decodes
while the actor trains the iterations before it. A policy version here is an iteration's update (the weights
the gate hands the rollout); a sample's staleness is its iteration less the version it was generated from.

:func:`pipeline` replays a synchronous simulation (:func:`~slurm_rl.scheduler.simulate.simulate`, static
placement) as the live protocol runs it (:meth:`slurm_rl.worker.protocol.IterationProtocol.generated_in`). Per
iteration ``j`` of the synchronous run: its rollout decodes for ``G_j`` (the rollout's end), the scoring and
training after the last sample take ``tail_j``, the rollout's GPUs are busy ``B_j`` per GPU (at most ``G_j``: the
GPU-seconds its instances had requests running; an instance with one request left counts as busy, so ``B_j``
errs long), the actor's and the inference's busy time is ``A_j`` (the larger per GPU of each). Iteration ``p``
runs from its gate ``T_p``:

- its rollout draws the samples of iteration ``p + k`` with the weights of version ``p`` (in the first iteration
  those of ``0 .. k`` one after the other, each starting as the one before frees the GPUs: ``B``), from ``T_p``;
- its actor trains iteration ``p`` (``p = 0``: as the synchronous run, its samples drawn meanwhile; later ones
  were drawn before the gate: ``T_p + F_p + A_p``, ``F_p`` the scoring of one batch of ``train.global_batch_size``
  samples per inference rank: the inference ranks score their hash shares of the shards in sample order, so the
  lowest groups, which the first mini-batch takes whole, complete after one batch each);
- the next gate ``T_{p+1}`` is when both are done. The rollout of ``p + k`` ends inside iteration ``p``, so a bound
  ``k >= 2`` would only make the first iteration draw ``k + 1`` batches and overlap no more training: the live
  protocol runs one version ahead under any bound >= 1, and so does this model (staleness at most 1).

With ``k = 0`` this is the synchronous run, iteration by iteration. Where the rollout shares ranks with the
actor (co-located, or a hybrid placement with shared rollout ranks) it cannot decode while they train: no
overlap, the synchronous time. A weight sync landing mid-generation is not modelled here: each iteration's
rollout keeps the weights it started with (partial rollout: :mod:`~slurm_rl.scheduler.async_stream`).

:func:`simulate_async` chooses the split for ``k`` (the config's own and splits of the GPUs between actor, rollout
and inference, the rollout on GPUs of its own; with partial rollout the inference may share the actor's), as
``plan`` may choose a placement for an async run; it never raises ``k``.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from slurm_rl.placement import ConfigError, ConfigIssue
from slurm_rl.scheduler.report import SimReport

#: the shares of the GPUs (actor, inference) tried by :func:`simulate_async`; the rollout takes the rest
SPLITS = ((0.125, 0.125), (0.25, 0.125), (0.125, 0.25), (0.25, 0.25), (0.375, 0.125), (0.375, 0.25))
#: ... with partial rollout (:mod:`~slurm_rl.scheduler.async_stream`: no synchronous run per split, a finer grid;
#: an inference share of 0: the inference on the actor's ranks, time-sliced, as verl's fully async recipe places it)
STREAM_SPLITS = tuple((a / 16, i / 16) for a in range(2, 14) for i in (0, 1, 2, 3, 4))


@dataclass(frozen=True)
class AsyncIteration:
    """One iteration of an asynchronous run (seconds from the run's start)."""

    iteration: int
    generate_start_s: float
    generate_end_s: float
    train_end_s: float
    policy_version: int  # the iterations trained into the weights its rollout started from
    staleness: int  # iteration - policy_version (never above max_staleness)


@dataclass
class AsyncReport:
    """A simulated asynchronous run: its total time, each iteration, the placement it ran on."""

    max_staleness: int
    total_time_s: float
    sync_time_s: float  # the synchronous run on the same placement
    overlap: bool  # whether the rollout can decode while the actor trains (ranks of its own)
    placement: dict[str, list[int]] = field(default_factory=dict)
    iterations: list[AsyncIteration] = field(default_factory=list)
    partial_rollout: bool = False  # modelled by scheduler.async_stream (requests decode across the gates)
    # async_stream: the rollout's running requests over its slots, averaged over the run (None: not modelled)
    rollout_occupancy: float | None = None
    # async_stream: the inference's and the actor's busy spans, (scoring or training, iteration, start, end)
    spans: list[tuple[str, int, float, float]] = field(default_factory=list)

    @property
    def mean_iteration_s(self) -> float:
        return self.total_time_s / max(1, len(self.iterations))

    @property
    def steady_iteration_s(self) -> float:
        """A long run's seconds per iteration: the mean over the iterations after the first (which fills the
        pipeline: it draws the iterations ahead too) and before the last ones whose rollout drew nothing new (as
        many as the samples' staleness: the pipeline drains); after the first where no such window is left."""
        its = self.iterations
        if len(its) < 2:
            return self.mean_iteration_s
        end = len(its) - max(it.staleness for it in its)
        if end < 2:
            end = len(its)
        return (its[end - 1].train_end_s - its[0].train_end_s) / (end - 1)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["spans"]
        out["mean_iteration_s"] = round(self.mean_iteration_s, 3)
        out["steady_iteration_s"] = round(self.steady_iteration_s, 3)
        out["staleness"] = [it.staleness for it in self.iterations]
        return out


def _actor_side_s(it: Any, gpus: Mapping[str, int]) -> float:
    """The scoring and training one iteration needs once its samples exist: the busier of the actor's and the
    inference's GPUs (seconds)."""
    return max(it.busy_gpu_s.get(c, 0.0) / n for c, n in gpus.items() if c in ("actor", "inference") and n)


def _first_scoring_s(it: Any, gpus: Mapping[str, int], samples: int, batch: int) -> float:
    """Seconds the inference ranks take to score the first mini-batch of an iteration whose samples all exist: each
    scores its share in sample order, ``batch`` (``train.global_batch_size``) at a time, so the lowest groups
    complete after one batch (0 without inference ranks)."""
    n = gpus.get("inference", 0)
    if not n:
        return 0.0
    share = max(1.0, samples / n)
    return it.busy_gpu_s.get("inference", 0.0) / n * min(1.0, batch / share)


def pipeline(report: SimReport, max_staleness: int, gpus: Mapping[str, int], overlap: bool = True,
             samples: int = 0, batch: int = 0) -> AsyncReport:
    """``report`` (a synchronous run) replayed with the rollout up to ``max_staleness`` versions ahead (module
    docstring); ``gpus``: the GPUs of each component; ``overlap`` False: the rollout shares the actor's ranks;
    ``samples`` and ``batch``: an iteration's samples and ``train.global_batch_size`` (0: all scored before the
    first mini-batch)."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness {max_staleness}: expected >= 0")
    k = min(max_staleness, 1) if overlap else 0  # one version ahead under any bound >= 1 (module docstring)
    its = report.iterations
    n = len(its)
    rollout_gpus = max(1, gpus.get("rollout", 1))
    gen_start, gen_end, train_end = [0.0] * n, [0.0] * n, [0.0] * n
    gate = 0.0
    for p in range(n):
        drawn = range(p, min(n, p + k + 1)) if p == 0 else range(p + k, min(n, p + k + 1))
        t, rollout_end = gate, gate
        for j in drawn:  # one after the other: the next takes the GPUs as the tail of the one before frees them
            g = its[j].phases.get("rollout_end_s", its[j].time_s)
            gen_start[j], gen_end[j] = t, t + g
            t += min(g, its[j].busy_gpu_s.get("rollout", g * rollout_gpus) / rollout_gpus)
            rollout_end = max(rollout_end, gen_end[j])
        it = its[p]
        tail = it.time_s - it.phases.get("rollout_end_s", it.time_s)
        if p == 0 or k == 0:  # trained as its samples arrive, as in the synchronous run
            train_end[p] = gen_end[p] + tail
        else:
            first = _first_scoring_s(it, gpus, samples, batch or samples)
            train_end[p] = max(gen_end[p] + tail, gate + first + _actor_side_s(it, gpus))
        gate = max(train_end[p], rollout_end)
    out = [AsyncIteration(j, gen_start[j], gen_end[j], train_end[j], max(0, j - k), min(j, k)) for j in range(n)]
    return AsyncReport(max_staleness, gate if n else 0.0, report.total_time_s, bool(overlap and k), {}, out)


def _split(n: int, actor_share: float, inference_share: float, unit: int) -> dict[str, str] | None:
    """A disaggregated placement of ``n`` GPUs in rank order actor, rollout, inference (the actor's GPUs a
    multiple of ``unit``, its instance size), or None when a component would get none; an inference share of 0:
    the inference on the actor's ranks (``actor,inference``), the rollout on the rest."""
    a = int(n * actor_share) // unit * unit
    i = int(n * inference_share)
    r = n - a - i
    if not inference_share and min(a, r) >= 1:
        return {"actor,inference": f"0-{a - 1}", "rollout": f"{a}-{n - 1}"}
    if min(a, i, r) < 1:
        return None
    return {"actor": f"0-{a - 1}", "rollout": f"{a}-{a + r - 1}", "inference": f"{a + r}-{n - 1}"}


def simulate_async(doc: Mapping[str, Any], max_staleness: Sequence[int], seed: int | None = None,
                   search: bool = True, partial: bool | None = None) -> dict[int, AsyncReport]:
    """The config document ``doc`` (disaggregated, static) run asynchronously with each staleness of
    ``max_staleness``, each on the fastest of its own placement and the :data:`SPLITS` (``search``; one synchronous
    simulation per placement serves every staleness); candidates the config or the simulator refuse (an actor DP
    the mini-batch cannot split) are skipped. ``partial`` (default: the document's ``rollout.partial_rollout``):
    weights land mid-generation and requests decode across the gates (:func:`~slurm_rl.scheduler.async_stream.stream`,
    on the :data:`STREAM_SPLITS`)."""
    from slurm_rl.config import config_from_mapping
    from slurm_rl.scheduler.simulate import simulate
    from slurm_rl.scheduler.simulator import SimulationSetupError

    if partial is None:
        partial = bool((doc.get("rollout") or {}).get("partial_rollout", False))
    if partial:
        return _simulate_stream(doc, [k for k in max_staleness if k >= 1], seed, search)

    base = copy.deepcopy(dict(doc))
    base.setdefault("scheduler", {})["policy"] = "static"
    base.setdefault("cluster", {})["auto_scheduler"] = False
    candidates = [dict(base["cluster"]["component_placement"])]
    cfg0 = config_from_mapping(base)
    n, unit = cfg0.num_slots, cfg0.scheduler.actor_ranks_per_instance
    if search:
        candidates += [p for s in SPLITS if (p := _split(n, *s, unit)) is not None and p not in candidates]
    best: dict[int, AsyncReport] = {}
    for placement in candidates:
        trial = copy.deepcopy(base)
        trial["cluster"]["component_placement"] = placement
        try:
            cfg = config_from_mapping(trial)
            sync = simulate(cfg, seed=seed)
        except (ConfigError, SimulationSetupError):  # a DP size the mini-batch cannot split
            continue
        comps = cfg.placement.components
        gpus = {c: len(p.slots) for c, p in comps.items()}
        overlap = not (comps["rollout"].shared_with if "rollout" in comps else ())  # its own ranks: it decodes on
        for k in max_staleness:
            report = pipeline(sync, k, gpus, overlap=overlap, samples=cfg.train.rollout_batch_size
                              * cfg.train.group_size, batch=cfg.train.global_batch_size)
            report.placement = {c: list(p.ranks) for c, p in comps.items()}
            if k not in best or report.total_time_s < best[k].total_time_s:
                best[k] = report
    if not best:
        raise ConfigError([ConfigIssue("cluster.component_placement", dict(doc["cluster"]["component_placement"]),
                                       "a placement the simulator can run")])
    return best


def _simulate_stream(doc: Mapping[str, Any], max_staleness: Sequence[int], seed: int | None,
                     search: bool) -> dict[int, AsyncReport]:
    """:func:`simulate_async` with partial rollout: each bound on the placement of the config's and the
    :data:`STREAM_SPLITS` fastest after the first iteration (which fills the pipeline: a long run's figure); the
    synchronous time is the static run of the placement chosen."""
    from slurm_rl.config import config_from_mapping
    from slurm_rl.scheduler.async_stream import stream
    from slurm_rl.scheduler.simulate import build_setup, simulate
    from slurm_rl.scheduler.simulator import SimulationSetupError

    base = copy.deepcopy(dict(doc))
    base.setdefault("scheduler", {})["policy"] = "static"
    base.setdefault("cluster", {})["auto_scheduler"] = False
    cfg0 = config_from_mapping(base)
    n, unit = cfg0.num_slots, cfg0.scheduler.actor_ranks_per_instance
    candidates = [dict(base["cluster"]["component_placement"])]
    if search:
        candidates += [p for s in STREAM_SPLITS if (p := _split(n, *s, unit)) is not None and p not in candidates]
    best: dict[int, tuple[AsyncReport, Any]] = {}
    for placement in candidates:
        trial = copy.deepcopy(base)
        trial["cluster"]["component_placement"] = placement
        try:
            cfg = config_from_mapping(trial)
            setup, _ = build_setup(cfg, seed=seed)
        except (ConfigError, SimulationSetupError):
            continue
        if "rollout" not in cfg.placement.components or cfg.placement.components["rollout"].shared_with:
            continue  # the rollout decodes on ranks of its own
        for k in max_staleness:
            report = stream(setup, k)
            report.placement = {c: list(p.ranks) for c, p in cfg.placement.components.items()}
            if k not in best or report.steady_iteration_s < best[k][0].steady_iteration_s:
                best[k] = (report, cfg)
    if not best:
        raise ConfigError([ConfigIssue("cluster.component_placement", dict(doc["cluster"]["component_placement"]),
                                       "a disaggregated placement the simulator can run")])
    out = {}
    for k, (report, cfg) in best.items():
        report.sync_time_s = simulate(cfg, seed=seed).total_time_s
        report.partial_rollout = True
        out[k] = report
    return out
