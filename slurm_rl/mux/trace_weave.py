"""The ``weave`` trace: RL jobs drawn from the statistics the RollMux paper publishes.

Source: T. Wu et al., "RollMux: Phase-Level Multiplexing for Disaggregated RL Post-Training"
(OSDI'26, arXiv 2512.11306, v2), cited below as [P]. Every distribution names where it comes from;
where [P] (as far as its text was available: abstract, design, testbed, workload and results
figures) is silent, the comment says so and the value is a documented, conservative choice — the
same as the default trace's where one exists. Nothing here was chosen by looking at a result.

What [P] gives and how it is used:

* arrivals: 200 jobs over two weeks [P, workload] -> Poisson, mean gap 14 d / 200 = 6,048 s;
* models: 3B-32B [P, workload] -> the four Qwen2.5 dense sizes in that range (3, 7, 14, 32B),
  equally likely ([P] silent on the mix);
* response budgets: 4k-32k tokens [P, workload] -> 4k, 8k, 16k, 32k, equally likely ([P] silent on
  the mix); mean generated length about 12.1k tokens [P, workload] -> every job's lengths are
  lognormal, capped at its budget, with the uncapped mean set so that the *capped* mean is the same
  share of the budget for every job: 12.1k / E[budget] = 12.1k / 15.36k = 0.788;
* job types: [P] names agentic jobs, whose rollout is 3-4x their training phase [P, workload]: an
  agentic job's rollout (decode plus tool and environment turns) is drawn U(3, 4) x its training
  phase. The other jobs are single-turn reasoning (math/code RLVR), whose phase times follow
  from the hardware model below. [P] is silent on the mix: half and half;
* GPUs per job: [P] is silent -> the default trace's sizes (one 8-GPU node per pool up to 14B,
  two at 32B) with the common 1:1 split of rollout (H20) and training (H800) nodes;
* job length: [P] gives no iteration counts, but its Solo-D bill, $0.94k/h [P, results], is a
  property of the workload alone (every job on its own pools). By Little's law a job holds its
  pools on average W = L / lambda with L = 940 / 57.04 = 16.5 node pairs held (8 H20 + 8 H800 at
  [P]'s prices) and lambda = 1 / 6,048 s: each job's solo duration is drawn U(0.5, 1.5) x W /
  E[node pairs per job] and its iterations follow from its solo iteration time;
* SLOs: [P] is silent on their distribution (it reports 100 % attainment) -> U(1, 2) slowdown vs
  solo, as the default trace: tight SLOs near 1.0 are included (conservative: they forbid sharing);
* prices: H20 $1.85/h, H800 $5.28/h per GPU (2.85x) [P, testbed] (:data:`~.model.GPU_PRICE`);
* host memory: 1-2 TB per node [P, design] -> 1 TB (the smaller: conservative);
* switches: warm rollout 0.9-1.9 s, warm training 4.1-5.9 s (7B-70B) [P, design]
  (:func:`~.trace.switch_costs`); cold start <= 135 s per 8-GPU node [P, design] -> 135 s for every
  size (the bound: conservative);
* decode and training speeds, prompt lengths, responses per iteration and the lognormal shape:
  [P] is silent -> the default trace's hardware model and ranges (:mod:`~.trace`).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from slurm_rl.mux.model import GPU_PRICE, JobProfile
from slurm_rl.mux.trace import (GPUS_PER_NODE, _pick, decode_tok_s_per_request, lanes_per_gpu, switch_costs,
                                train_tok_s_per_gpu)

#: [P]'s prices per GPU-hour (USD)
USD_PER_GPU_HOUR = {"H20": 1.85, "H800": 5.28}
WEAVE_SIZES = (3.0, 7.0, 14.0, 32.0)
WEAVE_TRAIN_NODES = {3.0: 1, 7.0: 1, 14.0: 1, 32.0: 2}
BUDGETS = (4096, 8192, 16384, 32768)
MEAN_GENERATED = 12_100  # tokens [P]
COLD_START_S = 135.0  # [P]: cold start <= 135 s per 8-GPU node
SOLO_D_USD_PER_H = 940.0  # [P]: Solo-D's bill on the 200-job trace
TWO_WEEKS_S = 14 * 24 * 3600.0


@dataclass(frozen=True)
class WeaveType:
    """One job type (ranges uniform, ints inclusive)."""

    responses: tuple[int, int]  # responses per iteration (prompts x group size): [P] silent
    sigma: float  # lognormal shape of response lengths: [P] silent
    prompt_len: tuple[int, int]  # [P] silent
    rollout_over_train: tuple[float, float] | None = None  # None: from the hardware model


WEAVE_TYPES: Mapping[str, WeaveType] = {
    "reasoning": WeaveType((512, 1024), 1.0, (256, 1024)),
    "agentic": WeaveType((256, 512), 1.2, (2048, 4096), rollout_over_train=(3.0, 4.0)),  # [P]: 3-4x
}


@dataclass(frozen=True)
class WeaveSpec:
    """What to generate (defaults: [P]'s trace as above)."""

    jobs: int = 200
    seed: int = 0
    mean_interarrival_s: float = TWO_WEEKS_S / 200
    type_mix: Mapping[str, float] = field(default_factory=lambda: {"reasoning": 0.5, "agentic": 0.5})
    size_mix: Mapping[float, float] = field(default_factory=lambda: {s: 0.25 for s in WEAVE_SIZES})
    budget_mix: Mapping[int, float] = field(default_factory=lambda: {b: 0.25 for b in BUDGETS})
    slo: tuple[float, float] = (1.0, 2.0)
    duration_spread: tuple[float, float] = (0.5, 1.5)  # x the mean solo duration from Little's law
    units: int = 64
    patterns: int = 3


def capped_mean(mu: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for X lognormal(mu, sigma)."""
    phi = lambda x: 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))  # noqa: E731
    z = (math.log(cap) - mu) / sigma
    return math.exp(mu + sigma ** 2 / 2) * phi(z - sigma) + cap * (1.0 - phi(z))


def mu_for_capped_mean(target: float, sigma: float, cap: float) -> float:
    """The lognormal ``mu`` whose lengths capped at ``cap`` average ``target`` (< cap), by bisection."""
    if not 0 < target < cap:
        raise ValueError(f"target mean {target} must be in (0, cap={cap})")
    lo, hi = math.log(target) - 10.0, math.log(cap) + 10.0 * sigma
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if capped_mean(mid, sigma, cap) < target else (lo, mid)
    return (lo + hi) / 2


def budget_share(budget_mix: Mapping[int, float]) -> float:
    """The capped mean as a share of the budget that gives [P]'s mean generated length."""
    total = sum(budget_mix.values())
    return MEAN_GENERATED / (sum(b * w for b, w in budget_mix.items()) / total)


def node_pairs_usd_per_h(nodes: int) -> float:
    return nodes * GPUS_PER_NODE * (USD_PER_GPU_HOUR["H20"] + USD_PER_GPU_HOUR["H800"])


def mean_solo_hours(spec: WeaveSpec) -> float:
    """W / E[node pairs]: a job's mean solo duration for Solo-D to cost [P]'s $/h (Little's law)."""
    pairs_held = SOLO_D_USD_PER_H / node_pairs_usd_per_h(1)
    total = sum(spec.size_mix.values())
    pairs_per_job = sum(WEAVE_TRAIN_NODES[s] * w for s, w in spec.size_mix.items()) / total
    return pairs_held * spec.mean_interarrival_s / 3600 / pairs_per_job


def make_weave_job(name: str, kind: str, model_b: float, budget: int, slo: float, arrival_s: float,
                   solo_hours: float, rng: random.Random, spec: WeaveSpec) -> JobProfile:
    """One job of ``kind`` with phase times from the hardware model (agentic: rollout scaled to the
    drawn multiple of its training phase)."""
    wt = WEAVE_TYPES[kind]
    n = rng.randint(*wt.responses)
    prompt = rng.randint(*wt.prompt_len)
    nodes = WEAVE_TRAIN_NODES[model_b]
    per_unit = max(1, n // spec.units)
    u = max(1, n // per_unit)
    v = decode_tok_s_per_request(model_b)
    lanes = max(1, lanes_per_gpu(model_b) * GPUS_PER_NODE // per_unit)
    train_rate = train_tok_s_per_gpu(model_b) * GPUS_PER_NODE * nodes
    target = budget_share(spec.budget_mix) * budget
    mu = mu_for_capped_mean(target, wt.sigma, budget)
    lens_all = [[max(1, min(budget, int(rng.lognormvariate(mu, wt.sigma)))) for _ in range(u)]
                for _ in range(spec.patterns)]
    train_s = [sum(per_unit * (prompt + ln) for ln in lens) / train_rate for lens in lens_all]
    scale = 1.0
    ratio = rng.uniform(*wt.rollout_over_train) if wt.rollout_over_train else None
    base = JobProfile(name=name, iterations=1, rollout_slots=nodes, train_slots=nodes, lanes_per_slot=lanes,
                      response_s=tuple(tuple(ln / v for ln in lens) for lens in lens_all), train_s=tuple(train_s),
                      max_response_s=budget / v, train_max_s=u * per_unit * (prompt + budget) / train_rate)
    if ratio is not None:  # tool and environment turns stretch each response's rollout time alike
        scale = ratio * base.expected_train_s() / base.expected_rollout_s()
    params = model_b * 1e9
    job = replace(
        base, response_s=tuple(tuple(d * scale for d in r) for r in base.response_s),
        max_response_s=base.max_response_s * scale, max_response_len=budget, mean_response_len=target, slo=slo,
        rollout_bytes_per_slot=2.0 * params, train_bytes_per_slot=16.0 * params / nodes,
        switch=replace(switch_costs(model_b), cold_s=COLD_START_S), arrival_s=arrival_s, kind=kind,
        model_b=model_b, responses_per_unit=per_unit)
    iters = max(1, round(solo_hours * 3600 / job.solo_iteration_s()))
    return replace(job, iterations=iters)


def generate_weave(spec: WeaveSpec = WeaveSpec()) -> list[JobProfile]:
    """``spec.jobs`` jobs of the weave trace (deterministic given ``spec.seed``)."""
    rng = random.Random(spec.seed)
    mean_h = mean_solo_hours(spec)
    t = 0.0
    out = []
    for i in range(spec.jobs):
        t += rng.expovariate(1.0 / spec.mean_interarrival_s)
        kind = str(_pick(rng, spec.type_mix))
        size = float(_pick(rng, spec.size_mix))  # type: ignore[arg-type]
        budget = int(_pick(rng, spec.budget_mix))  # type: ignore[call-overload]
        slo = round(rng.uniform(*spec.slo), 3)
        hours = mean_h * rng.uniform(*spec.duration_spread)
        out.append(make_weave_job(f"job{i:03d}", kind, size, budget, slo, round(t, 3), hours, rng, spec))
    return out


def generated_tokens(job: JobProfile) -> float:
    """Mean generated tokens per response over the job's sampled iterations (from the decode times)."""
    v = job.max_response_len / job.max_response_s if job.max_response_s else 0.0
    n = sum(len(r) for r in job.response_s)
    return sum(d * v for r in job.response_s for d in r) / n if n and v else 0.0


def statistics_table(jobs: Sequence[JobProfile], solo_usd_per_h: float | None = None) -> list[dict[str, Any]]:
    """Rows (quantity, paper, ours) of the trace beside [P]'s published figures."""
    span_d = (max(j.arrival_s for j in jobs) - min(j.arrival_s for j in jobs)) / 86400
    agentic = [j for j in jobs if j.kind == "agentic"]
    ratio = [j.expected_rollout_s() / j.expected_train_s() for j in agentic]
    sizes = sorted({j.model_b for j in jobs})
    budgets = sorted({j.max_response_len for j in jobs})
    rows = [
        {"quantity": "jobs", "paper": 200, "ours": len(jobs)},
        {"quantity": "span (days)", "paper": 14, "ours": round(span_d, 1)},
        {"quantity": "model sizes (B)", "paper": "3-32", "ours": f"{sizes[0]:g}-{sizes[-1]:g} {[f'{s:g}' for s in sizes]}"},
        {"quantity": "response budgets (tokens)", "paper": "4k-32k", "ours": f"{budgets[0]}-{budgets[-1]}"},
        {"quantity": "mean generated tokens", "paper": 12100,
         "ours": round(statistics.mean(generated_tokens(j) for j in jobs))},
        {"quantity": "agentic rollout / training", "paper": "3-4x",
         "ours": f"{min(ratio):.2f}-{max(ratio):.2f}x" if ratio else "-"},
        {"quantity": "H800 / H20 price", "paper": 2.85, "ours": GPU_PRICE["H800"] / GPU_PRICE["H20"]},
    ]
    if solo_usd_per_h is not None:
        rows.append({"quantity": "Solo-D $/h (job length set from it)", "paper": SOLO_D_USD_PER_H,
                     "ours": round(solo_usd_per_h)})
    rows += [
        {"quantity": "reasoning rollout / training (median)", "paper": "not given",
         "ours": round(statistics.median(j.expected_rollout_s() / j.expected_train_s()
                                         for j in jobs if j.kind != "agentic"), 2)},
        {"quantity": "solo iteration s (median)", "paper": "not given",
         "ours": round(statistics.median(j.solo_iteration_s() for j in jobs))},
        {"quantity": "iterations per job (median)", "paper": "not given",
         "ours": statistics.median(j.iterations for j in jobs)},
        {"quantity": "max-length / expected iteration (median)", "paper": "not given",
         "ours": round(statistics.median(j.solo_iteration_s(True) / j.solo_iteration_s() for j in jobs), 2)},
    ]
    return rows
