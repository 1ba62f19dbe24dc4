"""The rollout engine's vLLM options (verl's ``rollout.*`` names): their defaults and the values vLLM
would refuse, checked before a launch.

Bottom layer beside :mod:`slurm_rl.config`, which calls :func:`rollout_engine_problems`; the engines read
:func:`resolve_engine_options`. Sizes come as a mapping (``max_position_embeddings``,
``num_attention_heads``, ``num_query_groups``): a random model's from the config, a checkpoint's from its
``config.json`` (:mod:`slurm_rl.inputs`).
"""

from __future__ import annotations

import typing
from typing import Any, Literal, Mapping, Optional, Sequence

from slurm_rl.placement import ConfigIssue, Placement

RolloutDtype = Literal["bfloat16", "float16", "float32"]
ROLLOUT_DTYPES = typing.get_args(RolloutDtype)
PRECISION_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}  # actor.precision -> vLLM dtype


def prompt_budget(max_prompt_length: Optional[int], max_new_tokens: int) -> Optional[int]:
    """Tokens one request may need: ``data.max_prompt_length + rollout.max_new_tokens`` (None when the
    prompt length is not bounded)."""
    return None if max_prompt_length is None else max_prompt_length + max_new_tokens


def engine_max_model_len(ro: Any, max_prompt_length: Optional[int], context: int) -> int:
    """``rollout.max_model_len``, where null: the prompt + response budget, else the model's context."""
    if ro.max_model_len is not None:
        return int(ro.max_model_len)
    budget = prompt_budget(max_prompt_length, ro.max_new_tokens)
    return min(budget, context) if budget is not None else context


def engine_dtype(ro: Any, device: str, actor_precision: str) -> str:
    """``rollout.dtype``, where null: the actor's precision on cuda (bf16 under ``auto``), float32 on cpu."""
    if ro.dtype is not None:
        return str(ro.dtype)
    return PRECISION_DTYPES.get(actor_precision, "float32") if device == "cuda" else "float32"


def resolve_engine_options(ro: Any, device: str, actor_precision: str, max_prompt_length: Optional[int],
                           context: int) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments of the rollout section on ``device`` (nulls resolved; vLLM's own
    defaults are left out)."""
    out: dict[str, Any] = {
        "dtype": engine_dtype(ro, device, actor_precision),
        "enforce_eager": ro.enforce_eager if ro.enforce_eager is not None else device != "cuda",
        "max_model_len": engine_max_model_len(ro, max_prompt_length, context),
        "enable_prefix_caching": bool(ro.enable_prefix_caching),
        "gpu_memory_utilization": float(ro.gpu_memory_utilization),
    }
    for key in ("enable_chunked_prefill", "max_num_seqs", "max_num_batched_tokens"):
        if getattr(ro, key) is not None:
            out[key] = getattr(ro, key)
    return out


def slots_per_rollout_process(placement: Placement) -> int:
    """Accelerator slots each rollout process owns (``"0-3:0-1"``: 2); 1 without a rollout."""
    comp = placement.components.get("rollout")
    if comp is None or not comp.ranks:
        return 1
    owned = placement.slots_of_rank
    return max(len(owned[r]) for r in comp.ranks) if owned is not None else 1


def engine_tp(ro: Any, placement: Optional[Placement], ranks_per_instance: int = 1) -> int:
    """``rollout.tensor_model_parallel_size``, where null: the slots each rollout process owns times
    ``scheduler.rollout_ranks_per_instance`` (1 and 1 unless set)."""
    if ro.tensor_model_parallel_size is not None:
        return int(ro.tensor_model_parallel_size)
    return (1 if placement is None else slots_per_rollout_process(placement)) * max(ranks_per_instance, 1)


def processes_per_engine(ro: Any, placement: Placement, ranks_per_instance: int = 1) -> int:
    """Rollout ranks that hold one engine: the TP size over the slots each of them owns."""
    return max(1, engine_tp(ro, placement, ranks_per_instance) // slots_per_rollout_process(placement))


def tp_head_problems(sizes: Mapping[str, Any], tp: int) -> list[str]:
    """Why vLLM cannot split a model of ``sizes`` over ``tp`` ranks: the attention heads divide by it, and
    the KV heads (``num_query_groups``, null: the heads) divide by it or it by them (replicated KV)."""
    heads, groups = sizes.get("num_attention_heads"), sizes.get("num_query_groups")
    groups = groups if groups is not None else heads
    out = []
    if isinstance(heads, int) and heads > 0 and heads % tp:
        out.append(f"num_attention_heads {heads} is not a multiple of {tp}")
    if isinstance(groups, int) and groups > 0 and groups % tp and tp % groups:
        out.append(f"the {groups} KV heads neither divide by {tp} nor divide it")
    return out


def rollout_engine_problems(ro: Any, *, backend_vllm: bool, device: str, max_prompt_length: Optional[int],
                            sizes: Optional[Mapping[str, Any]], where: str) -> list[ConfigIssue]:
    """The rollout section's engine options that vLLM would refuse, or that cannot hold a request of
    ``data.max_prompt_length + rollout.max_new_tokens`` tokens; ``sizes`` (None: not known here) are the
    model's, described by ``where`` in the messages."""
    out: list[ConfigIssue] = []
    for key in ("tensor_model_parallel_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        value = getattr(ro, key)
        if value is not None and value < 1:
            out.append(ConfigIssue(f"rollout.{key}", value, "a positive int, or null (the default)"))
    if ro.dtype is not None and ro.dtype not in ROLLOUT_DTYPES:
        out.append(ConfigIssue("rollout.dtype", ro.dtype, f"one of {', '.join(ROLLOUT_DTYPES)}, or null "
                                                          "(the actor's precision on cuda, float32 on cpu)"))
    elif ro.dtype == "float16" and device == "cpu":
        out.append(ConfigIssue("rollout.dtype", ro.dtype, "bfloat16 or float32 on cpu (vLLM's cpu backend)"))
    if out:
        return out
    budget = prompt_budget(max_prompt_length, ro.max_new_tokens)
    context = sizes.get("max_position_embeddings") if sizes is not None else None
    if isinstance(context, int) and budget is not None and budget > context:
        out.append(ConfigIssue("rollout.max_new_tokens", ro.max_new_tokens, (
            f"at most {context - max_prompt_length} so that a prompt of data.max_prompt_length ({max_prompt_length}) "
            f"and its response fit the model's context of {context} tokens ({where})")))
    elif isinstance(context, int) and backend_vllm and ro.max_new_tokens >= context:
        out.append(ConfigIssue("rollout.max_new_tokens", ro.max_new_tokens, (
            f"less than the model's context of {context} tokens ({where}), leaving room for the prompt")))
    if ro.max_model_len is not None:
        if budget is not None and ro.max_model_len < budget:
            out.append(ConfigIssue("rollout.max_model_len", ro.max_model_len, (
                f"at least data.max_prompt_length + rollout.max_new_tokens = {max_prompt_length} + "
                f"{ro.max_new_tokens} = {budget} (vLLM refuses a longer request), or null (that sum)")))
        elif ro.max_model_len <= ro.max_new_tokens:
            out.append(ConfigIssue("rollout.max_model_len", ro.max_model_len, (
                f"more than rollout.max_new_tokens ({ro.max_new_tokens}), room for the prompt too, or null")))
        if isinstance(context, int) and ro.max_model_len > context:
            out.append(ConfigIssue("rollout.max_model_len", ro.max_model_len, (
                f"at most the model's context of {context} tokens ({where}; vLLM refuses more), or null")))
    if backend_vllm:
        out += _scheduler_problems(ro, max_prompt_length, context if isinstance(context, int) else None)
    tp = ro.tensor_model_parallel_size
    if sizes is not None and tp is not None and tp > 1:
        problems = tp_head_problems(sizes, tp)
        if problems:
            out.append(ConfigIssue("rollout.tensor_model_parallel_size", tp, (
                f"a size the model's attention splits over ({where}: {'; '.join(problems)})")))
    return out


def _scheduler_problems(ro: Any, max_prompt_length: Optional[int], context: Optional[int]) -> list[ConfigIssue]:
    """vLLM's scheduler rules: ``max_num_batched_tokens >= max_num_seqs``, and without chunked prefill
    ``max_num_batched_tokens >= max_model_len``."""
    tokens = ro.max_num_batched_tokens
    if tokens is None:
        return []
    out = []
    if ro.max_num_seqs is not None and tokens < ro.max_num_seqs:
        out.append(ConfigIssue("rollout.max_num_batched_tokens", tokens, (
            f"at least rollout.max_num_seqs ({ro.max_num_seqs}): vLLM's scheduler refuses fewer")))
    if ro.enable_chunked_prefill is False and context is not None:
        length = engine_max_model_len(ro, max_prompt_length, context)
        if tokens < length:
            out.append(ConfigIssue("rollout.max_num_batched_tokens", tokens, (
                f"at least the engine's max_model_len ({length}) with rollout.enable_chunked_prefill false "
                "(a prompt is prefilled in one step), or enable_chunked_prefill true")))
    return out


def rollout_placement_problems(ro: Any, placement: Placement, key: str, spec: Any,
                               ranks_per_instance: int, node_of: Any, straddling: Any,
                               device: str = "emulated", policy: str = "static",
                               pre_process: bool = False) -> list[ConfigIssue]:
    """The rollout's ranks split into whole engines of :func:`processes_per_engine` consecutive ranks, each
    inside one node; a process owning several slots runs an engine of that TP size by itself;
    ``scheduler.rollout_ranks_per_instance`` is 1 (follows the engine) or the engine's rank count (a null
    TP size follows it). On cpu / cuda an engine over several ranks is a vLLM one (``tp_host``) under the
    static policy or ``auto`` without the pre-process rule: its ranks leave and rejoin the rollout together,
    never other ranks (docs/gpu_jobs.md)."""
    comp = placement.components.get("rollout")
    if comp is None:
        return []
    slots = slots_per_rollout_process(placement)
    tp = engine_tp(ro, placement, ranks_per_instance)
    if slots > 1 and tp != slots:
        return [ConfigIssue("rollout.tensor_model_parallel_size", tp, (
            f"{slots} or null: the placement {key}: {spec!r} gives each rollout process {slots} slots, one TP-{slots} "
            "engine per process; for engines of one process per GPU give each process one slot"))]
    per = processes_per_engine(ro, placement, ranks_per_instance)
    # a vLLM engine over several ranks (tp_host) on cpu / cuda, however its size was given (rollout's TP size, or
    # scheduler.rollout_ranks_per_instance with a null one): what the worker builds then
    if per > 1 and device != "emulated" and (ro.backend == "vllm" or ro.tensor_model_parallel_size is not None):
        if ro.backend != "vllm":
            return [ConfigIssue("rollout.tensor_model_parallel_size", tp, (
                f"{slots} with rollout.backend {ro.backend} on runtime.device {device}: its engine is one process; "
                f"an engine over {per} ranks of one GPU each is vLLM's (rollout.backend vllm)"))]
        if policy not in ("static", "auto"):
            return [ConfigIssue("scheduler.policy", policy, (
                f"static or auto with rollout engines over {per} ranks on runtime.device {device} (each rank's part "
                "of an engine lives in a process of its own: the engine's ranks leave and rejoin the rollout "
                f"together, never other ranks: docs/gpu_jobs.md), or rollout.tensor_model_parallel_size {slots} "
                "(the slots each rollout process owns)"))]
        if pre_process:
            return [ConfigIssue("cluster.use_pre_process_policy", True, (
                f"false with rollout engines over {per} ranks on runtime.device {device}: the pre-process rule lends "
                "the actor's ranks to the rollout, where engines over ranks would have to start mid-iteration "
                "(docs/gpu_jobs.md)"))]
    out = []
    if len(comp.ranks) % per:
        out.append(ConfigIssue(key, spec, (
            f"a rollout rank count that is a multiple of rollout.tensor_model_parallel_size ({tp}): one engine "
            f"per {per} ranks (got {len(comp.ranks)} ranks)")))
    else:
        for group in straddling(comp.ranks, per, node_of):
            out.append(ConfigIssue(key, spec, (
                f"rollout engines ({per} consecutive rollout ranks) inside one node: ranks {list(group)} lie on "
                "several nodes")))
    if ranks_per_instance > 1 and ranks_per_instance != per:  # < 1 is reported on its own
        out.append(ConfigIssue("scheduler.rollout_ranks_per_instance", ranks_per_instance, (
            f"{per} (the ranks of one engine: rollout.tensor_model_parallel_size {tp}), or 1 (the default, "
            "which follows it)")))
    return out


__all__: Sequence[str] = (
    "ROLLOUT_DTYPES", "engine_dtype", "engine_max_model_len", "engine_tp", "processes_per_engine",
    "resolve_engine_options", "rollout_engine_problems", "rollout_placement_problems", "tp_head_problems")
