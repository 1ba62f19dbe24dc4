"""Seeded traces of RL post-training jobs for the multiplexing simulator (RollMux-like).

Jobs arrive as a Poisson process. Each has a type, a model size and a solo setup (rollout nodes
of H20, training nodes of H800, 8 GPUs per node); its phase times follow from a small hardware
model, not from a target figure:

* decode on an H20 is memory-bound: a 7B model decodes 3,000 tokens/s per GPU at 64 running
  requests (47 tokens/s per request); per GPU, throughput scales with ``7/P`` and concurrency
  with ``sqrt(7/P)`` for a ``P``-billion model (so a 70B request decodes at ~15 tokens/s, 20 per
  GPU). Prefill is not modelled (prompts are shared by a GRPO group and cached).
* training on an H800 (actor forward+backward, old-logprob and reference passes) processes
  5,000 tokens/s per GPU at 7B, scaling with ``7/P``.
* parked state per node: rollout keeps a bf16 weight copy (2 bytes/param) on every rollout node;
  training keeps weights, gradients and Adam moments (16 bytes/param) sharded over its nodes.
  Host memory: 1 TB per node.
* switches (RollMux measurements, interpolated in log model size between 7B and 70B): warm rollout
  0.9-1.9 s, warm training 4.1-5.9 s, cold start 135 s per node at 70B (60 s at 7B: our
  assumption); tail hand-off 2 s (our assumption).

Types: ``reasoning`` (long chain-of-thought math/code: long, long-tailed responses; rollout-heavy),
``agentic`` (multi-turn tool use: fewer, very long responses; rollout-heavy, the longest tails),
``rlhf`` (short chat responses to long prompts, many samples: training-heavy) and ``balanced``
(math with a 4k budget and long prompts: rollout about as long as training). A job's responses
are simulated as ``units`` units of ``responses_per_unit`` responses of one sampled length each
(lanes count units too).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Mapping

from slurm_rl.mux.model import JobProfile, SwitchCosts

GPUS_PER_NODE = 8
HOST_BYTES_PER_NODE = 1.0e12
DECODE_TOK_S_7B = 3000.0  # per H20 GPU at full batch, 7B
LANES_PER_GPU_7B = 64  # concurrent requests per H20 GPU, 7B
TRAIN_TOK_S_7B = 5000.0  # per H800 GPU, 7B (forward, backward, old-logprob and reference passes)
MODEL_SIZES = (7.0, 14.0, 32.0, 70.0)
#: training (and rollout) nodes per model size
TRAIN_NODES = {7.0: 1, 14.0: 1, 32.0: 2, 70.0: 4}


@dataclass(frozen=True)
class JobType:
    """Workload of one job type: ranges are sampled uniformly (ints inclusive)."""

    responses: tuple[int, int]  # responses per iteration (prompts x group size)
    mean_len: tuple[float, float]  # mean response tokens
    sigma: float  # lognormal shape of response lengths
    max_len: tuple[int, ...]  # choices of the max response length
    prompt_len: tuple[int, int]


JOB_TYPES: Mapping[str, JobType] = {
    "reasoning": JobType((512, 1024), (3000.0, 6000.0), 1.0, (16384, 32768), (256, 1024)),
    "agentic": JobType((256, 512), (6000.0, 10000.0), 1.2, (32768,), (2048, 4096)),
    "rlhf": JobType((2048, 4096), (300.0, 600.0), 0.6, (2048,), (1024, 4096)),
    "balanced": JobType((1024, 2048), (1000.0, 2000.0), 0.8, (4096,), (1024, 3072)),
}


@dataclass(frozen=True)
class TraceSpec:
    """What to generate."""

    jobs: int = 200
    seed: int = 0
    mean_interarrival_s: float = 900.0
    type_mix: Mapping[str, float] = field(default_factory=lambda: {
        "reasoning": 0.2, "agentic": 0.13, "rlhf": 0.33, "balanced": 0.34})
    size_mix: Mapping[float, float] = field(default_factory=lambda: {7.0: 0.4, 14.0: 0.25, 32.0: 0.2, 70.0: 0.15})
    iterations: tuple[int, int] = (10, 40)
    slo: tuple[float, float] = (1.0, 2.0)
    units: int = 64  # simulated response units per iteration
    patterns: int = 3  # distinct iterations sampled per job (cycled)


def decode_tok_s_per_request(model_b: float) -> float:
    """Per-request decode speed on an H20 (tokens/s)."""
    return DECODE_TOK_S_7B / LANES_PER_GPU_7B * math.sqrt(7.0 / model_b)


def lanes_per_gpu(model_b: float) -> int:
    return max(1, int(LANES_PER_GPU_7B * math.sqrt(7.0 / model_b)))


def train_tok_s_per_gpu(model_b: float) -> float:
    return TRAIN_TOK_S_7B * 7.0 / model_b


def switch_costs(model_b: float) -> SwitchCosts:
    """RollMux's warm/cold switch times, interpolated in log model size (7B..70B)."""
    x = min(1.0, max(0.0, math.log(model_b / 7.0) / math.log(10.0)))
    return SwitchCosts(rollout_warm_s=0.9 + x * 1.0, train_warm_s=4.1 + x * 1.8,
                       cold_s=60.0 + x * 75.0, migrate_s=2.0)


def _pick(rng: random.Random, mix: Mapping, ) -> object:
    keys = list(mix)
    return rng.choices(keys, weights=[mix[k] for k in keys])[0]


def make_job(name: str, kind: str, model_b: float, iterations: int, slo: float, arrival_s: float,
             rng: random.Random, units: int = 64, patterns: int = 3) -> JobProfile:
    """One job of type ``kind`` (see :data:`JOB_TYPES`), phase times from the hardware model."""
    jt = JOB_TYPES[kind]
    n = rng.randint(*jt.responses)
    mean_len = rng.uniform(*jt.mean_len)
    max_len = rng.choice(jt.max_len)
    prompt = rng.randint(*jt.prompt_len)
    train_nodes = TRAIN_NODES[model_b]
    rollout_nodes = train_nodes  # the common 1:1 disaggregated split
    per_unit = max(1, n // units)
    u = max(1, n // per_unit)
    v = decode_tok_s_per_request(model_b)
    lanes = max(1, lanes_per_gpu(model_b) * GPUS_PER_NODE // per_unit)
    train_rate = train_tok_s_per_gpu(model_b) * GPUS_PER_NODE * train_nodes
    mu = math.log(mean_len) - jt.sigma ** 2 / 2
    response_s, train_s = [], []
    for _ in range(patterns):
        lens = [max(1, min(max_len, int(rng.lognormvariate(mu, jt.sigma)))) for _ in range(u)]
        response_s.append(tuple(ln / v for ln in lens))
        train_s.append(sum(per_unit * (prompt + ln) for ln in lens) / train_rate)
    params = model_b * 1e9
    return JobProfile(
        name=name, iterations=iterations, rollout_slots=rollout_nodes, train_slots=train_nodes,
        lanes_per_slot=lanes, response_s=tuple(response_s), train_s=tuple(train_s),
        max_response_s=max_len / v, train_max_s=u * per_unit * (prompt + max_len) / train_rate,
        max_response_len=max_len, mean_response_len=mean_len, slo=slo,
        rollout_bytes_per_slot=2.0 * params, train_bytes_per_slot=16.0 * params / train_nodes,
        switch=switch_costs(model_b), arrival_s=arrival_s, kind=kind, model_b=model_b,
        responses_per_unit=per_unit)


def generate(spec: TraceSpec = TraceSpec()) -> list[JobProfile]:
    """``spec.jobs`` jobs with Poisson arrivals (deterministic given ``spec.seed``)."""
    rng = random.Random(spec.seed)
    t = 0.0
    out = []
    for i in range(spec.jobs):
        t += rng.expovariate(1.0 / spec.mean_interarrival_s)
        kind = str(_pick(rng, spec.type_mix))
        size = float(_pick(rng, spec.size_mix))  # type: ignore[arg-type]
        out.append(make_job(f"job{i:03d}", kind, size, rng.randint(*spec.iterations),
                            round(rng.uniform(*spec.slo), 3), round(t, 3), rng, spec.units, spec.patterns))
    return out
