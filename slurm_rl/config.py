"""Typed configuration: OmegaConf schema, loading with overrides, validation.

``load_config`` merges a YAML file and ``key=value`` overrides onto the dataclass schema below,
resolves interpolations (``${now:%Y%m%d-%H%M%S}``), resolves ``cluster.gpus_per_node`` from the
Slurm allocation when it is not given, validates everything, and returns an immutable
:class:`Config`. Every problem is collected into one :class:`ConfigError`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
import pickle
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Dict, List, Literal, Optional

import yaml
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slurm_rl.rollout_config import ROLLOUT_DTYPES, processes_per_engine, rollout_engine_problems, rollout_placement_problems
from slurm_rl.placement import (
    COMPONENTS,
    MISSING_VALUE,
    ComponentPlacement,
    ConfigError,
    ConfigIssue,
    Placement,
    parse_placement,
    placement_from_ranks,
)

__all__ = [
    "COMPONENTS", "ActorSection", "AlgorithmSection", "ClusterConfig", "ComponentPlacement", "Config",
    "ConfigError", "ConfigIssue", "DataSection", "EmulatedConfig", "InferenceSection", "ModelSection",
    "MuxMemberConfig", "Placement", "RolloutSection", "RuntimeConfig", "SchedulerConfig", "ScriptStep",
    "EvalSection", "RewardSection", "TrainConfig", "model_sizes", "config_from_mapping", "config_from_yaml_text", "load_config", "parse_placement",
    "placement_from_ranks", "resolve_gpus_per_node", "actor_offloads", "actor_precision", "actor_tp_choices", "critic_tp", "tp_shape_problems",
    "straddling_tp_groups",
]

# The config's vocabularies: every allowed value of a choice key is declared here, once, as a
# ``Literal`` (the schema fields stay ``str``: OmegaConf has no ``Literal``) and checked by
# ``_choice``; other packages import the tuples from here.
Device = Literal["auto", "cpu", "cuda", "emulated"]  # auto: cuda where the rank sees GPUs, else cpu
OnRankFailure = Literal["fail", "checkpoint_and_requeue"]
MinibatchOrder = Literal["arrival", "index"]
Policy = Literal["static", "scripted", "auto", "plan"]  # the scheduling policies (scheduler.policies)
Phase = Literal["start", "rollout", "train", "end"]  # iteration phases (a scripted step's at_phase)
LengthDistribution = Literal["lognormal", "pareto", "fixed"]  # response lengths (scheduler.lengths)
RolloutBackend = Literal["hf", "vllm"]
LrDecayStyle = Literal["cosine", "linear", "constant"]  # the LR schedule's decay (engines.actor.lr_schedule)
Overlong = Literal["drop", "error"]  # what data.max_prompt_length does to a longer prompt
RewardOnError = Literal["raise", "zero"]
RewardName = Literal["gsm8k", "gsm8k_strict", "math", "exact", "auto"]  # built-in rewards (rewards.builtin; auto: by data_source)
Precision = Literal["auto", "fp32", "bf16"]  # the actor's compute precision (auto: bf16 on cuda, else fp32)
Recompute = Literal["none", "selective", "full"]  # the actor's activation recomputation (megatron-core)
OldLogprobs = Literal["actor", "rollout"]  # where the policy's pre-update log-probs come from
RolloutIs = Literal["none", "token", "sequence", "truncated"]  # the rollout/actor mismatch correction (truncated: token)
FilterMetric = Literal["acc", "score", "seq_reward"]  # what DAPO's dynamic sampling compares within a group
Logger = Literal["console", "tensorboard", "wandb", "mlflow", "file"]  # verl's trainer.logger (slurm_rl.trackers)

DEVICES = typing.get_args(Device)
ON_RANK_FAILURE = typing.get_args(OnRankFailure)
MINIBATCH_ORDERS = typing.get_args(MinibatchOrder)
POLICIES = typing.get_args(Policy)
PHASES = typing.get_args(Phase)
LENGTH_DISTRIBUTIONS = typing.get_args(LengthDistribution)
ROLLOUT_BACKENDS = typing.get_args(RolloutBackend)
LR_DECAY_STYLES = typing.get_args(LrDecayStyle)
OVERLONG = typing.get_args(Overlong)
REWARD_ON_ERROR = typing.get_args(RewardOnError)
REWARD_NAMES = typing.get_args(RewardName)
PRECISIONS = typing.get_args(Precision)
RECOMPUTE = typing.get_args(Recompute)
ATTENTION_BACKENDS = ("sdpa", "local")  # actor.attention_backend (slurm_rl.engines.actor.attention, which imports torch)
OLD_LOGPROBS = typing.get_args(OldLogprobs)
ROLLOUT_IS = typing.get_args(RolloutIs)
FILTER_METRICS = typing.get_args(FilterMetric)
LOGGERS = typing.get_args(Logger)

# Scheduler defaults (documented in slurm_rl.scheduler.defaults, which re-exports them)
POLICY = "static"
MAX_RUNNING_REQUESTS = 64
PRE_PROCESS_THRESHOLD = 0.5
PRE_PROCESS_MIN_FINISHED = 0.1
USE_PRE_PROCESS_POLICY = False
USE_WAIT_BEFORE_LAST_ITER_POLICY = False
RANKS_PER_INSTANCE = 1
LIVE_TICK_S = 0.05
SWITCH_LATENCY_S = 0.5
TICK_S = 0.5
SEED = 0
RESPONSE_LEN_DIST = "lognormal"
RESPONSE_LEN_SIGMA = 1.0
PARETO_ALPHA = 1.5
DECODE_FIXED_FRACTION = 1.0
ENGINE_SECTIONS = ("model", "actor", "critic", "rollout", "inference", "algorithm", "data", "reward", "eval")


def shape_problems(hidden_size: int, num_attention_heads: int,
                   num_query_groups: int | None) -> list[tuple[str, Any, str]]:
    """What is wrong with an attention shape, as (key, value, what is allowed): the hidden size
    splits into heads of an even size >= 32 (vLLM CPU kernels; RoPE rotates pairs), and the KV
    groups divide the heads. The one rule for the engines and for ``load_config``."""
    if hidden_size <= 0 or num_attention_heads <= 0:
        return []  # a non-positive size is reported on its own
    problems: list[tuple[str, Any, str]] = []
    head = hidden_size // num_attention_heads
    if hidden_size % num_attention_heads:
        problems.append(("model.hidden_size", hidden_size,
                         f"a multiple of model.num_attention_heads ({num_attention_heads})"))
    elif head < 32 or head % 2:
        problems.append(("model.num_attention_heads", num_attention_heads, (
            f"a count that gives an even head size >= 32 (model.hidden_size {hidden_size} / "
            f"{num_attention_heads} = {head}; vLLM CPU kernels need >= 32, RoPE an even size)")))
    if num_query_groups is not None and (num_query_groups <= 0 or num_attention_heads % num_query_groups):
        problems.append(("model.num_query_groups", num_query_groups,
                         f"a positive divisor of model.num_attention_heads ({num_attention_heads}) or null"))
    return problems


@dataclass
class ClusterConfig:
    """RLinf-compatible ``cluster`` section."""

    num_nodes: int = 1  # nodes in the allocation
    # accelerator slots per node; under Slurm defaults to the allocation
    # (SLURM_GPUS_ON_NODE, else SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE); required locally
    gpus_per_node: Optional[int] = None
    auto_scheduler: bool = False  # RLinf: enable the automatic (online) scheduler
    use_pre_process_policy: bool = USE_PRE_PROCESS_POLICY  # RLinf: let idle actor GPUs pre-process rollouts
    use_wait_before_last_iter_policy: bool = USE_WAIT_BEFORE_LAST_ITER_POLICY  # RLinf: hold placement in the last iteration
    component_placement: Dict[str, Any] = MISSING  # RLinf placement forms; see configs/examples
    # node groups: {label: {nodes: "1" | "0-1,3" (node indices), gpus_per_node: N (default: gpus_per_node)}};
    # {node_group: label, placement: "0"} numbers the accelerators of the group's nodes from 0
    node_groups: Dict[str, Any] = field(default_factory=dict)


@dataclass
class RuntimeConfig:
    """How the run executes: backend device, run directory, timeouts."""

    # auto: cuda where the rank sees GPUs, else cpu | cpu | cuda | emulated (the cost model: only when named)
    device: str = "auto"
    run_dir: str = "runs/${now:%Y%m%d-%H%M%S}"  # RUN_DIR on shared storage
    poll_interval_s: float = 0.01  # epoch poll period of idle/working ranks
    heartbeat_interval_s: float = 1.0  # how often each rank rewrites its heartbeat
    heartbeat_timeout_s: float = 30.0  # a rank whose heartbeat is older is dead
    ack_timeout_s: float = 60.0  # coordinator waits this long for all acks of an epoch
    wait_timeout_s: float = 600.0  # any other wait (batch manifests, collectives, weight sync)
    # the whole run: at its end the run stops at its next gate with a checkpoint (slurm_rl.job_limits);
    # null: the Slurm allocation's end less checkpoint_margin_s, outside a job 4 h
    run_timeout_s: Optional[float] = None
    checkpoint_margin_s: float = 120.0  # with run_timeout_s null: time kept before the allocation's end
    # cuda: one GPU's memory for validate's check that the phases of ranks serving several components fit;
    # null: the GPU visible to validate, else unchecked
    gpu_memory_gb: Optional[float] = None
    seed: int = 1234  # global seed
    keep_iterations: int = 2  # data-plane GC keeps the last K iterations
    checkpoint_every: int = 0  # take a run checkpoint at every N-th iteration gate (0: only on a stop request)
    keep_checkpoints: int = 2  # run checkpoints kept (the newest K)
    on_rank_failure: str = "fail"  # fail | checkpoint_and_requeue (sbatch: requeue, resume from the last checkpoint)
    coordinator_restarts: int = 3  # rank 0 restarts a coordinator killed mid-run this many times
    # verl's trainer.logger: where the coordinator writes each iteration's metrics while the run trains (verl's
    # names beside ours): console (a line per iteration in the coordinator's log) | tensorboard | wandb | mlflow |
    # file, each under RUN_DIR/tracking/ (slurm_rl.trackers)
    logger: List[str] = field(default_factory=lambda: ["console"])
    project_name: str = "slurm_rl"  # verl's trainer.project_name: the wandb project, the mlflow experiment
    experiment_name: Optional[str] = None  # verl's trainer.experiment_name: the tracker's run name; null: RUN_DIR's name
    # emulated: the files the config names (model.path, model.tokenizer_path, data files) must exist; false: unchecked
    check_files: bool = True


@dataclass
class TrainConfig:
    """Batch sizes and iteration count; independent of the placement."""

    num_iterations: int = 4  # RL iterations (rollout -> inference -> actor update)
    rollout_batch_size: int = 16  # prompts per iteration
    group_size: int = 4  # responses per prompt (GRPO group)
    global_batch_size: int = 32  # samples per optimizer step (mini-batch); fixed whatever the placement
    micro_batch_size: int = 4  # samples per forward/backward
    # a micro-batch's token budget (verl's ppo_max_token_len_per_gpu with use_dynamic_bsz, RLinf's max_tokens_per_mbs):
    # packed, a first-fit-decreasing bin of at most this many tokens; padded, rows x longest row <= it; null:
    # micro_batch_size samples
    max_tokens_per_microbatch: Optional[int] = None
    # verl's actor_rollout_ref.model.use_remove_padding: a micro-batch's samples are concatenated into one row
    # without padding (positions restart per sample, attention stays inside each sample)
    use_remove_padding: bool = False
    # verl's trainer.balance_batch: a step's samples are dealt to its DP ranks so that their token loads match.
    # Off by default here (verl: on): the contiguous split keeps a run's micro-batches the same at every DP size,
    # so runs that change DP size (auto, plan, a resume elsewhere) stay within the tightest float noise
    balance_batch: bool = False
    # Which samples form mini-batch i: "arrival" streams whole groups as they complete (fastest);
    # "index" takes the groups of prompts [i*n, (i+1)*n) whatever the timing, so a run is
    # reproducible and identical under any placement schedule (invariant 5, tested).
    minibatch_order: str = "arrival"
    # verl's trainer.critic_warmup: the actor updates from iteration critic_warmup - 1 on (verl's 1-based global
    # step critic_warmup); the iterations before train the critic only (0 and 1: no warmup)
    critic_warmup: int = 0


@dataclass
class ScriptStep:
    """One placement change of the ``scripted`` policy."""

    at_iteration: int = MISSING  # iteration at which the change happens
    placement: Dict[str, Any] = MISSING  # RLinf component_placement mapping
    reason: str = "scripted"  # recorded in the epoch file
    at_phase: str = "start"  # start: the step applies at the gate of its iteration
    at_rollout_fraction: float = 0.0  # with at_phase rollout: once this fraction of samples is finished
    actor_tp: Optional[int] = None  # the actor's tensor-parallel size from this step on (one of actor.tensor_parallel_choices); null: keep it


@dataclass
class SchedulerConfig:
    """Which policy decides placement epochs, and its knobs (defaults from :mod:`slurm_rl.scheduler.defaults`)."""

    # null: auto when cluster.auto_scheduler (RLinf's switch for dynamic scheduling) is true, else static;
    # auto | plan need auto_scheduler: true, static needs it false; scripted runs a fixed script either way
    policy: Optional[str] = None
    script: List[ScriptStep] = field(default_factory=list)  # steps of the scripted policy
    max_running_requests: int = MAX_RUNNING_REQUESTS  # per rollout instance (used by auto)
    # pre-process ends when outstanding requests fall to this fraction
    pre_process_threshold: float = PRE_PROCESS_THRESHOLD
    # GPUs per rollout instance / per actor model replica, used by auto; the actor's follows
    # actor.tensor_parallel (left at 1 it resolves to it; another value must equal it)
    rollout_ranks_per_instance: int = RANKS_PER_INSTANCE
    actor_ranks_per_instance: int = RANKS_PER_INSTANCE
    switch_latency_s: float = SWITCH_LATENCY_S  # simulator: publish-to-applied latency of one epoch
    tick_s: float = TICK_S  # simulator: simulated seconds between policy calls when idle
    seed: int = SEED  # simulator: seed of the response-length sampler
    iteration_overhead_s: float = 0.0  # simulator: idle seconds at each iteration start (fitted by calibrate)
    # plan: may run an iteration collocated (every component on every rank, time-sliced) where its measured
    # iterations say that is faster, the first one from epoch 0; null: so where every component fits one GPU (on
    # cuda, memory_fit's lower bound; elsewhere always), true: so (refused where they cannot fit on cuda, where
    # the actor on every rank cannot split the batch, and under another policy), false: every iteration disaggregated
    time_slicing: Optional[bool] = None


@dataclass
class EmulatedConfig:
    """Calibrated cost model: seconds = fixed + per_unit * units / gpus**scaling."""

    rollout_s_per_token: float = 2.0e-5  # per generated token on one GPU
    inference_s_per_token: float = 2.0e-6  # per scored token on one GPU
    actor_s_per_token: float = 6.0e-6  # per trained token on one GPU
    response_len_mean: int = 256  # mean generated tokens per response
    response_len_max: int = 1024  # cap on generated tokens per response
    response_len_dist: str = RESPONSE_LEN_DIST  # lognormal | pareto | fixed
    response_len_sigma: float = RESPONSE_LEN_SIGMA  # lognormal shape (median = mean * exp(-sigma**2 / 2))
    response_len_alpha: float = PARETO_ALPHA  # pareto shape, > 1
    prompt_len: int = 128  # tokens per prompt
    scaling: float = 0.9  # throughput grows as gpus**scaling
    reshard_s_per_gb: float = 0.5  # seconds per GB moved on reshard
    model_params: int = 1_000_000_000  # parameters, for bytes moved on reshard
    decode_fixed_fraction: float = DECODE_FIXED_FRACTION  # part of a decode step that does not shrink with the batch
    # seconds per GB a collocated actor rank takes to park its state in host memory, or to bring it back
    # (actor.offload_*): about 20 GB/s of pinned host copies; not measured on a GPU yet
    offload_s_per_gb: float = 0.05


@dataclass
class MuxMemberConfig:
    """Membership in a co-execution group (written by ``slurm-rl mux``; empty for a solo run)."""

    group_dir: Optional[str] = None  # the group's directory (control/grants, group.yaml)
    job: Optional[str] = None  # this job's name in the group file
    park_s: float = 0.0  # emulated: seconds a warm switch (park or resume) of one rank takes


@dataclass
class ModelSection:
    """The model: a Hugging Face checkpoint (``path``), or a random Llama-style GPT of the sizes
    below (``engines.model_config.ModelConfig``; a size left null takes :data:`MODEL_DEFAULTS`)."""

    # Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files): Llama, Qwen2/2.5
    # or Qwen3 dense; the architecture and sizes come from its config.json (the size keys below are refused)
    path: Optional[str] = None
    tokenizer_path: Optional[str] = None  # null: model.path's tokenizer, or the built-in character tokenizer
    vocab_size: Optional[int] = None  # null: the tokenizer's vocabulary
    hidden_size: Optional[int] = None  # null: 128
    num_layers: Optional[int] = None  # null: 2
    num_attention_heads: Optional[int] = None  # null: 4; head size hidden_size / heads: even and >= 32
    num_query_groups: Optional[int] = None  # KV heads (GQA); null: one per query head
    ffn_hidden_size: Optional[int] = None  # null: 8/3 * hidden_size rounded up to a multiple of 64
    max_position_embeddings: Optional[int] = None  # null: 256
    rotary_base: Optional[float] = None  # null: 10000
    norm_epsilon: Optional[float] = None  # null: 1e-5
    tie_word_embeddings: Optional[bool] = None  # null: false


MODEL_DEFAULTS: Dict[str, Any] = {
    "hidden_size": 128, "num_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 256,
    "rotary_base": 10000.0, "norm_epsilon": 1e-5, "tie_word_embeddings": False}
MODEL_SIZE_KEYS = ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "num_query_groups",
                   "ffn_hidden_size", "max_position_embeddings", "rotary_base", "norm_epsilon",
                   "tie_word_embeddings")


def model_sizes(m: ModelSection) -> Dict[str, Any]:
    """The size keys of a random model, nulls replaced by :data:`MODEL_DEFAULTS`."""
    return {k: getattr(m, k) if getattr(m, k) is not None else MODEL_DEFAULTS.get(k) for k in MODEL_SIZE_KEYS}


def split_sizes(m: ModelSection) -> Dict[str, Any]:
    """:func:`model_sizes` with a null ``ffn_hidden_size`` replaced by the engines' default
    (``ModelConfig.ffn_size``): what :func:`tp_shape_problems` checks of a random model."""
    sizes = model_sizes(m)
    hidden = sizes["hidden_size"]
    if sizes["ffn_hidden_size"] is None and isinstance(hidden, int) and hidden > 0:
        sizes["ffn_hidden_size"] = ((8 * hidden // 3) + 63) // 64 * 64
    return sizes


def tp_shape_problems(sizes: Mapping[str, Any], tp: int) -> list[str]:
    """Why a model of ``sizes`` (``vocab_size``, ``num_attention_heads``, ``num_query_groups``,
    ``ffn_hidden_size``, ``hidden_size``) does not split over ``tp`` tensor-parallel ranks: the
    heads, the query groups (null: the heads), the FFN and the vocabulary each divide by ``tp``.
    A size that is null or not positive is not known (or reported on its own) and is skipped."""
    checks = [("num_attention_heads", sizes.get("num_attention_heads")),
              ("num_query_groups", sizes.get("num_query_groups")),  # null: the heads, checked above
              ("ffn_hidden_size", sizes.get("ffn_hidden_size")),
              ("vocab_size", sizes.get("vocab_size"))]
    return [f"model.{key} {value} is not a multiple of tensor-parallel size {tp}"
            for key, value in checks
            if isinstance(value, int) and not isinstance(value, bool) and value > 0 and tp >= 1 and value % tp]


def straddling_tp_groups(ranks: Sequence[int], tp: int, node_of: Callable[[int], int]) -> list[tuple[int, ...]]:
    """The actor's TP groups (chunks of ``tp`` consecutive ranks of the sorted ``ranks``) whose
    ranks lie on more than one node (``node_of(rank)``). The one rule for the config and the
    scheduler."""
    ordered = sorted(ranks)
    groups = [tuple(ordered[i:i + tp]) for i in range(0, len(ordered), max(tp, 1))]
    return [g for g in groups if len({node_of(r) for r in g}) > 1]


@dataclass
class ActorSection:
    """Actor engine: AdamW, the sample-driven LR schedule (``engines.actor.optimizer.OptimConfig``)."""

    lr: float = 1e-3  # peak learning rate
    min_lr: float = 0.0  # learning rate at the end of the decay
    lr_warmup_samples: int = 0  # samples of linear warmup
    lr_decay_samples: Optional[int] = None  # samples of decay after warmup; null: constant
    lr_decay_style: str = "cosine"  # cosine | linear | constant
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_grad: Optional[float] = 1.0  # global gradient-norm clip; null: none
    zero1: bool = False  # shard the optimizer state over the DP ranks
    threads: int = 1  # torch CPU threads per rank
    # a rank that may join the actor holds a warm model skeleton (~16 bytes per parameter) so that
    # joining costs the transfer only; false saves that memory at the cost of a build on join
    warm_joiners: bool = True
    precision: str = "auto"  # auto | fp32 | bf16 (auto: bf16 when runtime.device is cuda, else fp32)
    recompute: str = "none"  # none | selective | full: activation recomputation (memory for compute)
    # the core attention: sdpa (torch's scaled_dot_product_attention: fused kernels, no s x s scores
    # kept; its cuda kernels not run on a GPU yet) | local (megatron-core's unfused DotProductAttention)
    attention_backend: str = "sdpa"
    # megatron-core tensor parallelism: ranks per model replica; each TP group (tensor_parallel
    # consecutive actor ranks) lies inside one node; the actor's DP size is its ranks / tensor_parallel
    tensor_parallel: int = 1
    # the sizes a dynamic policy may switch the actor to when its new rank count does not suit
    # tensor_parallel (the smallest that fits); []: only tensor_parallel
    tensor_parallel_choices: List[int] = field(default_factory=list)
    pipeline_parallel: int = 1  # not supported yet: 1 only
    # passes over an iteration's mini-batches (verl's actor.ppo_epochs): pass e > 1 retrains them in order
    # with the same advantages and old log-probs once the first pass is done; the LR schedule counts each sample once
    ppo_epochs: int = 1
    # RLinf's keys: on a rank that the actor shares with the rollout or inference (collocated), park
    # the actor's state in host memory while that rank decodes and scores; any of them parks all three
    # (weights, gradients and optimizer state move together here)
    offload_weight: bool = False
    offload_grad: bool = False
    offload_optimizer: bool = False


@dataclass
class CriticSection:
    """PPO's critic (``algorithm.adv_estimator: gae``, verl's ``critic`` keys): the actor's architecture
    with a scalar value head, trained on the actor's ranks on the same mini-batches (its own AdamW
    state, the actor's LR schedule shape and optimizer settings)."""

    lr: Optional[float] = None  # peak learning rate (verl: critic.optim.lr); null: actor.lr
    cliprange_value: float = 0.5  # values further than this from the rollout-time ones are clipped in the loss
    loss_agg_mode: Optional[str] = None  # null: algorithm.loss_agg_mode
    # on ranks of its own: the critic's TP size (null: 1); on the actor's ranks it takes the actor's (null)
    tensor_parallel: Optional[int] = None


@dataclass
class RolloutSection:
    """Rollout engine and sampling (the temperature is ``algorithm.temperature``)."""

    backend: str = "hf"  # hf | vllm
    sub_batch: Optional[int] = None  # requests generated together; null: scheduler.max_running_requests
    max_new_tokens: int = 256  # generation budget per response (EOS ends it earlier)
    top_p: float = 1.0  # nucleus sampling mass (1: off)
    top_k: int = 0  # sample among the k most likely tokens (0: off)
    stop: List[str] = field(default_factory=list)  # strings that end a response (besides the tokenizer's EOS)
    # vllm: the share of its GPU's memory the engine takes, weights and KV cache (verl's rollout.gpu_memory_utilization)
    gpu_memory_utilization: float = 0.5
    # vllm engine options under verl's names (docs/rollout.md); null: the default written after each
    # GPUs per engine: consecutive rollout ranks of one GPU each, or one process owning them ("0-3:0-1");
    # null: scheduler.rollout_ranks_per_instance x the slots a rollout process owns (1 x 1)
    tensor_model_parallel_size: Optional[int] = None
    dtype: Optional[str] = None  # bfloat16 | float16 | float32; null: the actor's precision on cuda, float32 on cpu
    enforce_eager: Optional[bool] = None  # null: false on cuda (CUDA graphs), true on cpu
    max_model_len: Optional[int] = None  # null: data.max_prompt_length + max_new_tokens, else the model's context
    enable_chunked_prefill: Optional[bool] = None  # null: vLLM's default
    enable_prefix_caching: bool = True  # reuse the KV cache of a shared prompt (a GRPO group's)
    max_num_seqs: Optional[int] = None  # sequences decoded together per engine; null: vLLM's default
    max_num_batched_tokens: Optional[int] = None  # tokens per engine step; null: vLLM's default
    max_head_offpolicyness: Optional[int] = None  # AReaL's name of algorithm.max_staleness (null: that key's value)
    # asynchronous runs: the next weights land in the rollout while it decodes, at a token boundary (AReaL's
    # interruptible generation; verl's async_training.partial_rollout), and its requests carry over the gates;
    # false: the rollout finishes the iteration it draws before the gate, then takes the weights
    partial_rollout: bool = False


@dataclass
class InferenceSection:
    """Inference (reference-policy scoring) engine; it takes no settings yet."""


@dataclass
class KlCtrlSection:
    """The coefficient of the KL in the reward (verl's ``algorithm.kl_ctrl``)."""

    type: str = "fixed"  # fixed | adaptive (verl's AdaptiveKLController: slurm_rl.rl.kl_ctrl)
    kl_coef: float = 0.001  # beta (adaptive: its first value): score - beta * sum over the response of the kl_penalty estimate
    horizon: int = 10000  # adaptive: samples over which a 20% KL error moves beta by 20%
    target_kl: float = 0.1  # adaptive: the mean KL per response token that beta steers to


@dataclass
class FilterGroupsSection:
    """DAPO's dynamic sampling (verl's ``algorithm.filter_groups``): groups whose responses all have the
    same ``metric`` teach GRPO nothing and are dropped; more prompts (``data.gen_batch_size`` per
    generation batch) are drawn until ``train.rollout_batch_size`` groups are kept (``slurm_rl.rl.filter_groups``)."""

    enable: bool = False
    metric: str = "acc"  # acc / score: the reward function's score (without overlong shaping) | seq_reward: the reward
    max_num_gen_batches: int = 0  # generation batches per iteration before the run fails (0: no limit)


@dataclass
class AlgorithmSection:
    """Advantage estimator and actor loss (verl's names; ``slurm_rl.rl.advantages``, ``slurm_rl.rl.losses``)."""

    # grpo | rloo | reinforce_plus_plus | reinforce_plus_plus_baseline | gae (PPO: trains a critic) | package.module:function
    adv_estimator: str = "grpo"
    norm_adv_by_std_in_grpo: bool = True  # false: r - group mean (Dr. GRPO)
    gamma: float = 1.0  # discount of reinforce_plus_plus's and gae's returns (below 1: per-token advantages)
    clip_eps: float = 0.2  # PPO ratio clip (verl: actor.clip_ratio)
    clip_ratio_low: Optional[float] = None  # lower clip, default clip_eps
    clip_ratio_high: Optional[float] = None  # upper clip, default clip_eps (DAPO clip-higher: above clip_ratio_low)
    clip_ratio_c: float = 3.0  # dual clip of negative advantages (verl's default); > 1
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    kl_coef: float = 0.0  # weight of the KL loss to the reference policy (verl: use_kl_loss + kl_loss_coef)
    kl_loss_type: str = "low_var_kl"  # k1 (kl) | abs | k2 (mse) | k3 (low_var_kl)
    entropy_coeff: float = 0.0  # weight of the entropy bonus (the loss minus entropy_coeff x the policy's entropy)
    use_kl_in_reward: bool = False  # the reward minus kl_ctrl.kl_coef x the response's KL to the reference
    kl_penalty: str = "kl"  # the KL estimate in the reward: k1 (kl) | abs | k2 (mse) | k3 (low_var_kl)
    kl_ctrl: KlCtrlSection = field(default_factory=KlCtrlSection)
    temperature: float = 1.0  # sampling temperature of the rollout
    # the policy's log-probs before the update: actor (the iteration's actor weights, scored on the
    # inference ranks) | rollout (the engine's sampled ones); null: actor where an inference component is placed
    old_logprobs: Optional[str] = None
    # none | token: weight each token's policy loss by min(pi_actor / pi_rollout, rollout_is_cap) | sequence: by
    # min(the product of the response's token ratios, rollout_is_cap) (verl's rollout_correction.rollout_is; truncated = token)
    rollout_is: str = "none"
    rollout_is_cap: float = 2.0  # the truncation of rollout_is (verl's rollout_is_threshold)
    # AReaL's decoupled PPO loss: the ratio clipped against the actor's pre-update (proximal) log-probs, each token's loss
    # weighted by pi_proximal / pi_rollout (the behaviour policy's importance weight); tokens whose weight is above
    # behav_imp_weight_cap (null: none) are left out
    use_decoupled_loss: bool = False
    behav_imp_weight_cap: Optional[float] = None  # > 1 (AReaL's actor.behav_imp_weight_cap)
    # policy versions (iterations) a rollout may run ahead of the actor (AReaL's rollout.max_head_offpolicyness);
    # 0: on-policy. >= 1: the rollout of iteration j + 1 draws with the weights of iteration j while the actor
    # trains j (one version ahead without rollout.partial_rollout: it must end inside iteration j, so further
    # would overlap no more; with it, up to this many ahead, its requests carrying over the gates)
    max_staleness: int = 0
    # what happens to a sample older than max_staleness: wait (the rollout waits for the weights; verl's wait).
    # A sample belongs to the iteration it trains in from its first token, so none can be older (nothing to drop)
    staleness_policy: str = "wait"
    filter_groups: FilterGroupsSection = field(default_factory=FilterGroupsSection)
    lam: float = 1.0  # gae's lambda (bias/variance trade-off of the advantage; 1: Monte Carlo returns less the value)


@dataclass
class DataSection:
    """Prompt datasets (``rl.dataset``): JSONL or Parquet files of prompts and answers."""

    train_files: List[str] = field(default_factory=list)  # .jsonl / .parquet files (required on cpu / cuda)
    val_files: List[str] = field(default_factory=list)  # evaluated every eval.every iterations
    prompt_key: str = "prompt"  # column holding a string or a list of chat messages
    answer_key: str = "answer"  # column handed to the reward; other columns go as ``extra``
    apply_chat_template: Optional[bool] = None  # null: true when the tokenizer has a chat template
    max_prompt_length: Optional[int] = None  # tokens; longer prompts are dropped (or an error, see overlong)
    overlong: str = "drop"  # drop | error
    shuffle: bool = True  # a new order every epoch, drawn from runtime.seed
    gen_batch_size: Optional[int] = None  # prompts per generation batch of algorithm.filter_groups (null: train.rollout_batch_size)


@dataclass
class OverlongBufferSection:
    """DAPO's overlong reward shaping (verl's ``reward_model.overlong_buffer``): a response longer than
    ``rollout.max_new_tokens - len`` tokens loses ``penalty_factor`` x its excess / ``len``."""

    enable: bool = False
    len: int = 0  # tokens of the buffer before rollout.max_new_tokens
    penalty_factor: float = 1.0  # the penalty of a response of rollout.max_new_tokens tokens


@dataclass
class RewardSection:
    """Reward of a response (``rewards``): a built-in one or a user function."""

    name: Optional[str] = None  # gsm8k | gsm8k_strict (verl's) | math | exact | auto (by data_source, as verl)
    fn: Optional[str] = None  # "package.module:function" (prompt, response, answer, extra) -> float
    timeout_s: float = 30.0  # per sample; a reward that runs longer fails the run (or scores 0, see on_error)
    on_error: str = "raise"  # raise | zero (a reward that raises or times out scores 0 and is counted)
    workers: int = 2  # reward worker processes per rollout rank; 0: in the rank's own process (verl's naive manager)
    overlong_buffer: OverlongBufferSection = field(default_factory=OverlongBufferSection)


@dataclass
class EvalSection:
    """Evaluation on ``data.val_files``: before the first iteration and every N iterations."""

    every: int = 0  # 0: no evaluation
    n: int = 1  # samples per prompt
    temperature: float = 0.0  # 0: greedy
    max_prompts: Optional[int] = None  # null: every validation prompt


@dataclass
class RootSchema:
    """Top-level schema: every section is typed; unknown keys are refused."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    emulated: EmulatedConfig = field(default_factory=EmulatedConfig)
    mux: MuxMemberConfig = field(default_factory=MuxMemberConfig)
    model: ModelSection = field(default_factory=ModelSection)
    actor: ActorSection = field(default_factory=ActorSection)
    critic: CriticSection = field(default_factory=CriticSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    inference: InferenceSection = field(default_factory=InferenceSection)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    data: DataSection = field(default_factory=DataSection)
    reward: RewardSection = field(default_factory=RewardSection)
    eval: EvalSection = field(default_factory=EvalSection)


@dataclass(frozen=True)
class Config:
    """Resolved, validated configuration.

    ``raw`` is the resolved read-only DictConfig (``gpus_per_node`` and ``run_dir`` filled in);
    typed sections are dataclasses; ``placement`` is the initial placement and
    ``script_placements[i]`` the placement of ``scheduler.script[i]`` over the same world.
    """

    raw: DictConfig
    cluster: ClusterConfig
    runtime: RuntimeConfig
    train: TrainConfig
    scheduler: SchedulerConfig
    emulated: EmulatedConfig
    mux: MuxMemberConfig
    placement: Placement
    script_placements: tuple[Placement, ...]
    model: ModelSection
    actor: ActorSection
    critic: CriticSection
    rollout: RolloutSection
    inference: InferenceSection
    algorithm: AlgorithmSection
    data: DataSection
    reward: RewardSection
    eval: EvalSection

    @property
    def num_slots(self) -> int:
        """Accelerator slots in the allocation (num_nodes * gpus_per_node)."""
        return self.placement.num_slots

    def to_yaml(self) -> str:
        """The resolved configuration as YAML; loading it again gives an equal Config."""
        return OmegaConf.to_yaml(self.raw)


def actor_precision(cfg: Config) -> str:
    """The actor's resolved precision, ``fp32`` or ``bf16``: ``actor.precision``, where ``auto``
    is bf16 when ``runtime.device`` is cuda and fp32 otherwise."""
    if cfg.actor.precision != "auto":
        return cfg.actor.precision
    return "bf16" if cfg.runtime.device == "cuda" else "fp32"


def actor_offloads(cfg: Config) -> bool:
    """Whether RLinf's ``actor.offload_weight`` / ``offload_grad`` / ``offload_optimizer`` park the actor's
    state between a shared rank's phases (any of the three parks all of it, and the rank's scorers while it
    trains)."""
    a = cfg.actor
    return bool(a.offload_weight or a.offload_grad or a.offload_optimizer)


def critic_tp(cfg: Config) -> int:
    """The critic's TP size: the actor's on the actor's ranks, ``critic.tensor_parallel`` (null: 1) on ranks
    of its own."""
    if not cfg.placement.critic_ranks:
        return int(cfg.actor.tensor_parallel)
    return int(cfg.critic.tensor_parallel or 1)


def actor_tp_choices(cfg: Config) -> tuple[int, ...]:
    """The actor's tensor-parallel sizes a policy may pick, ascending (``actor.tensor_parallel_choices``,
    or only ``actor.tensor_parallel`` when it is empty)."""
    return _tp_choices(cfg.actor)


def _tp_choices(a: ActorSection) -> tuple[int, ...]:
    return tuple(sorted(set(a.tensor_parallel_choices))) or (a.tensor_parallel,)


def _now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _register_resolvers() -> None:
    """Register ``${now:FMT}`` (Hydra's resolver) once per process."""
    if OmegaConf.has_resolver("now"):
        return
    register = getattr(OmegaConf, "register_resolver", None)  # OmegaConf >= 2.4
    if register is None:
        register = OmegaConf.register_new_resolver
    register("now", _now)


# --------------------------------------------------------------------------- merging


def _type_text(tp: Any) -> str:
    """Human text for a schema type, used as the 'allowed' part of an issue."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{_type_text(inner[0])} or null"
    if origin in (list, List):
        if args and dataclasses.is_dataclass(args[0]):
            keys = ", ".join(f.name for f in dataclasses.fields(args[0]))
            return f"a list of mappings with keys {keys}"
        return "a list"
    if origin in (dict, Dict) or tp is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping with keys " + ", ".join(f.name for f in dataclasses.fields(tp))
    return {int: "int", float: "float", bool: "bool", str: "str"}.get(tp, getattr(tp, "__name__", str(tp)))


def _hints(node: DictConfig) -> dict[str, Any] | None:
    """Field types of a structured node, or None for a free-form mapping."""
    obj_type = OmegaConf.get_type(node)
    if obj_type is None or not dataclasses.is_dataclass(obj_type):
        return None
    return typing.get_type_hints(obj_type)


def _keys_text(hints: Mapping[str, Any]) -> str:
    """The 'allowed' text of an unknown key: the keys of its section."""
    return "one of the keys " + ", ".join(hints) if hints else "no keys (this section takes none yet)"


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _plain(value: Any) -> Any:
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=False)
    return value


def _struct_list(dc_type: type, items: Any, key: str, issues: list[ConfigIssue]) -> list[DictConfig] | None:
    """Validate each element of a list of structured items separately, so all errors surface.

    Invalid elements become empty (all-missing) items so that later indices keep their keys.
    """
    if not isinstance(items, (list, tuple, ListConfig)):
        issues.append(ConfigIssue(key, _plain(items), _type_text(List[dc_type])))
        return None
    nodes: list[DictConfig] = []
    for i, item in enumerate(items):
        node = OmegaConf.structured(dc_type)
        if isinstance(item, (Mapping, DictConfig)):
            _merge_into(node, item, f"{key}[{i}]", issues)
        else:
            issues.append(ConfigIssue(f"{key}[{i}]", _plain(item), _type_text(dc_type)))
        nodes.append(node)
    return nodes


def _set(node: DictConfig, key: Any, value: Any, full_key: str, tp: Any, issues: list[ConfigIssue],
         replace: bool) -> None:
    """Assign one value, turning any OmegaConf error into a ConfigIssue."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (list, List) and args and dataclasses.is_dataclass(args[0]):
        nodes = _struct_list(args[0], value, full_key, issues)
        if nodes is None:
            return
        value = nodes
        replace = True
    try:
        if replace:
            OmegaConf.update(node, str(key), value, merge=False)
        else:
            node.merge_with({key: value})
    except OmegaConfBaseException as exc:
        issues.append(ConfigIssue(full_key, _plain(value), _type_text(tp) if tp is not None else str(exc)))


def _merge_into(node: DictConfig, update: Any, prefix: str, issues: list[ConfigIssue]) -> None:
    """Merge ``update`` into ``node`` key by key, collecting issues instead of stopping."""
    hints = _hints(node)
    for key, value in update.items():
        full_key = _join(prefix, key)
        if hints is not None and key not in hints:
            issues.append(ConfigIssue(full_key, _plain(value), _keys_text(hints)))
            continue
        tp = hints.get(key) if hints is not None else None
        # _get_node: the child node itself, without resolving interpolations on access
        child = node._get_node(key) if key in node else None
        if (
            isinstance(child, DictConfig) and isinstance(value, (Mapping, DictConfig))
            and _hints(child) is not None
        ):
            _merge_into(child, value, full_key, issues)
        else:
            _set(node, key, value, full_key, tp, issues, replace=False)


def _parse_override(item: str, issues: list[ConfigIssue]) -> tuple[list[str], Any] | None:
    key, sep, text = item.partition("=")
    if not sep or not key.strip() or not re.fullmatch(r"[\w,\-]+(\.[\w,\-]+)*", key.strip()):
        issues.append(ConfigIssue(f"override {item!r}", item, "key.path=value"))
        return None
    try:
        value = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={text}"]), resolve=False)["v"]
    except (yaml.YAMLError, OmegaConfBaseException):
        value = text
    return key.strip().split("."), value


def _apply_override(root: DictConfig, item: str, issues: list[ConfigIssue]) -> None:
    """Apply one ``a.b.c=value`` override; mappings replace free-form mappings wholesale."""
    parsed = _parse_override(item, issues)
    if parsed is None:
        return
    path, value = parsed
    node: Any = root
    for depth, part in enumerate(path[:-1]):
        full_key = ".".join(path[: depth + 1])
        if isinstance(node, ListConfig):
            if not part.isdigit() or int(part) >= len(node):
                issues.append(ConfigIssue(full_key, part, f"an index below {len(node)}"))
                return
            node = node[int(part)]
            continue
        hints = _hints(node)
        if hints is not None and part not in hints:
            issues.append(ConfigIssue(full_key, value, _keys_text(hints)))
            return
        if part not in node or not isinstance(node._get_node(part), (DictConfig, ListConfig)):
            if hints is not None:
                issues.append(ConfigIssue(full_key, value, _type_text(hints[part])))
                return
            node[part] = {}
        node = node._get_node(part)
    last = path[-1]
    full_key = ".".join(path)
    if isinstance(node, ListConfig):
        issues.append(ConfigIssue(full_key, value, "an override of a whole list item field"))
        return
    hints = _hints(node)
    if hints is not None and last not in hints:
        issues.append(ConfigIssue(full_key, value, _keys_text(hints)))
        return
    tp = hints.get(last) if hints is not None else None
    child = node._get_node(last) if last in node else None
    if isinstance(child, DictConfig) and _hints(child) is not None and isinstance(value, Mapping):
        _merge_into(child, value, full_key, issues)
    else:
        _set(node, last, value, full_key, tp, issues, replace=True)


# --------------------------------------------------------------------------- gpus per node

_TASKS_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _tasks_per_node(text: str) -> list[int] | None:
    """Expand Slurm's ``"4(x2),3"`` into ``[4, 4, 3]``; None if malformed."""
    counts: list[int] = []
    for part in text.split(","):
        m = _TASKS_RE.match(part.strip())
        if m is None:
            return None
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def resolve_gpus_per_node(cfg_value: int | None, env: Mapping[str, str]) -> int:
    """Accelerator slots per node: the explicit value, else the Slurm allocation.

    Reads SLURM_GPUS_ON_NODE, else SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE
    (``"4(x2)"``; every node must have the same count). Raises :class:`ConfigError` naming
    ``cluster.gpus_per_node`` when nothing gives a positive value.
    """
    key = "cluster.gpus_per_node"
    if cfg_value is not None:
        if isinstance(cfg_value, bool) or not isinstance(cfg_value, int) or cfg_value < 1:
            raise ConfigError([ConfigIssue(key, cfg_value, "a positive int")])
        return cfg_value
    for var in ("SLURM_GPUS_ON_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        text = env.get(var)
        if text is None or not text.strip():
            continue
        counts = _tasks_per_node(text)
        if not counts or min(counts) < 1 or len(set(counts)) != 1:
            raise ConfigError([ConfigIssue(key, f"{var}={text!r}", (
                "a positive int, or a Slurm allocation with the same positive count on every node"))])
        return counts[0]
    raise ConfigError([ConfigIssue(key, None, (
        "a positive int; required outside Slurm (under Slurm it defaults to SLURM_GPUS_ON_NODE, "
        "SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE)"))])


# --------------------------------------------------------------------------- validation


def _positive(issues: list[ConfigIssue], section: str, obj: Any, *names: str, allow_zero: bool = False) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is None:
            continue
        if value < 0 or (value == 0 and not allow_zero):
            kind = "int" if isinstance(value, int) else "number"
            issues.append(ConfigIssue(f"{section}.{name}", value,
                                      f"a non-negative {kind}" if allow_zero else f"a positive {kind}"))


DYNAMIC_POLICIES = ("auto", "plan")  # what cluster.auto_scheduler: true turns on (RLinf's dynamic scheduling)


def _resolve_switches(root: RootSchema, env: Mapping[str, str], issues: list[ConfigIssue]) -> None:
    """Resolve ``runtime.device: auto`` (cuda where this process sees GPUs, else cpu) and the
    scheduling policy from RLinf's switch ``cluster.auto_scheduler`` in the typed config (the
    written config.yaml keeps what was given: each rank resolves the device itself)."""
    from slurm_rl.devices import resolve_device

    root.runtime.device = resolve_device(root.runtime.device, env)
    offpolicy, al = root.rollout.max_head_offpolicyness, root.algorithm
    if offpolicy is not None:  # AReaL's key for the same bound
        if al.max_staleness not in (0, offpolicy):
            issues.append(ConfigIssue("rollout.max_head_offpolicyness", offpolicy, (
                f"null, or algorithm.max_staleness's value ({al.max_staleness}): both name the same bound")))
        al.max_staleness = offpolicy
    c, s = root.cluster, root.scheduler
    if s.policy is None:
        s.policy = DYNAMIC_POLICIES[0] if c.auto_scheduler else POLICY
    elif s.policy in DYNAMIC_POLICIES and not c.auto_scheduler:
        issues.append(ConfigIssue("scheduler.policy", s.policy, (
            "static or scripted while cluster.auto_scheduler is false: set cluster.auto_scheduler: true "
            "(RLinf's switch) to schedule dynamically; scheduler.policy then picks auto or plan")))
    elif s.policy == POLICY and c.auto_scheduler:
        issues.append(ConfigIssue("cluster.auto_scheduler", True, (
            "false with scheduler.policy static: auto_scheduler: true turns dynamic scheduling on "
            f"(scheduler.policy {' or '.join(DYNAMIC_POLICIES)}, or left out: auto)")))


def _validate(root: RootSchema, issues: list[ConfigIssue]) -> None:
    """Semantic checks on the typed sections (placement is checked separately)."""
    c, r, t, s, e = root.cluster, root.runtime, root.train, root.scheduler, root.emulated
    _positive(issues, "cluster", c, "num_nodes")
    _choice(issues, "runtime.device", r.device, DEVICES)
    if not r.run_dir.strip():
        issues.append(ConfigIssue("runtime.run_dir", r.run_dir, "a non-empty path"))
    _choice(issues, "runtime.on_rank_failure", r.on_rank_failure, ON_RANK_FAILURE)
    for i, name in enumerate(r.logger):
        _choice(issues, f"runtime.logger[{i}]", name, LOGGERS)
    for key in ("checkpoint_every", "coordinator_restarts"):
        if getattr(r, key) < 0:
            issues.append(ConfigIssue(f"runtime.{key}", getattr(r, key), "an integer >= 0"))
    _positive(issues, "runtime", r, "poll_interval_s", "heartbeat_interval_s", "heartbeat_timeout_s",
              "ack_timeout_s", "wait_timeout_s", "run_timeout_s", "keep_iterations", "keep_checkpoints",
              "gpu_memory_gb", "checkpoint_margin_s")
    if 0 < r.heartbeat_interval_s and r.heartbeat_timeout_s <= r.heartbeat_interval_s:
        issues.append(ConfigIssue("runtime.heartbeat_timeout_s", r.heartbeat_timeout_s,
                                  f"more than runtime.heartbeat_interval_s ({r.heartbeat_interval_s})"))
    _positive(issues, "train", t, "num_iterations", "rollout_batch_size", "group_size",
              "global_batch_size", "micro_batch_size", "max_tokens_per_microbatch")
    if t.global_batch_size > 0 and t.micro_batch_size > 0 and t.global_batch_size % t.micro_batch_size:
        issues.append(ConfigIssue("train.global_batch_size", t.global_batch_size,
                                  f"a multiple of train.micro_batch_size ({t.micro_batch_size})"))
    _choice(issues, "train.minibatch_order", t.minibatch_order, MINIBATCH_ORDERS)
    if t.minibatch_order == "index" and t.group_size > 0 and t.global_batch_size % t.group_size:
        issues.append(ConfigIssue("train.minibatch_order", t.minibatch_order, (
            f"'arrival' unless train.global_batch_size ({t.global_batch_size}) is a multiple of "
            f"train.group_size ({t.group_size}): 'index' cuts whole groups")))
    samples = t.rollout_batch_size * t.group_size
    if t.global_batch_size > 0 and samples > 0 and samples % t.global_batch_size:
        issues.append(ConfigIssue("train.global_batch_size", t.global_batch_size, (
            "a divisor of train.rollout_batch_size * train.group_size "
            f"({t.rollout_batch_size} * {t.group_size} = {samples})")))
    _choice(issues, "scheduler.policy", s.policy, POLICIES)
    if s.time_slicing is True and s.policy != "plan":
        issues.append(ConfigIssue("scheduler.time_slicing", True, (
            f"null or false under scheduler.policy {s.policy!r}: only plan chooses co-location per iteration "
            "(a placement whose ranks serve several components time-slices under static)")))
    m = root.mux
    if (m.group_dir is None) != (m.job is None):
        issues.append(ConfigIssue("mux.job" if m.job is None else "mux.group_dir", None,
                                  "both mux.group_dir and mux.job, or neither (solo run)"))
    if m.group_dir is not None and s.policy != "static":
        issues.append(ConfigIssue("scheduler.policy", s.policy,
                                  "static inside a co-execution group (the group scheduler decides when the job runs)"))
    _positive(issues, "mux", m, "park_s", allow_zero=True)
    _positive(issues, "scheduler", s, "max_running_requests", "rollout_ranks_per_instance",
              "actor_ranks_per_instance", "tick_s")
    _positive(issues, "scheduler", s, "switch_latency_s", "seed", "iteration_overhead_s", allow_zero=True)
    if not 0.0 <= s.pre_process_threshold <= 1.0:
        issues.append(ConfigIssue("scheduler.pre_process_threshold", s.pre_process_threshold,
                                  "a number in [0, 1]"))
    seen: dict[tuple[int, str, float], int] = {}
    for i, step in enumerate(s.script):
        key = f"scheduler.script[{i}]"
        if step.at_iteration is MISSING_VALUE:
            continue
        if not 0 <= step.at_iteration < max(t.num_iterations, 1):
            issues.append(ConfigIssue(f"{key}.at_iteration", step.at_iteration,
                                      f"an iteration in 0-{t.num_iterations - 1} (train.num_iterations)"))
        _choice(issues, f"{key}.at_phase", step.at_phase, PHASES)
        if not 0.0 <= step.at_rollout_fraction < 1.0:
            issues.append(ConfigIssue(f"{key}.at_rollout_fraction", step.at_rollout_fraction, "a number in [0, 1)"))
        elif step.at_rollout_fraction and step.at_phase != "rollout":
            issues.append(ConfigIssue(f"{key}.at_rollout_fraction", step.at_rollout_fraction,
                                      f"0 unless at_phase is rollout (it is {step.at_phase!r})"))
        when = (step.at_iteration, step.at_phase, step.at_rollout_fraction)
        if when in seen:
            issues.append(ConfigIssue(f"{key}.at_iteration", step.at_iteration, (
                f"one step per (at_iteration, at_phase, at_rollout_fraction); scheduler.script[{seen[when]}] "
                f"is also at {when}")))
        seen.setdefault(when, i)
    _positive(issues, "emulated", e, "rollout_s_per_token", "inference_s_per_token",
              "actor_s_per_token", "response_len_mean", "response_len_max", "response_len_sigma")
    # 0 leaves a cost out (prompt tokens; reshard bytes), as the cost models allow
    _positive(issues, "emulated", e, "reshard_s_per_gb", "offload_s_per_gb", "prompt_len", "model_params", allow_zero=True)
    _choice(issues, "emulated.response_len_dist", e.response_len_dist, LENGTH_DISTRIBUTIONS)
    if e.response_len_alpha <= 1.0:
        issues.append(ConfigIssue("emulated.response_len_alpha", e.response_len_alpha, "a number > 1"))
    if not 0.0 < e.decode_fixed_fraction <= 1.0:
        issues.append(ConfigIssue("emulated.decode_fixed_fraction", e.decode_fixed_fraction,
                                  "a number in (0, 1]"))
    if e.response_len_max < e.response_len_mean:
        issues.append(ConfigIssue("emulated.response_len_max", e.response_len_max,
                                  f"at least emulated.response_len_mean ({e.response_len_mean})"))
    if not 0.0 < e.scaling <= 1.0:
        issues.append(ConfigIssue("emulated.scaling", e.scaling, "a number in (0, 1]"))


def _validate_engines(root: RootSchema, issues: list[ConfigIssue]) -> None:
    """Checks of the engine sections (model, actor, rollout, algorithm, data, reward, eval) by the
    user's keys; the files they name are checked by :mod:`slurm_rl.inputs` before a launch."""
    m, a, ro, al = root.model, root.actor, root.rollout, root.algorithm
    real = root.runtime.device in ("cpu", "cuda")
    if m.path is not None:
        for key in MODEL_SIZE_KEYS:
            if getattr(m, key) is not None:
                issues.append(ConfigIssue(f"model.{key}", getattr(m, key), (
                    f"null with model.path: the architecture and sizes come from {m.path}/config.json")))
    else:
        sizes = model_sizes(m)
        _positive(issues, "model", m, "vocab_size", "hidden_size", "num_layers", "num_attention_heads",
                  "num_query_groups", "ffn_hidden_size", "max_position_embeddings", "rotary_base", "norm_epsilon")
        # num_query_groups <= 0 is reported by _positive above
        groups = m.num_query_groups if m.num_query_groups is None or m.num_query_groups > 0 else None
        issues.extend(ConfigIssue(*problem) for problem in shape_problems(
            sizes["hidden_size"], sizes["num_attention_heads"], groups))
    _positive(issues, "actor", a, "lr", "eps", "clip_grad", "threads")
    _positive(issues, "actor", a, "min_lr", "lr_warmup_samples", "weight_decay", allow_zero=True)
    _positive(issues, "actor", a, "lr_decay_samples")
    if 0 < a.lr < a.min_lr:
        issues.append(ConfigIssue("actor.min_lr", a.min_lr, f"a number in [0, actor.lr ({a.lr})]"))
    for key, value, allowed in (("actor.lr_decay_style", a.lr_decay_style, LR_DECAY_STYLES),
                                ("rollout.backend", ro.backend, ROLLOUT_BACKENDS),
                                ("data.overlong", root.data.overlong, OVERLONG),
                                ("reward.on_error", root.reward.on_error, REWARD_ON_ERROR)):
        _choice(issues, key, value, allowed)
    for key in ("beta1", "beta2"):
        if not 0.0 <= getattr(a, key) < 1.0:
            issues.append(ConfigIssue(f"actor.{key}", getattr(a, key), "a number in [0, 1)"))
    _positive(issues, "rollout", ro, "sub_batch", "max_new_tokens")
    _positive(issues, "actor", a, "ppo_epochs")
    _positive(issues, "rollout", ro, "top_k", allow_zero=True)
    if not 0.0 < ro.top_p <= 1.0:
        issues.append(ConfigIssue("rollout.top_p", ro.top_p, "a number in (0, 1]"))
    if not 0.0 < ro.gpu_memory_utilization <= 1.0:
        issues.append(ConfigIssue("rollout.gpu_memory_utilization", ro.gpu_memory_utilization, "a number in (0, 1]"))
    issues.extend(rollout_engine_problems(
        ro, backend_vllm=ro.backend == "vllm", device=root.runtime.device, max_prompt_length=root.data.max_prompt_length,
        sizes=model_sizes(m) if m.path is None and real else None, where="the model section"))
    for i, text in enumerate(ro.stop):
        if not isinstance(text, str) or not text:
            issues.append(ConfigIssue(f"rollout.stop[{i}]", text, "a non-empty string"))
    _positive(issues, "algorithm", al, "temperature")
    _positive(issues, "algorithm", al, "clip_eps", "kl_coef", "entropy_coeff", allow_zero=True)
    _validate_algorithm(al, issues)
    _validate_critic(root, issues)
    _positive(issues, "data", root.data, "max_prompt_length", "gen_batch_size")
    _validate_filter_groups(root, issues)
    _positive(issues, "reward", root.reward, "timeout_s")
    _positive(issues, "reward", root.reward, "workers", allow_zero=True)
    ob = root.reward.overlong_buffer
    if ob.enable and not 0 < ob.len <= ro.max_new_tokens:
        issues.append(ConfigIssue("reward.overlong_buffer.len", ob.len,
                                  f"an int in [1, rollout.max_new_tokens = {ro.max_new_tokens}] while enable is true"))
    _positive(issues, "reward.overlong_buffer", ob, "penalty_factor", allow_zero=True)
    _positive(issues, "eval", root.eval, "every", "temperature", allow_zero=True)
    _positive(issues, "eval", root.eval, "n", "max_prompts")
    if real and not root.data.train_files:
        issues.append(ConfigIssue("data.train_files", [], (
            f"a list of .jsonl or .parquet prompt files (runtime.device {root.runtime.device} trains on them; "
            "tools/make_toy_files.py writes a toy set)")))
    if real and (root.reward.name is None) == (root.reward.fn is None):
        issues.append(ConfigIssue("reward.name", root.reward.name, (
            f"one of {', '.join(REWARD_NAMES)}, or reward.fn 'package.module:function' (exactly one of the two)")))
    if root.reward.name is not None:
        _choice(issues, "reward.name", root.reward.name, REWARD_NAMES)
    if root.eval.every and not root.data.val_files:
        issues.append(ConfigIssue("eval.every", root.eval.every, "0, or data.val_files set (the prompts to evaluate)"))


def _validate_filter_groups(root: RootSchema, issues: list[ConfigIssue]) -> None:
    """DAPO's dynamic sampling: its keys, and what it needs of the batch, the policy and the group."""
    fg, t = root.algorithm.filter_groups, root.train
    _choice(issues, "algorithm.filter_groups.metric", fg.metric, FILTER_METRICS)
    _positive(issues, "algorithm.filter_groups", fg, "max_num_gen_batches", allow_zero=True)
    if not fg.enable:
        return
    if t.group_size > 0 and t.global_batch_size % t.group_size:
        issues.append(ConfigIssue("train.global_batch_size", t.global_batch_size, (
            f"a multiple of train.group_size ({t.group_size}) with algorithm.filter_groups.enable: "
            "mini-batches of whole groups (a group is kept or dropped whole)")))
    if root.scheduler.policy != POLICY:
        issues.append(ConfigIssue("algorithm.filter_groups.enable", True, (
            f"false, or scheduler.policy static (here {root.scheduler.policy}): auto and plan size the rollout for "
            "one generation batch and would release its ranks before the next one is drawn")))
    if root.mux.group_dir is not None:
        issues.append(ConfigIssue("algorithm.filter_groups.enable", True,
                                  "false inside a co-execution group (its rollout turn ends with one generation batch)"))


def _validate_critic(root: RootSchema, issues: list[ConfigIssue]) -> None:
    """The critic's keys and where it is placed (with the actor, at its TP; or on ranks of its own, static)."""
    from slurm_rl.rl.advantages import needs_critic
    from slurm_rl.rl.options import AGG_MODES

    c = root.critic
    _positive(issues, "critic", c, "lr", "cliprange_value")
    _positive(issues, "train", root.train, "critic_warmup", allow_zero=True)
    if root.train.critic_warmup > 1 and not needs_critic(root.algorithm):
        issues.append(ConfigIssue("train.critic_warmup", root.train.critic_warmup, (
            "0 or 1 without a critic (iterations that train only the critic need algorithm.adv_estimator: gae)")))
    if c.loss_agg_mode is not None:
        _choice(issues, "critic.loss_agg_mode", c.loss_agg_mode, AGG_MODES)
    raw = root.cluster.component_placement
    named = [k for k in (raw if isinstance(raw, Mapping) else {}) if "critic" in (n.strip() for n in str(k).split(","))]
    if not needs_critic(root.algorithm):
        if named:
            issues.append(ConfigIssue(f"cluster.component_placement.{named[0]}", "critic", (
                "no critic unless algorithm.adv_estimator is gae (the critic's values feed GAE only)")))
        return
    if isinstance(raw, Mapping) and not named:
        issues.append(ConfigIssue("algorithm.adv_estimator", "gae", (
            "an estimator without a critic (grpo, rloo, reinforce_plus_plus, ...), or a critic in "
            "cluster.component_placement: name it in the actor's entry (RLinf's 'actor,critic: 0-3', "
            "'actor,critic,rollout,inference: all'; it trains on the actor's ranks) or on ranks of its own "
            "('critic: 4-5')")))
    own = [k for k in named if str(k).strip() == "critic"]
    if c.tensor_parallel is not None and not own:
        issues.append(ConfigIssue("critic.tensor_parallel", c.tensor_parallel, (
            "null with the critic on the actor's ranks (it takes actor.tensor_parallel); a TP size of its own "
            "needs ranks of its own ('critic: 4-5')")))
    elif c.tensor_parallel is not None and (isinstance(c.tensor_parallel, bool) or c.tensor_parallel < 1):
        issues.append(ConfigIssue("critic.tensor_parallel", c.tensor_parallel, "a positive int, or null (1)"))
    elif c.tensor_parallel is not None and root.runtime.device in ("cpu", "cuda") and root.model.path is None:
        problems = tp_shape_problems(split_sizes(root.model), c.tensor_parallel)
        if problems:
            issues.append(ConfigIssue("critic.tensor_parallel", c.tensor_parallel, (
                f"a tensor-parallel size that divides the model's attention heads, query groups, FFN and "
                f"vocabulary ({'; '.join(problems)})")))
    if own and root.scheduler.policy != "static":
        issues.append(ConfigIssue("scheduler.policy", root.scheduler.policy, (
            f"static with the critic on ranks of its own (cluster.component_placement.{own[0]}): auto, plan and "
            "scripted move ranks between actor, rollout and inference and never the critic's; name the critic in "
            "the actor's entry ('actor,critic') to have it move with the actor")))
    if own and root.mux.group_dir is not None:
        issues.append(ConfigIssue(f"cluster.component_placement.{own[0]}", "critic", (
            "the critic in the actor's entry inside a co-execution group (a job's pool slots serve actor, "
            "rollout and inference)")))


def _validate_algorithm(al: AlgorithmSection, issues: list[ConfigIssue]) -> None:
    """The estimator (a user's ``module:function`` is imported), clip ratios, aggregation and KL type."""
    from slurm_rl.rl.advantages import estimator_problems
    from slurm_rl.rl.kl_ctrl import KL_CTRL_TYPES
    from slurm_rl.rl.options import AGG_MODES, KL_TYPES

    issues.extend(ConfigIssue(*p) for p in estimator_problems(al))
    _choice(issues, "algorithm.loss_agg_mode", al.loss_agg_mode, AGG_MODES)
    _choice(issues, "algorithm.kl_loss_type", al.kl_loss_type, KL_TYPES)
    _choice(issues, "algorithm.kl_penalty", al.kl_penalty, KL_TYPES)
    _choice(issues, "algorithm.kl_ctrl.type", al.kl_ctrl.type, KL_CTRL_TYPES)
    _positive(issues, "algorithm.kl_ctrl", al.kl_ctrl, "kl_coef", allow_zero=True)
    _positive(issues, "algorithm.kl_ctrl", al.kl_ctrl, "horizon", "target_kl")
    if al.use_kl_in_reward and al.adv_estimator == "reinforce_plus_plus":
        issues.append(ConfigIssue("algorithm.use_kl_in_reward", True, (
            "false with reinforce_plus_plus (a KL per token makes its returns differ per token, and the actor "
            "batch carries one advantage per sample); reinforce_plus_plus_baseline, grpo and rloo sum it per response")))
    if not 0.0 < al.gamma <= 1.0:
        issues.append(ConfigIssue("algorithm.gamma", al.gamma, "a number in (0, 1]"))
    if not 0.0 <= al.lam <= 1.0:
        issues.append(ConfigIssue("algorithm.lam", al.lam, "a number in [0, 1]"))
    for key in ("clip_ratio_low", "clip_ratio_high"):
        value = getattr(al, key)
        if value is not None and not 0.0 <= value < (1.0 if key == "clip_ratio_low" else math.inf):
            allowed = "null (clip_eps) or a number in [0, 1)" if key == "clip_ratio_low" else "null (clip_eps) or a number >= 0"
            issues.append(ConfigIssue(f"algorithm.{key}", value, allowed))
    if not al.clip_ratio_c > 1.0:
        issues.append(ConfigIssue("algorithm.clip_ratio_c", al.clip_ratio_c, "a number > 1 (the dual clip of negative advantages)"))
    if al.old_logprobs is not None:
        _choice(issues, "algorithm.old_logprobs", al.old_logprobs, OLD_LOGPROBS)
    _choice(issues, "algorithm.rollout_is", al.rollout_is, ROLLOUT_IS)
    if not al.rollout_is_cap > 0.0:
        issues.append(ConfigIssue("algorithm.rollout_is_cap", al.rollout_is_cap, "a number > 0"))
    if al.max_staleness < 0:
        issues.append(ConfigIssue("algorithm.max_staleness", al.max_staleness, "an integer >= 0 (0: on-policy)"))
    if al.staleness_policy != "wait":
        issues.append(ConfigIssue("algorithm.staleness_policy", al.staleness_policy, (
            "wait: a sample is drawn for the iteration that trains it, at most algorithm.max_staleness policy "
            "versions ahead, so none is ever older than the bound (drop would have nothing to drop)")))
    cap = al.behav_imp_weight_cap
    if cap is not None and not (cap > 1.0 and al.use_decoupled_loss):
        issues.append(ConfigIssue("algorithm.behav_imp_weight_cap", cap, (
            "null, or a number > 1 with algorithm.use_decoupled_loss: true" if al.use_decoupled_loss
            else "null while algorithm.use_decoupled_loss is false (the cap filters the decoupled loss's weights)")))
    if al.use_decoupled_loss and al.rollout_is != "none":
        issues.append(ConfigIssue("algorithm.rollout_is", al.rollout_is, (
            "none with algorithm.use_decoupled_loss: true (both weigh each token by pi_actor / pi_rollout)")))


def _shared_rank_problems(root: RootSchema, placement: Placement) -> list[ConfigIssue]:
    """What the dynamic policies cannot do with ranks that serve several components (time-sliced).

    ``auto`` runs a hybrid placement with its shared ranks pinned (they keep their components while any has
    work; the actor grows into the other ranks as they free up): refused where that leaves it nothing to move
    (the actor holds every rank) and where its pre-process would lend the actor's shared ranks to the rollout.
    ``plan`` refuses shared ranks: it chooses co-location by itself, per iteration, from a disaggregated
    placement. A scripted run follows its steps' placements; static time-slices what it is given."""
    from slurm_rl.rules import compress_ranks

    shared = [r for r in range(placement.world_size) if len(placement.roles_of(r)) > 1]
    policy = root.scheduler.policy
    if not shared or policy not in DYNAMIC_POLICIES:
        return []
    where = dict(root.cluster.component_placement)
    if policy == "plan":
        return [ConfigIssue("cluster.component_placement", where, (
            f"components on separate ranks under scheduler.policy plan (ranks {compress_ranks(shared)} are "
            "shared; plan chooses co-location by itself, per iteration): a disaggregated placement (it time-slices "
            "every rank in the iterations it runs collocated: scheduler.time_slicing), or scheduler.policy auto "
            "or static for this one"))]
    from slurm_rl.rules import actor_holds_every_rank

    actor = set(placement.components["actor"].ranks) if "actor" in placement.components else set()
    issues = []
    if actor_holds_every_rank({name: tuple(comp.ranks) for name, comp in placement.components.items()}):
        issues.append(ConfigIssue("cluster.component_placement", where, (
            f"a placement where scheduler.policy auto can move a rank: it grows the actor into ranks the other "
            f"components free up, and here the actor holds every rank already (ranks {compress_ranks(shared)} "
            "shared): scheduler.policy static (cluster.auto_scheduler: false)")))
    if root.cluster.use_pre_process_policy and actor & set(shared):
        issues.append(ConfigIssue("cluster.use_pre_process_policy", True, (
            f"false where the actor's ranks are shared (ranks {compress_ranks(sorted(actor & set(shared)))}): "
            "pre-process lends the actor's ranks to the rollout until the actor starts, and auto keeps a shared "
            "rank's components in place")))
    return issues


def _async_problems(root: RootSchema, placement: Placement) -> list[ConfigIssue]:
    """What an asynchronous run (``algorithm.max_staleness`` >= 1) needs: the rollout on ranks of its own under the
    static policy or ``plan`` (which chooses the schedule once, at launch: ``scheduler.async_plan``), outside a
    co-execution group, without dynamic sampling."""
    k = root.algorithm.max_staleness
    if k < 1:
        return []
    issues = []
    if root.scheduler.policy not in ("static", "plan"):
        issues.append(ConfigIssue("scheduler.policy", root.scheduler.policy, (
            f"static or plan with algorithm.max_staleness {k}: auto moves ranks inside a synchronous iteration; "
            "plan chooses an async run's placement once, at launch (slurm-rl simulate --compare-modes shows it)")))
    rollout = set(placement.components["rollout"].ranks) if "rollout" in placement.components else set()
    others = {r for name, comp in placement.components.items() if name != "rollout" for r in comp.ranks}
    others |= set(placement.critic_ranks) | set(placement.reward_ranks)
    if rollout & others:
        from slurm_rl.rules import compress_ranks

        issues.append(ConfigIssue("cluster.component_placement", dict(root.cluster.component_placement), (
            f"the rollout on ranks of its own with algorithm.max_staleness {k} (ranks "
            f"{compress_ranks(sorted(rollout & others))} are shared): it decodes the next iterations while the "
            "actor trains, which a rank time-sliced between them cannot")))
    if root.mux.group_dir is not None:
        issues.append(ConfigIssue("algorithm.max_staleness", k, (
            "0 inside a co-execution group: its round-robin hands a job's slots over between on-policy "
            "iterations (RollMux)")))
    if root.algorithm.filter_groups.enable:
        issues.append(ConfigIssue("algorithm.filter_groups.enable", True, (
            f"false with algorithm.max_staleness {k}: dynamic sampling opens generation batches as the actor "
            "sees its groups, which an iteration generated ahead has finished before")))
    if root.rollout.partial_rollout:
        if root.rollout.backend != "hf":
            issues.append(ConfigIssue("rollout.partial_rollout", True, (
                f"false with rollout.backend {root.rollout.backend}: weights land mid-generation in the hf engine "
                "only (its decode loop stops at a token boundary, loads them and recomputes the KV cache)")))
        elif int(root.scheduler.rollout_ranks_per_instance) > 1:
            issues.append(ConfigIssue("rollout.partial_rollout", True, (
                "false with engines over several ranks (scheduler.rollout_ranks_per_instance "
                f"{root.scheduler.rollout_ranks_per_instance}): weights land mid-generation in one-rank engines only")))
    return issues


def _old_logprobs_problems(al: AlgorithmSection, placement: Placement) -> list[ConfigIssue]:
    """What the placement cannot compute of ``algorithm.old_logprobs`` (resolved) and ``rollout_is``."""
    placed = "inference" in placement.components
    issues = []
    if al.old_logprobs == "actor" and not placed:
        issues.append(ConfigIssue("algorithm.old_logprobs", "actor", (
            "rollout, or an inference component in cluster.component_placement (its ranks score the "
            "iteration's actor weights)")))
    if al.rollout_is != "none" and al.old_logprobs == "rollout":
        issues.append(ConfigIssue("algorithm.rollout_is", al.rollout_is, (
            "none while algorithm.old_logprobs is rollout (the correction weighs the actor's log-probs "
            "against the rollout's)")))
    if al.use_decoupled_loss and al.old_logprobs == "rollout":
        issues.append(ConfigIssue("algorithm.use_decoupled_loss", True, (
            "false while algorithm.old_logprobs is rollout (the proximal policy is the actor's, scored on the "
            "inference ranks: with the rollout's log-probs it equals the behaviour policy)")))
    return issues


def _validate_parallel(root: RootSchema, issues: list[ConfigIssue]) -> bool:
    """Checks of the actor's precision, recompute and parallel layout keys, of
    ``scheduler.actor_ranks_per_instance`` against ``actor.tensor_parallel`` and of each scripted
    step's ``actor_tp``; on cpu / cuda also whether a random model's sizes split over every TP
    choice (``model.path``'s sizes are checked by :mod:`slurm_rl.inputs`). Returns True when the
    TP sizes are usable (the placement checks need them)."""
    a, s = root.actor, root.scheduler
    _choice(issues, "actor.precision", a.precision, PRECISIONS)
    _choice(issues, "actor.recompute", a.recompute, RECOMPUTE)
    _choice(issues, "actor.attention_backend", a.attention_backend, ATTENTION_BACKENDS)
    if root.train.use_remove_padding and a.attention_backend == "local":
        issues.append(ConfigIssue("actor.attention_backend", a.attention_backend, (
            "sdpa with train.use_remove_padding: true (megatron-core's local attention has no packed (THD) "
            "form), or train.use_remove_padding: false")))
    if a.pipeline_parallel != 1:
        issues.append(ConfigIssue("actor.pipeline_parallel", a.pipeline_parallel,
                                  "1 (pipeline parallelism is not supported yet; use actor.tensor_parallel)"))
    if a.tensor_parallel < 1:
        issues.append(ConfigIssue("actor.tensor_parallel", a.tensor_parallel, "a positive int"))
        return False
    bad = [(i, v) for i, v in enumerate(a.tensor_parallel_choices) if v < 1]
    for i, v in bad:
        issues.append(ConfigIssue(f"actor.tensor_parallel_choices[{i}]", v, "a positive int"))
    if bad:
        return False
    ok = True
    if a.tensor_parallel_choices and a.tensor_parallel not in a.tensor_parallel_choices:
        issues.append(ConfigIssue("actor.tensor_parallel_choices", list(a.tensor_parallel_choices), (
            f"a list of positive ints that contains actor.tensor_parallel ({a.tensor_parallel}), "
            "or [] (only actor.tensor_parallel)")))
        ok = False
    if s.actor_ranks_per_instance > 0 and s.actor_ranks_per_instance not in (RANKS_PER_INSTANCE, a.tensor_parallel):
        issues.append(ConfigIssue("scheduler.actor_ranks_per_instance", s.actor_ranks_per_instance, (
            f"actor.tensor_parallel ({a.tensor_parallel}), or {RANKS_PER_INSTANCE} (the default, which "
            "follows actor.tensor_parallel): an actor model replica is one TP group")))
    choices = _tp_choices(a)
    for i, step in enumerate(s.script):
        if step.actor_tp is not None and step.actor_tp not in choices:
            issues.append(ConfigIssue(f"scheduler.script[{i}].actor_tp", step.actor_tp, (
                f"one of {', '.join(map(str, choices))} (actor.tensor_parallel_choices, else "
                "actor.tensor_parallel), or null (keep the size in force)")))
    m = root.model
    if root.runtime.device in ("cpu", "cuda") and m.path is None:
        sizes = split_sizes(m)
        for tp in choices:
            problems = tp_shape_problems(sizes, tp)
            if problems:
                key = "actor.tensor_parallel" if tp == a.tensor_parallel else "actor.tensor_parallel_choices"
                issues.append(ConfigIssue(key, tp, (
                    "a tensor-parallel size that divides the model's attention heads, query groups, FFN "
                    f"and vocabulary ({'; '.join(problems)})")))
    return ok


def _placement_entry(mapping: Any, component: str, key: str) -> tuple[str, Any]:
    """The key and the raw value of the placement entry that places ``component``."""
    if isinstance(mapping, Mapping):
        for raw_key, value in mapping.items():
            if component in (n.strip() for n in str(raw_key).split(",")):
                return f"{key}.{component}", value
    return f"{key}.{component}", None


def _tp_layout_problems(key: str, spec: Any, ranks: Sequence[int], tp: int, placement: Placement,
                        what: str = "actor") -> list[ConfigIssue]:
    """The ``what``'s ranks (the actor's, or a critic's of its own) split into whole TP groups of ``tp``,
    each inside one node."""
    if len(ranks) % tp:
        return [ConfigIssue(key, spec, (
            f"a rank count that is a multiple of the {what}'s tensor-parallel size {tp} "
            f"({what}.tensor_parallel): the {what} holds {len(ranks)} ranks"))]
    return [ConfigIssue(key, spec, (
        f"TP groups ({tp} consecutive {what} ranks) inside one node: ranks {list(group)} lie on nodes "
        f"{sorted({placement.node_of_rank(r) for r in group})}"))
        for group in straddling_tp_groups(ranks, tp, placement.node_of_rank)[:1]]


def _tp_placement_problems(root: RootSchema, placement: Placement,
                           scripted: Sequence[Placement]) -> list[ConfigIssue]:
    """The initial actor placement (and each scripted step's, with the TP size in force by then)
    splits into whole TP groups that each lie inside one node."""
    a, steps = root.actor, root.scheduler.script
    out: list[ConfigIssue] = []
    actor = placement.components.get("actor")
    if actor is not None:
        key, spec = _placement_entry(root.cluster.component_placement, "actor", "cluster.component_placement")
        out += _tp_layout_problems(key, spec, actor.ranks, a.tensor_parallel, placement)
        out += _dp_problems(root, key, spec, len(actor.ranks) // a.tensor_parallel, "actor")
    if placement.critic_ranks:
        key, spec = _placement_entry(root.cluster.component_placement, "critic", "cluster.component_placement")
        ctp = root.critic.tensor_parallel or 1
        if ctp >= 1:
            layout = _tp_layout_problems(key, spec, placement.critic_ranks, ctp, placement, "critic")
            out += layout or _dp_problems(root, key, spec, len(placement.critic_ranks) // ctp, "critic")
    if len(scripted) != len(steps) or any(
            st.at_iteration is MISSING_VALUE or st.at_phase not in PHASES for st in steps):
        return out  # reported on their own
    tp = a.tensor_parallel
    order = sorted(range(len(steps)), key=lambda i: (steps[i].at_iteration, PHASES.index(steps[i].at_phase),
                                                      steps[i].at_rollout_fraction))
    for i in order:
        tp = steps[i].actor_tp if steps[i].actor_tp is not None else tp
        actor = scripted[i].components.get("actor")
        if actor is not None:
            key, spec = _placement_entry(steps[i].placement, "actor", f"scheduler.script[{i}].placement")
            out += _tp_layout_problems(key, spec, actor.ranks, tp, scripted[i])
            out += _dp_problems(root, key, spec, len(actor.ranks) // tp, "actor")
    return out


def _dp_problems(root: RootSchema, key: str, spec: Any, dp: int, what: str) -> list[ConfigIssue]:
    """On cpu / cuda, a mini-batch must split over the ``dp`` replicas in whole micro-batches (the rule of
    ``slurm_rl.rules.valid_dp_sizes``); the emulated compute splits nothing."""
    from slurm_rl.rules import valid_dp_sizes

    t = root.train
    if root.runtime.device not in ("cpu", "cuda") or dp < 1 or t.global_batch_size <= 0 or t.micro_batch_size <= 0:
        return []
    if dp in valid_dp_sizes(t.global_batch_size, t.micro_batch_size, dp):
        return []
    allowed = valid_dp_sizes(t.global_batch_size, t.micro_batch_size, max(dp, 1))
    return [ConfigIssue(key, spec, (
        f"ranks that give the {what} a DP size (ranks / TP) over which a mini-batch splits in whole "
        f"micro-batches: DP {dp} does not divide train.global_batch_size {t.global_batch_size} into "
        f"micro-batches of train.micro_batch_size {t.micro_batch_size} (DP sizes {', '.join(map(str, allowed))} do)"))]


def _choice(issues: list[ConfigIssue], key: str, value: Any, allowed: Sequence[str]) -> None:
    """One issue when ``value`` is not one of ``allowed``."""
    if value not in allowed:
        issues.append(ConfigIssue(key, value, "one of " + ", ".join(allowed)))


def _node_layout(
    c: ClusterConfig, gpus: int | None, issues: list[ConfigIssue]
) -> tuple[list[int], dict[str, list[int]]] | None:
    """Slots of each node and the node indices of each ``cluster.node_groups`` label (None if invalid).

    A group's ``gpus_per_node`` applies to its nodes; a group without one keeps what another group
    gives its nodes, else ``cluster.gpus_per_node``."""
    if not isinstance(c.node_groups, Mapping):
        issues.append(ConfigIssue("cluster.node_groups", c.node_groups, "a mapping of label to {nodes, gpus_per_node}"))
        return None
    groups: dict[str, list[int]] = {}
    counts: dict[int, tuple[int, str]] = {}  # node -> (gpus, group that set it)
    ok = True
    nodes_allowed = f"node indices of the allocation in ascending order, e.g. '1' or '0-1,3' (0-{c.num_nodes - 1})"
    for label, spec in c.node_groups.items():
        key = f"cluster.node_groups.{label}"
        if not isinstance(spec, Mapping) or "nodes" not in spec or set(spec) - {"nodes", "gpus_per_node"}:
            issues.append(ConfigIssue(key, spec, "a mapping with keys nodes (required) and gpus_per_node"))
            ok = False
            continue
        nodes: list[int] = []
        for part in str(spec["nodes"]).split(","):
            m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
            lo, hi = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else (1, 0)
            if m is None or lo > hi or (nodes and lo <= nodes[-1]) or hi >= c.num_nodes:
                nodes = []
                break
            nodes.extend(range(lo, hi + 1))
        if not nodes:
            issues.append(ConfigIssue(f"{key}.nodes", spec["nodes"], nodes_allowed))
            ok = False
            continue
        groups[str(label)] = nodes
        count = spec.get("gpus_per_node")
        if count is None:
            continue
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            issues.append(ConfigIssue(f"{key}.gpus_per_node", count, "a positive int"))
            ok = False
            continue
        for n in nodes:
            if n in counts and counts[n][0] != count:
                issues.append(ConfigIssue(f"{key}.gpus_per_node", count, (
                    f"{counts[n][0]}, as node group {counts[n][1]!r} gives node {n}")))
                ok = False
                break
            counts[n] = (count, str(label))
    per_node = [counts[n][0] if n in counts else gpus for n in range(c.num_nodes)]
    if not ok or any(n is None for n in per_node):
        return None
    return [int(n) for n in per_node], groups  # type: ignore[arg-type]


def _groups_cover_all_nodes(c: ClusterConfig) -> bool:
    """True when cluster.node_groups give every node an explicit gpus_per_node."""
    probe: list[ConfigIssue] = []
    layout = _node_layout(c, None, probe) if isinstance(c.num_nodes, int) and c.num_nodes >= 1 else None
    return layout is not None and not probe


def _placements(
    root: RootSchema, gpus: int | None, issues: list[ConfigIssue]
) -> tuple[Placement | None, tuple[Placement, ...]]:
    """Parse the initial placement and every scripted placement over the same world."""
    c = root.cluster
    if c.num_nodes < 1 or c.component_placement is MISSING_VALUE:
        return None, ()
    layout = _node_layout(c, gpus, issues)
    if layout is None:
        return None, ()
    per_node, groups = layout
    num_slots = sum(per_node)
    shape = dict(num_nodes=c.num_nodes, slots_per_node=per_node, node_groups=groups)
    try:
        base = parse_placement(c.component_placement, num_slots, auto_scheduler=c.auto_scheduler, **shape)
    except ConfigError as err:
        issues.extend(err.issues)
        return None, ()
    scripted: list[Placement] = []
    for i, step in enumerate(root.scheduler.script):
        if step.placement is MISSING_VALUE:
            continue
        try:
            scripted.append(parse_placement(step.placement, num_slots,
                                            key=f"scheduler.script[{i}].placement", world=base, **shape))
        except ConfigError as err:
            issues.extend(err.issues)
    return base, tuple(scripted)


# --------------------------------------------------------------------------- loading

_MISSING_TEXT = {  # by last key segment
    "component_placement": "a mapping of components (actor, rollout, inference) to placements (required)",
    "placement": "a mapping of components (actor, rollout, inference) to placements (required)",
    "at_iteration": "an iteration index (required)",
}


def _raw_at(root: DictConfig, key: str) -> Any:
    """Unresolved value at a full key such as ``scheduler.script[0].reason`` (None if absent)."""
    node: Any = OmegaConf.to_container(root, resolve=False)
    for part in re.findall(r"[^.\[\]]+", key):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def _resolve(root: DictConfig, issues: list[ConfigIssue], max_failures: int = 32) -> bool:
    """Resolve interpolations in place; each failing one becomes an issue and is then kept as
    inert text (``$ {``) so the others are still checked. False if resolution could not complete."""
    for _ in range(max_failures):
        try:
            OmegaConf.resolve(root)
            return True
        except OmegaConfBaseException as exc:
            key = getattr(exc, "full_key", None) or ""
            raw = _raw_at(root, key) if key else None
            reason = str(getattr(exc, "msg", exc)).splitlines()[0]
            issues.append(ConfigIssue(key or "<config>", raw, f"a resolvable interpolation ({reason})"))
            if not isinstance(raw, str):
                return False
            try:
                OmegaConf.update(root, key, raw.replace("${", "$ {"), merge=False)
            except OmegaConfBaseException:
                return False
    return False


@functools.lru_cache(maxsize=1)
def _schema_pickle() -> bytes:
    """The schema with its defaults, pickled once per process: unpickling a copy costs a quarter of
    deep-copying one (each load builds on a fresh copy). The bytes never leave the process: nothing read from
    storage is unpickled (DESIGN.md, invariant 7)."""
    return pickle.dumps(OmegaConf.structured(RootSchema))


def _schema() -> DictConfig:
    """A fresh, writable copy of the schema with its defaults."""
    return pickle.loads(_schema_pickle())


def _merge_layer(root: DictConfig, data: Mapping[str, Any], issues: list[ConfigIssue]) -> DictConfig:
    """``data`` merged into ``root``: in one OmegaConf merge when it is valid (the common case; about
    40 % of the key-by-key merge's time), else key by key into ``root`` as it was, collecting every issue."""
    merged = copy.deepcopy(root)
    try:
        merged.merge_with(data)
        return merged
    except OmegaConfBaseException:
        _merge_into(root, data, "", issues)
        return root


def _merge_layers(layers: Sequence[tuple[str, Any]], issues: list[ConfigIssue]) -> DictConfig:
    """The layers merged into a fresh schema in order. While every layer is valid (the common case) each
    is one OmegaConf merge in place; the first invalid one is merged key by key (into the layers before it,
    merged anew, since a failed merge leaves its target half-changed), collecting every issue, and so are
    the layers after it (:func:`_merge_layer`)."""
    root = _schema()
    valid: list[Mapping[str, Any]] | None = []
    for source, data in layers:
        if data is None:
            continue
        if not isinstance(data, Mapping):
            issues.append(ConfigIssue(source, data, "a YAML mapping at the top level"))
            continue
        if valid is not None:
            try:
                root.merge_with(data)
                valid.append(data)
                continue
            except OmegaConfBaseException:
                root = _schema()
                for done in valid:
                    root.merge_with(done)
                valid = None
        root = _merge_layer(root, data, issues)
    return root


def _missing_keys(container: Any, prefix: str = "") -> list[str]:
    """The full keys (``a.b``, ``a.items[0].c``) whose value in a resolved container is missing (``???``), as
    ``OmegaConf.missing_keys`` names them, in order."""
    if isinstance(container, Mapping):
        items = ((f"{prefix}.{k}" if prefix else str(k), v) for k, v in container.items())
    elif isinstance(container, list):
        items = ((f"{prefix}[{i}]", v) for i, v in enumerate(container))
    else:
        return []
    out: list[str] = []
    for key, value in items:
        out += [key] if isinstance(value, str) and value == "???" else _missing_keys(value, key)
    return out


def _build(layers: Sequence[tuple[str, Any]], overrides: Sequence[str], env: Mapping[str, str] | None) -> Config:
    _register_resolvers()
    env = os.environ if env is None else env
    issues: list[ConfigIssue] = []
    root = _merge_layers(layers, issues)
    for item in overrides:
        _apply_override(root, item, issues)
    if not _resolve(root, issues):
        raise ConfigError(_dedupe(issues))
    resolved = OmegaConf.to_container(root, resolve=True)
    for key in sorted(_missing_keys(resolved)):
        last = re.split(r"[.\]]", key)[-1] or key
        issues.append(ConfigIssue(key, MISSING_VALUE, _MISSING_TEXT.get(last, "a value (required)")))
    loading_issues = len(issues)
    typed = _typed(RootSchema, resolved)
    gpus: int | None = None
    try:
        gpus = resolve_gpus_per_node(typed.cluster.gpus_per_node, env)
    except ConfigError as err:
        if not _groups_cover_all_nodes(typed.cluster):
            issues.extend(err.issues)
    _resolve_switches(typed, env, issues)
    _validate(typed, issues)
    _validate_engines(typed, issues)
    parallel_ok = _validate_parallel(typed, issues)
    placement, scripted = _placements(typed, gpus, issues)
    if placement is not None and parallel_ok:
        issues.extend(_tp_placement_problems(typed, placement, scripted))
    if placement is not None:
        key, spec = _placement_entry(typed.cluster.component_placement, "rollout", "cluster.component_placement")
        issues.extend(rollout_placement_problems(typed.rollout, placement, key, spec,
                                                 typed.scheduler.rollout_ranks_per_instance, placement.node_of_rank,
                                                 straddling_tp_groups, typed.runtime.device, typed.scheduler.policy,
                                                 typed.cluster.use_pre_process_policy and typed.scheduler.policy == "auto"))
    if placement is not None:
        if typed.algorithm.old_logprobs is None:  # the actor's where inference ranks can score them
            typed.algorithm.old_logprobs = "actor" if "inference" in placement.components else "rollout"
        issues.extend(_old_logprobs_problems(typed.algorithm, placement))
        issues.extend(_shared_rank_problems(typed, placement))
        issues.extend(_async_problems(typed, placement))
    if issues:
        raise ConfigError(_dedupe(issues, loading_issues))
    assert placement is not None
    if gpus is not None:
        root.cluster.gpus_per_node = gpus
        typed.cluster.gpus_per_node = gpus
    # an actor model replica is one TP group: the default ranks per instance follows actor.tensor_parallel
    # (in the typed config only: the resolved config.yaml keeps what was written, so a run resumed with
    # another actor.tensor_parallel is not refused over a value derived from the old one)
    typed.scheduler.actor_ranks_per_instance = typed.actor.tensor_parallel
    typed.scheduler.rollout_ranks_per_instance = processes_per_engine(  # a rollout instance is one engine's ranks
        typed.rollout, placement, typed.scheduler.rollout_ranks_per_instance)
    OmegaConf.set_readonly(root, True)
    sections = {name: getattr(typed, name) for name in ENGINE_SECTIONS}
    return Config(raw=root, cluster=typed.cluster, runtime=typed.runtime, train=typed.train,
                  scheduler=typed.scheduler, emulated=typed.emulated, mux=typed.mux, placement=placement,
                  script_placements=scripted, **sections)


def _typed(dc_type: Any, data: Mapping[str, Any]) -> Any:
    """Build schema dataclasses from a resolved container; missing values become MISSING_VALUE."""
    hints = typing.get_type_hints(dc_type)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(dc_type):
        value = data.get(f.name, MISSING_VALUE)
        tp = hints[f.name]
        args = typing.get_args(tp)
        if value == "???":
            value = MISSING_VALUE
        elif dataclasses.is_dataclass(tp):
            value = _typed(tp, value)
        elif typing.get_origin(tp) in (list, List) and args and dataclasses.is_dataclass(args[0]):
            value = [_typed(args[0], item) for item in value]
        kwargs[f.name] = value
    return dc_type(**kwargs)


def _dedupe(issues: Sequence[ConfigIssue], first_stage: int | None = None) -> list[ConfigIssue]:
    """Drop repeats and follow-up issues: anything below a key that already has an issue, a
    "missing" for a key whose value was rejected, and (from index ``first_stage`` on) semantic
    issues at keys whose value was already rejected while loading."""
    first_stage = len(issues) if first_stage is None else first_stage
    rejected = {i.key for i in issues[:first_stage]}
    seen: set[str] = set()
    keys: set[str] = set()
    out: list[ConfigIssue] = []
    for n, issue in enumerate(issues):
        text = str(issue)
        parents = [issue.key[:i] for i, ch in enumerate(issue.key) if ch in ".["]
        if text in seen or any(p in keys for p in parents):
            continue
        if (issue.value is MISSING_VALUE or n >= first_stage) and issue.key in (keys if n < first_stage else rejected):
            continue
        seen.add(text)
        keys.add(issue.key)
        out.append(issue)
    return out


@functools.lru_cache(maxsize=1)
def _yaml_loader() -> Any:
    """OmegaConf's own YAML loader (its float forms, duplicate-key and alias checks), built once."""
    try:
        from omegaconf._yaml import get_yaml_loader
    except ImportError:  # older omegaconf
        from omegaconf._utils import get_yaml_loader
    return get_yaml_loader()


def _json_like(value: Any) -> bool:
    """A mapping with string keys, lists and JSON scalars all the way down."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_like(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_json_like(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


def _read_yaml(text: str, source: str) -> Any:
    try:
        if not text.strip():
            return None
        # A plain mapping reads as OmegaConf would give it back (tested): ten times cheaper than
        # building a DictConfig to turn it into a dict again; anything else takes OmegaConf's path.
        doc = yaml.load(text, Loader=_yaml_loader())
        if isinstance(doc, dict) and _json_like(doc):
            return doc
        return OmegaConf.to_container(OmegaConf.create(text), resolve=False)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        raise ConfigError([ConfigIssue(where, getattr(exc, "problem", str(exc)), "valid YAML")]) from None
    except OmegaConfBaseException as exc:
        raise ConfigError([ConfigIssue(source, text[:80], f"a YAML mapping ({exc.msg})")]) from None


def config_from_yaml_text(
    text: str, overrides: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Config:
    """Build a :class:`Config` from YAML text (e.g. the output of :meth:`Config.to_yaml`)."""
    return _build([("<yaml>", _read_yaml(text, "<yaml>"))], overrides, env)


def config_from_mapping(
    data: Mapping[str, Any], overrides: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Config:
    """Build a :class:`Config` from a config document built in code (e.g. a simulator profile),
    validated exactly like a YAML file."""
    return _build([("<mapping>", data)], overrides, env)


#: a small valid document whose load builds what every load builds first (see :func:`warm_caches`)
_WARM_DOC = {"cluster": {"num_nodes": 1, "gpus_per_node": 2, "component_placement": {"actor": "0", "rollout": "1"}},
             "runtime": {"device": "emulated", "run_dir": "runs/warm-${now:%Y%m%d}"},
             "train": {"num_iterations": 1, "rollout_batch_size": 2, "group_size": 2, "global_batch_size": 4}}


def warm_caches() -> None:
    """Load a small config once, so that a server about to fork commands (:mod:`slurm_rl.launch.zygote`) holds
    what each child's first load would build again: the schema with its defaults and the modules validation
    imports (measured: a forked child's first load 0.108 s of CPU cold, 0.03 s warm)."""
    try:
        config_from_mapping(_WARM_DOC, env={})
    except ConfigError:  # the schema changed under the document: the children build it themselves
        pass


class _ReadEnv(Mapping[str, str]):
    """An environment that records the variables read from it (and their values, None where unset)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env, self.read = env, {}

    def __getitem__(self, key: str) -> str:
        self.read[key] = self._env.get(key)
        return self._env[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read[key] = self._env.get(key)
        return key in self._env

    def __iter__(self) -> Any:  # a load that lists the environment depends on all of it
        self.read.update(self._env)
        return iter(self._env)

    def __len__(self) -> int:
        return len(self._env)


@dataclass(frozen=True)
class ReusableConfig:
    """A config file loaded once by a process that forks the processes that load it again (a fork server
    and its ranks): the text it was read from and the environment variables the load read."""

    path: Path
    text: str
    env: Mapping[str, str | None]
    config: Config

    @classmethod
    def load(cls, path: str | Path) -> "ReusableConfig":
        """Load ``path`` (as :func:`load_config` with the process's environment), recording what it read."""
        p = Path(path)
        text = _read_config_file(p)
        env = _ReadEnv(os.environ)
        config = _build([(str(p), _read_yaml(text, str(p)))], (), env)
        return cls(p, text, dict(env.read), config)

    def get(self, path: str | Path, env: Mapping[str, str] | None = None) -> Config:
        """The config of ``path`` in environment ``env`` (default ``os.environ``): this one where the file
        reads the same and every variable the load read has its value (a ``${...}`` other than in strings
        OmegaConf leaves alone may read more: such a file always loads again); else :func:`load_config`."""
        env = os.environ if env is None else env
        try:
            same = (Path(path) == self.path and "${" not in self.text
                    and Path(path).read_text(encoding="utf-8") == self.text
                    and all(env.get(k) == v for k, v in self.env.items()))
        except OSError:
            same = False
        return self.config if same else load_config(path, env=env)


def load_config(
    path: str | Path | None, overrides: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Config:
    """Load YAML at ``path`` (or only the schema defaults when None), apply ``key=value``
    ``overrides``, resolve and validate. ``env`` defaults to ``os.environ`` (Slurm variables).
    Raises :class:`ConfigError` listing every problem.
    """
    layers: list[tuple[str, Any]] = []
    if path is not None:
        layers.append((str(path), _read_yaml(_read_config_file(Path(path)), str(path))))
    return _build(layers, overrides, env)


def _read_config_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([ConfigIssue("config file", str(path), f"a readable YAML file ({exc.strerror})")]) from None
