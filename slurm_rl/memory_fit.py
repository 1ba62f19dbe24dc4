"""Whether the phases of a rank that serves several components fit in its GPU's memory (cuda only).

A shared rank holds, in each phase of an iteration (``worker/protocol.py``):

- **generate** (decode, then score): its rollout engine (``hf``: the weights in the actor's compute
  dtype; ``vllm``: ``rollout.gpu_memory_utilization`` of the device, weights and KV cache), its scorers
  where it serves inference (the reference where a KL is weighed, the old log-probs' copy of the policy under
  ``algorithm.old_logprobs: actor``, the critic's copy under ``gae``), and the actor's (and critic's)
  training state unless ``actor.offload_*`` parks it in host memory;
- **train**: the actor's (and critic's) training state, and the scorers unless ``actor.offload_*`` parks
  them too (a parked rollout engine holds nothing on the device).

The training state per parameter: fp32 16 bytes (weights, gradients, two Adam moments), bf16 18 (bf16
weights and fp32 master weights, gradients, moments), divided by the actor's tensor-parallel size. Activations,
the logits of a micro-batch and allocator slack are not counted: this is a lower bound, which is why a
placement it refuses cannot run, while one it accepts may still run out of memory. The device's memory is
``runtime.gpu_memory_gb``, or that of the GPU visible to ``validate``; with neither, nothing is checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slurm_rl.config import Config, ConfigIssue, actor_offloads, actor_precision

GB = 1e9
STATE_BYTES = {"fp32": 16, "bf16": 18}  # per parameter of the training state (see the module docstring)
WEIGHT_BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True)
class PhaseMemory:
    """What a shared rank holds on its device in each phase, in bytes, against its budget."""

    ranks: tuple[int, ...]
    components: tuple[str, ...]
    generate: dict[str, float]
    train: dict[str, float]
    budget: float

    @property
    def need(self) -> float:
        return max(sum(self.generate.values()), sum(self.train.values()))

    def describe(self) -> str:
        def part(held: dict[str, float]) -> str:
            return f"{sum(held.values()) / GB:.1f} GB (" + ", ".join(f"{k} {v / GB:.1f}" for k, v in held.items() if v) + ")"
        return f"generate {part(self.generate)}, train {part(self.train)} of {self.budget / GB:.1f} GB"


def device_budget(cfg: Config) -> float | None:
    """Bytes of one GPU: ``runtime.gpu_memory_gb``, else the first visible GPU's (a read that has not run on
    a GPU yet), else None."""
    if cfg.runtime.gpu_memory_gb is not None:
        return float(cfg.runtime.gpu_memory_gb) * GB
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return float(torch.cuda.get_device_properties(0).total_memory)


def phase_memory(cfg: Config, params: int,
                 roles_ranks: dict[tuple[str, ...], list[int]] | None = None) -> list[PhaseMemory]:
    """Each set of shared ranks' phases (empty: no rank serves several components, or no budget known);
    ``roles_ranks``: the ranks of each combination of components (default: the configured placement's)."""
    budget = device_budget(cfg) if cfg.runtime.device == "cuda" else None
    if budget is None:
        return []
    from slurm_rl.rl.advantages import needs_critic
    from slurm_rl.rl.kl_ctrl import uses_reference

    precision = actor_precision(cfg)
    tp = max(1, cfg.actor.tensor_parallel)
    critic = needs_critic(cfg.algorithm)
    with_actor = critic and not cfg.placement.critic_ranks  # a critic on ranks of its own: not on a shared rank
    state = params * STATE_BYTES[precision] / tp
    weights = params * WEIGHT_BYTES[precision]
    offload = actor_offloads(cfg)
    out = []
    by_roles = cfg.placement.ranks_by_roles() if roles_ranks is None else roles_ranks
    for roles, ranks in by_roles.items():
        if len(roles) < 2:
            continue
        actor = "actor" in roles
        scorers: dict[str, float] = {}
        if "inference" in roles:
            if uses_reference(cfg.algorithm):
                scorers["reference"] = weights
            if cfg.algorithm.old_logprobs == "actor":
                scorers["old log-probs"] = weights
            if critic:
                scorers["values"] = weights
        train = {**({"actor": state, **({"critic": state} if with_actor else {})} if actor else {}),
                 **({} if offload and actor else scorers)}
        generate: dict[str, Any] = {}
        if "rollout" in roles:
            generate["rollout"] = (cfg.rollout.gpu_memory_utilization * budget if cfg.rollout.backend == "vllm"
                                   else weights)
        generate.update(scorers)
        if actor and not offload:
            generate.update({"actor kept": state, **({"critic kept": state} if with_actor else {})})
        out.append(PhaseMemory(tuple(ranks), tuple(roles), generate, train, budget))
    return out


def memory_problems(cfg: Config, params: int) -> list[ConfigIssue]:
    """A problem per set of shared ranks whose phases cannot fit (see the module docstring)."""
    issues = []
    for pm in phase_memory(cfg, params):
        if pm.need <= pm.budget:
            continue
        hints = []
        if not actor_offloads(cfg):
            hints.append("actor.offload_weight: true (the actor's state waits in host memory while the rank generates)")
        if cfg.rollout.backend == "vllm":
            hints.append("a lower rollout.gpu_memory_utilization")
        hints.append("the components on ranks of their own")
        issues.append(ConfigIssue("cluster.component_placement", dict(cfg.raw.cluster.component_placement), (
            f"phases that fit in one GPU: ranks {list(pm.ranks)} serve {', '.join(pm.components)} and need at least "
            f"{pm.describe()} (runtime.gpu_memory_gb, or the visible GPU); try {', or '.join(hints)}")))
    return issues


def collocated_overflow(cfg: Config, params: int) -> PhaseMemory | None:
    """What a rank needs when every configured component shares it (an iteration ``plan`` runs collocated),
    where that exceeds one GPU; None where it fits or no budget is known (see :func:`device_budget`)."""
    roles = tuple(c for c, comp in cfg.placement.components.items() if comp.ranks)
    fits = phase_memory(cfg, params, {roles: list(range(cfg.placement.world_size))})
    return fits[0] if fits and fits[0].need > fits[0].budget else None


def time_slicing_memory_problems(cfg: Config, params: int) -> list[ConfigIssue]:
    """Under ``plan`` with ``scheduler.time_slicing: true``: a problem when every configured component on one
    GPU (an iteration plan runs collocated) cannot fit (see the module docstring). Left at null, plan then
    runs every iteration disaggregated instead (``launch.prepare``)."""
    if cfg.scheduler.policy != "plan" or cfg.scheduler.time_slicing is not True:
        return []
    pm = collocated_overflow(cfg, params)
    if pm is None:
        return []
    hint = "" if actor_offloads(cfg) else ", or actor.offload_weight: true"
    return [ConfigIssue("scheduler.time_slicing", True, (
        f"false or null, or phases that fit in one GPU: plan may run an iteration with {', '.join(pm.components)} "
        f"on every rank, which needs at least {pm.describe()} (runtime.gpu_memory_gb, or the visible GPU){hint}"))]
