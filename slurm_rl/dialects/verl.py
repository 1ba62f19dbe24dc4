"""verl's config (``verl/trainer/config/ppo_trainer.yaml``) and its command-line overrides, key by key.

A key not written takes verl's default (:data:`DEFAULTS`, the values of verl's ``ppo_trainer.yaml`` that
change what a run does), so ``slurm-rl run verl KEY=VALUE ...`` is verl's ``python3 -m verl.trainer.main_ppo
KEY=VALUE ...``. verl runs every role on every GPU (its hybrid engine): the translation places actor,
rollout and reference on all ranks (RLinf's ``actor,rollout,inference: all``; the critic too under ``gae``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from slurm_rl.dialects.core import Dialect, Key, Out
from slurm_rl.dialects.rows import dataset_rows

ARR = "actor_rollout_ref"
A = f"{ARR}.actor"
R = f"{ARR}.rollout"
LOGGERS = ("console", "tensorboard", "wandb", "mlflow", "file")

DEFAULTS: dict[str, Any] = {
    "data": {"train_batch_size": 1024, "max_prompt_length": 512, "max_response_length": 512,
             "filter_overlong_prompts": False, "truncation": "error", "prompt_key": "prompt", "shuffle": True},
    ARR: {
        "model": {"use_remove_padding": False, "enable_gradient_checkpointing": True},
        "actor": {"ppo_mini_batch_size": 256, "ppo_micro_batch_size_per_gpu": None, "use_dynamic_bsz": False,
                  "ppo_max_token_len_per_gpu": 16384, "grad_clip": 1.0, "clip_ratio": 0.2, "clip_ratio_c": 3.0,
                  "loss_agg_mode": "token-mean", "entropy_coeff": 0.0, "use_kl_loss": False, "kl_loss_coef": 0.001,
                  "kl_loss_type": "low_var_kl", "ppo_epochs": 1,
                  "optim": {"lr": 1e-6, "weight_decay": 0.01, "lr_warmup_steps": -1}},
        "rollout": {"name": "vllm", "n": 1, "temperature": 1.0, "top_k": -1, "top_p": 1.0,
                    "gpu_memory_utilization": 0.5},
    },
    "algorithm": {"adv_estimator": "gae", "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True,
                  "use_kl_in_reward": False, "kl_penalty": "kl",
                  "kl_ctrl": {"type": "fixed", "kl_coef": 0.001, "horizon": 10000, "target_kl": 0.1}},
    "trainer": {"total_epochs": 30, "total_training_steps": None, "project_name": "verl_examples",
                "experiment_name": "gsm8k", "logger": ["console", "wandb"], "nnodes": 1, "n_gpus_per_node": 8,
                "save_freq": -1, "test_freq": -1, "critic_warmup": 0, "balance_batch": True},
}


def _files(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _freq(value: Any) -> int:
    return int(value) if value is not None and int(value) > 0 else 0


def _one_of(*allowed: Any) -> Any:
    return lambda v: None if v in allowed else "one of " + ", ".join(map(str, allowed))


def _loggers(value: Any) -> str | None:
    names = value if isinstance(value, (list, tuple)) else [value]
    bad = [n for n in names if n not in LOGGERS]
    return None if not bad else f"a list of {', '.join(LOGGERS)} ({', '.join(map(str, bad))}: not written here)"


def _false(v: Any) -> bool:
    return not v


def _null(v: Any) -> bool:
    return v is None


def _loggers_list(v: Any) -> list[str]:
    return [str(x) for x in (v if isinstance(v, (list, tuple)) else [v])]


FSDP = "FSDP's own knob: the actor trains with megatron-core here"
MICRO = "micro-batches of scoring are sized by the engines here (train.micro_batch_size for training)"

TABLE: tuple[Key, ...] = (
    # data
    Key("data.train_files", "prompt files (parquet / jsonl); a string or a list", "data.train_files", _files),
    Key("data.val_files", "validation prompt files", "data.val_files", _files),
    Key("data.train_batch_size", "prompts per step (verl: per training step; here: per iteration)",
        "train.rollout_batch_size", int),
    Key("data.max_prompt_length", "prompt tokens kept", "data.max_prompt_length", int),
    Key("data.max_response_length", "generated tokens per response", "rollout.max_new_tokens", int),
    Key("data.prompt_key", "the prompt column", "data.prompt_key"),
    Key("data.shuffle", "shuffle the prompts every epoch", "data.shuffle", bool),
    Key("data.filter_overlong_prompts", "true: prompts longer than max_prompt_length are dropped",
        "data.overlong", derived=True),
    Key("data.truncation", "error: a prompt longer than max_prompt_length is an error (left/right/middle "
        "truncation is not done here: refused unless filter_overlong_prompts drops them first)", "data.overlong",
        derived=True),
    Key("data.return_raw_chat", "the rollout gets the chat messages", ignored="the prompt column's chat messages "
        "go through the tokenizer's chat template (data.apply_chat_template)"),
    Key("data.seed", "the data order's seed", "runtime.seed", int),
    Key("data.dataloader_num_workers", "data loader worker processes", ignored="prompts are read from memory-mapped "
        "files by the ranks that generate them"),
    Key("data.reward_fn_key", "the column that picks the reward function", ignored="reward.name auto picks the "
        "reward by the data_source column, as verl's default does", benign=lambda v: v in (None, "data_source")),
    # model
    Key(f"{ARR}.model.path", "the Hugging Face checkpoint", "model.path", str),
    Key(f"{ARR}.model.use_remove_padding", "pack a micro-batch's samples without padding",
        "train.use_remove_padding", bool),
    Key(f"{ARR}.model.enable_gradient_checkpointing", "recompute activations in the backward pass",
        "actor.recompute", lambda v: "full" if v else "none"),
    Key(f"{ARR}.model.trust_remote_code", "run a checkpoint's own code", ignored="only the architectures with "
        "a spec here are loaded (Llama, Qwen2/2.5, Qwen3 dense); no checkpoint code runs", benign=_false),
    Key(f"{ARR}.model.use_shm", "copy the model to shared memory first", ignored="the checkpoint is read in place"),
    Key(f"{ARR}.model.external_lib", "import a library that registers a model",
        ignored="only the architectures with a spec here are loaded", benign=_null),
    Key(f"{ARR}.model.lora_rank", "LoRA", refuse=lambda v: None if not v else "0 (LoRA is not done here)",
        ignored="0: full fine-tuning, as here"),
    Key(f"{ARR}.hybrid_engine", "actor and rollout share GPUs", ignored="the placement says who shares a rank "
        "(cluster.component_placement: every component on every rank)", benign=bool),
    # actor
    Key(f"{A}.strategy", "fsdp | fsdp2 | megatron", ignored="the actor trains with megatron-core here"),
    Key(f"{A}.ppo_mini_batch_size", "prompts per optimizer step; verl multiplies it by rollout.n",
        "train.global_batch_size", derived=True),
    Key(f"{A}.ppo_micro_batch_size_per_gpu", "samples per forward/backward on one GPU",
        "train.micro_batch_size", lambda v: int(v), refuse=lambda v: None),
    Key(f"{A}.ppo_micro_batch_size", "samples per forward/backward summed over the GPUs (deprecated in verl)",
        refuse=lambda v: None if v is None else "null: give ppo_micro_batch_size_per_gpu",
        ignored="use ppo_micro_batch_size_per_gpu"),
    Key(f"{A}.use_dynamic_bsz", "micro-batches by a token budget", "train.max_tokens_per_microbatch", derived=True),
    Key(f"{A}.ppo_max_token_len_per_gpu", "the token budget of a micro-batch (with use_dynamic_bsz)",
        "train.max_tokens_per_microbatch", derived=True),
    Key(f"{A}.grad_clip", "global gradient-norm clip", "actor.clip_grad", float),
    Key(f"{A}.clip_ratio", "PPO ratio clip", "algorithm.clip_eps", float),
    Key(f"{A}.clip_ratio_low", "lower ratio clip", "algorithm.clip_ratio_low", float),
    Key(f"{A}.clip_ratio_high", "upper ratio clip (DAPO's clip-higher)", "algorithm.clip_ratio_high", float),
    Key(f"{A}.clip_ratio_c", "dual clip of negative advantages", "algorithm.clip_ratio_c", float),
    Key(f"{A}.loss_agg_mode", "how token losses are aggregated", "algorithm.loss_agg_mode"),
    Key(f"{A}.entropy_coeff", "weight of the entropy bonus", "algorithm.entropy_coeff", float),
    Key(f"{A}.use_kl_loss", "add the KL to the reference as a loss (with kl_loss_coef)", "algorithm.kl_coef",
        derived=True),
    Key(f"{A}.kl_loss_coef", "weight of the KL loss", "algorithm.kl_coef", derived=True),
    Key(f"{A}.kl_loss_type", "the KL estimate of the loss", "algorithm.kl_loss_type"),
    Key(f"{A}.ppo_epochs", "passes over an iteration's mini-batches", "actor.ppo_epochs", int),
    Key(f"{A}.shuffle", "shuffle the samples between PPO epochs", ignored="mini-batches are cut in "
        "train.minibatch_order (arrival or index) and retrained in order", benign=_false),
    Key(f"{A}.optim.lr", "peak learning rate", "actor.lr", float),
    Key(f"{A}.optim.weight_decay", "AdamW weight decay", "actor.weight_decay", float),
    Key(f"{A}.optim.betas", "AdamW betas", "actor.beta1", derived=True),
    Key(f"{A}.optim.lr_warmup_steps", "optimizer steps of linear warmup (-1: lr_warmup_steps_ratio)",
        "actor.lr_warmup_samples", derived=True),
    Key(f"{A}.optim.lr_warmup_steps_ratio", "warmup as a share of the steps", "actor.lr_warmup_samples",
        derived=True),
    Key(f"{A}.optim.min_lr_ratio", "the LR at the end of the decay / lr", "actor.min_lr", derived=True),
    Key(f"{A}.optim.warmup_style", "constant | cosine: the schedule after warmup", "actor.lr_decay_style",
        derived=True),
    Key(f"{A}.optim.lr_scheduler_type", "constant | cosine: the schedule after warmup", "actor.lr_decay_style",
        derived=True),
    Key(f"{A}.optim.total_training_steps", "filled in by verl's trainer", ignored="derived from the steps"),
    Key(f"{A}.fsdp_config.param_offload", "park the actor's weights in host memory between phases",
        "actor.offload_weight", bool),
    Key(f"{A}.fsdp_config.optimizer_offload", "park the optimizer state in host memory between phases",
        "actor.offload_optimizer", bool),
    Key(f"{A}.fsdp_config.*", "FSDP's wrapping and sharding", ignored=FSDP),
    Key(f"{A}.megatron.param_offload", "park the actor's weights in host memory", "actor.offload_weight", bool),
    Key(f"{A}.megatron.grad_offload", "park the gradients in host memory", "actor.offload_grad", bool),
    Key(f"{A}.megatron.optimizer_offload", "park the optimizer state in host memory", "actor.offload_optimizer",
        bool),
    Key(f"{A}.megatron.tensor_model_parallel_size", "the actor's tensor-parallel size", "actor.tensor_parallel",
        int),
    Key(f"{A}.megatron.pipeline_model_parallel_size", "pipeline parallelism", "actor.pipeline_parallel", int),
    Key(f"{A}.megatron.*", "Megatron's runtime knobs", ignored="set by the actor engine here"),
    Key(f"{A}.ulysses_sequence_parallel_size", "sequence parallelism", ignored="not done here",
        benign=lambda v: v in (None, 1)),
    Key(f"{A}.checkpoint.*", "what a checkpoint holds", ignored="a run checkpoint holds the actor's weights and "
        "optimizer state, and the run's data position"),
    # rollout
    Key(f"{R}.name", "the rollout engine", "rollout.backend", lambda v: "hf" if v == "hf" else "vllm",
        refuse=_one_of("vllm", "hf")),
    Key(f"{R}.mode", "sync | async", ignored="the rollout generates in the iteration protocol here; "
        "algorithm.max_staleness is the asynchronous mode (the rollout draws iterations ahead while the actor "
        "trains, on ranks of its own: verl's async_training keys set it)",
        benign=lambda v: v in ("sync", "async")),
    Key(f"{R}.n", "responses per prompt", "train.group_size", int),
    Key(f"{R}.temperature", "sampling temperature", "algorithm.temperature", float),
    Key(f"{R}.top_p", "nucleus sampling mass", "rollout.top_p", float),
    Key(f"{R}.top_k", "sample among the k most likely tokens (-1: off)", "rollout.top_k",
        lambda v: 0 if int(v) < 0 else int(v)),
    Key(f"{R}.gpu_memory_utilization", "vLLM's share of GPU memory", "rollout.gpu_memory_utilization", float),
    Key(f"{R}.tensor_model_parallel_size", "GPUs per vLLM instance",
        ignored="a verl config runs one vLLM instance per rank here, each holding the whole model (an engine over "
        "several ranks is our rollout.tensor_model_parallel_size, static or auto: docs/gpu_jobs.md)",
        benign=lambda v: v in (None, 1)),
    Key(f"{R}.log_prob_micro_batch_size_per_gpu", "micro-batch of old log-prob scoring", ignored=MICRO),
    Key(f"{R}.log_prob_micro_batch_size", "micro-batch of old log-prob scoring", ignored=MICRO),
    Key(f"{R}.max_num_batched_tokens", "vLLM's token budget per step", "rollout.max_num_batched_tokens", int),
    Key(f"{R}.max_num_seqs", "vLLM's sequences per step", "scheduler.max_running_requests", int),
    Key(f"{R}.enforce_eager", "no CUDA graphs", "rollout.enforce_eager", bool),
    Key(f"{R}.free_cache_engine", "release the KV cache between phases", ignored="a shared rank sleeps the "
        "engine between phases (placement-driven)"),
    Key(f"{R}.load_format", "how vLLM loads weights", ignored="weights come from model.path, then weight sync"),
    Key(f"{R}.enable_chunked_prefill", "vLLM's chunked prefill", "rollout.enable_chunked_prefill", bool),
    Key(f"{R}.val_kwargs.*", "sampling of validation", ignored="eval.temperature and eval.n set it"),
    Key(f"{R}.calculate_log_probs", "the rollout's own log-probs", ignored="always kept (algorithm.old_logprobs)"),
    # reference policy
    Key(f"{ARR}.ref.log_prob_micro_batch_size_per_gpu", "micro-batch of reference scoring", ignored=MICRO),
    Key(f"{ARR}.ref.log_prob_micro_batch_size", "micro-batch of reference scoring", ignored=MICRO),
    Key(f"{ARR}.ref.fsdp_config.*", "the reference's FSDP and offload", ignored="the reference is scored on the "
        "inference component's ranks, with no FSDP"),
    Key(f"{ARR}.ref.megatron.*", "the reference's Megatron knobs", ignored="the reference is scored on the "
        "inference component's ranks"),
    # critic (PPO)
    Key("critic.optim.lr", "the critic's peak learning rate", "critic.lr", float),
    Key("critic.cliprange_value", "value clip", "critic.cliprange_value", float),
    Key("critic.model.path", "the critic's checkpoint", refuse=lambda v: None,
        ignored="the critic is the actor's architecture and weights with a value head"),
    Key("critic.*", "the critic's engine knobs", ignored="the critic trains on the actor's ranks with its engine"),
    # algorithm
    Key("algorithm.adv_estimator", "the advantage estimator", "algorithm.adv_estimator"),
    Key("algorithm.gamma", "discount", "algorithm.gamma", float),
    Key("algorithm.lam", "GAE's lambda", "algorithm.lam", float),
    Key("algorithm.norm_adv_by_std_in_grpo", "GRPO divides by the group's std", "algorithm.norm_adv_by_std_in_grpo",
        bool),
    Key("algorithm.use_kl_in_reward", "the reward minus kl_ctrl.kl_coef x KL", "algorithm.use_kl_in_reward", bool),
    Key("algorithm.kl_penalty", "the KL estimate in the reward", "algorithm.kl_penalty"),
    Key("algorithm.kl_ctrl.type", "fixed | adaptive", "algorithm.kl_ctrl.type"),
    Key("algorithm.kl_ctrl.kl_coef", "the reward's KL coefficient", "algorithm.kl_ctrl.kl_coef", float),
    Key("algorithm.kl_ctrl.horizon", "adaptive: samples of the controller", "algorithm.kl_ctrl.horizon", int),
    Key("algorithm.kl_ctrl.target_kl", "adaptive: the target KL", "algorithm.kl_ctrl.target_kl", float),
    Key("algorithm.filter_groups.enable", "DAPO's dynamic sampling", "algorithm.filter_groups.enable", bool),
    Key("algorithm.filter_groups.metric", "what the groups are filtered by", "algorithm.filter_groups.metric"),
    Key("algorithm.filter_groups.max_num_gen_batches", "generation batches before failing",
        "algorithm.filter_groups.max_num_gen_batches", int),
    Key("algorithm.rollout_correction.rollout_is", "importance weights of the rollout/actor mismatch (token | sequence)",
        "algorithm.rollout_is", lambda v: "none" if v in (None, "null") else v,
        refuse=lambda v: None if v in (None, "null", "token", "sequence") else "null, token or sequence"),
    Key("algorithm.rollout_correction.rollout_is_threshold", "the truncation of the weights", "algorithm.rollout_is_cap",
        float),
    Key("algorithm.rollout_correction.*", "verl's rejection sampling and its other corrections",
        ignored="not done here: algorithm.rollout_is truncates the weights (verl's rollout_is), "
        "algorithm.use_decoupled_loss masks them (AReaL's decoupled loss)", benign=lambda v: v in (None, False)),
    # reward
    Key("reward_model.enable", "a reward model", refuse=lambda v: None if not v else "false (reward models are "
        "not served here: reward.name or reward.fn)", ignored="false: rule-based rewards, as here"),
    Key("reward_model.reward_manager", "naive | prime | dapo", ignored="rewards are scored one response at a "
        "time by reward.name / reward.fn", benign=lambda v: v in ("naive", "dapo")),
    Key("reward_model.overlong_buffer.enable", "DAPO's overlong shaping", "reward.overlong_buffer.enable", bool),
    Key("reward_model.overlong_buffer.len", "tokens of the buffer", "reward.overlong_buffer.len", int),
    Key("reward_model.overlong_buffer.penalty_factor", "the penalty", "reward.overlong_buffer.penalty_factor",
        float),
    Key("custom_reward_function.path", "a file with the reward function", refuse=lambda v: None if v is None else (
        "null: reward.fn 'package.module:function' names an importable function here"), ignored="null"),
    Key("custom_reward_function.name", "the function's name in that file", ignored="reward.fn names it",
        benign=lambda v: True),
    # trainer
    Key("trainer.total_epochs", "passes over the training prompts", "train.num_iterations", derived=True),
    Key("trainer.total_training_steps", "steps (overrides total_epochs)", "train.num_iterations", derived=True),
    Key("trainer.project_name", "the tracker's project", "runtime.project_name", str),
    Key("trainer.experiment_name", "the tracker's run name", "runtime.experiment_name", str),
    Key("trainer.logger", "where metrics go live", "runtime.logger", _loggers_list, refuse=_loggers),
    Key("trainer.nnodes", "nodes", "cluster.num_nodes", int),
    Key("trainer.n_gpus_per_node", "GPUs per node", "cluster.gpus_per_node", int),
    Key("trainer.save_freq", "a checkpoint every N steps (-1: none)", "runtime.checkpoint_every", _freq),
    Key("trainer.test_freq", "validation every N steps (-1: none)", "eval.every", _freq),
    Key("trainer.critic_warmup", "steps that train only the critic", "train.critic_warmup", int),
    Key("trainer.balance_batch", "balance the DP ranks' token loads", "train.balance_batch", bool),
    Key("trainer.val_before_train", "validate before the first step", ignored="with eval.every > 0 the run "
        "validates before iteration 0 and every eval.every iterations", benign=bool),
    Key("trainer.default_local_dir", "where checkpoints go", "runtime.run_dir", str),
    Key("trainer.resume_mode", "auto | disable | resume_path", ignored="a run resumes with slurm-rl run --resume "
        "RUN_DIR (sbatch: requeue)", benign=lambda v: v in ("auto", "disable")),
    Key("trainer.device", "cuda | npu", ignored="runtime.device", benign=lambda v: v == "cuda"),
    Key("trainer.log_val_generations", "validation samples logged", ignored="not logged here", benign=_false),
    Key("trainer.ray_wait_register_center_timeout", "Ray's", ignored="no Ray here"),
    Key("ray_init.*", "Ray's start-up", ignored="no Ray here: one Slurm allocation, one process per GPU"),
    Key("ray_kwargs.*", "Ray's start-up", ignored="no Ray here: one Slurm allocation, one process per GPU"),
    # verl's fully async recipe (recipe/fully_async_policy): a Trainer and a Rollouter on GPUs of their own
    Key("async_training.staleness_threshold", "fully async: the share of a weight sync's samples that may be stale "
        "(0: synchronous)", "algorithm.max_staleness", derived=True),
    Key("async_training.partial_rollout", "fully async: requests a weight sync interrupts decode on with the new "
        "weights", "rollout.partial_rollout", bool),
    Key("async_training.trigger_parameter_sync_step", "fully async: the Trainer's updates between weight syncs",
        "train.rollout_batch_size", derived=True),
    Key("async_training.require_batches", "fully async: mini-batches the Trainer takes at once",
        "train.rollout_batch_size", derived=True),
    Key("async_training.use_rollout_log_probs", "fully async: the old log-probs are the rollout's",
        "algorithm.old_logprobs", derived=True),
    Key("async_training.recompute_old_log_prob", "fully async: the Trainer recomputes the old log-probs",
        "algorithm.old_logprobs", derived=True),
    Key("async_training.*", "the recipe's transfer and queue knobs", ignored="samples reach the actor as Arrow "
        "files and weights by a broadcast here"),
    Key("rollout.nnodes", "fully async: the Rollouter's nodes", "cluster.component_placement", derived=True),
    Key("rollout.n_gpus_per_node", "fully async: the Rollouter's GPUs per node", "cluster.component_placement",
        derived=True),
    Key("rollout.total_rollout_steps", "fully async: the prompts the Rollouter draws in all", "train.num_iterations",
        derived=True),
    Key("rollout.total_epochs", "fully async: the Rollouter's passes over the prompts",
        ignored="rollout.total_rollout_steps sets the iterations"),
    Key("rollout.test_freq", "fully async: validation every N weight syncs", "eval.every", derived=True),
    Key("data.gen_batch_size", "fully async: prompts the Rollouter takes at once", ignored="each rollout rank "
        "claims requests as its engine has room", benign=lambda v: True),
    Key("hydra.*", "Hydra's own settings", ignored="no Hydra here"),
    Key("defaults", "Hydra's defaults list", ignored="no Hydra here: verl's defaults are built in"),
)


def derive(v: Mapping[str, Any], given: set[str], out: Out) -> None:
    """What several verl keys set together."""
    n = int(v[f"{R}.n"])
    mini = int(v[f"{A}.ppo_mini_batch_size"])
    out.set("train.global_batch_size", mini * n, f"{A}.ppo_mini_batch_size", mini,
            f"verl's mini-batch counts prompts: x rollout.n {n} = samples per optimizer step")
    if v.get(f"{A}.use_kl_loss"):
        coef = float(v[f"{A}.kl_loss_coef"])
        out.set("algorithm.kl_coef", coef, f"{A}.kl_loss_coef", coef, "use_kl_loss: true")
    else:
        out.set("algorithm.kl_coef", 0.0, f"{A}.use_kl_loss", False, "no KL loss", f"{A}.use_kl_loss" in given)
    dyn = bool(v.get(f"{A}.use_dynamic_bsz"))
    cap = int(v[f"{A}.ppo_max_token_len_per_gpu"]) if dyn else None
    out.set("train.max_tokens_per_microbatch", cap, f"{A}.use_dynamic_bsz", dyn,
            "ppo_max_token_len_per_gpu" if dyn else "fixed micro-batches", f"{A}.use_dynamic_bsz" in given)
    if v.get("data.filter_overlong_prompts"):
        out.set("data.overlong", "drop", "data.filter_overlong_prompts", True, "longer prompts are dropped")
        if "data.truncation" in given:
            out.ignore("data.truncation", v["data.truncation"], "filter_overlong_prompts drops longer prompts first",
                       warn=False)
    elif v.get("data.truncation") == "error":
        out.set("data.overlong", "error", "data.truncation", "error", "a longer prompt is an error",
                "data.truncation" in given)
    else:
        out.refuse("data.truncation", v.get("data.truncation"),
                   "error, or data.filter_overlong_prompts: true (prompts are never truncated here)")
    betas = v.get(f"{A}.optim.betas")
    if betas is not None:
        out.set("actor.beta1", float(betas[0]), f"{A}.optim.betas", betas)
        out.set("actor.beta2", float(betas[1]), f"{A}.optim.betas", betas)
    style = v.get(f"{A}.optim.lr_scheduler_type", v.get(f"{A}.optim.warmup_style"))
    if style is not None:
        key = f"{A}.optim.lr_scheduler_type" if f"{A}.optim.lr_scheduler_type" in v else f"{A}.optim.warmup_style"
        if style not in ("constant", "cosine"):
            out.refuse(key, style, "constant or cosine")
        else:
            out.set("actor.lr_decay_style", style, key, style)
    estimator = v["algorithm.adv_estimator"]
    out.set("reward.name", "auto", "custom_reward_function.path", None, "verl's default: by data_source", False)
    out.set("data.answer_key", "reward_model.ground_truth", "data.reward_fn_key", "data_source",
            "verl's layout: the answer in reward_model.ground_truth", False)
    if any(key.startswith(("async_training.", "rollout.")) for key in given):
        _fully_async(v, given, out, mini, n, estimator == "gae")
        return
    entry = "actor,critic,rollout,inference" if estimator == "gae" else "actor,rollout,inference"
    out.set("cluster.component_placement", {entry: "all"}, f"{ARR}.hybrid_engine", True,
            "verl's hybrid engine: every role on every GPU (the reference on the inference component)", False)
    _steps(v, given, out, mini * n)


def _fully_async(v: Mapping[str, Any], given: set[str], out: Out, mini: int, n: int, critic: bool) -> None:
    """verl's fully async recipe: the Trainer's GPUs (trainer.*) hold the actor and the reference (the inference
    component; the critic too under gae), the Rollouter's (rollout.*) the rollout, side by side on each node when
    both name the same nodes; an iteration is one weight sync (trigger_parameter_sync_step x require_batches
    mini-batches); staleness_threshold (a share of stale samples) becomes a bound on versions."""
    t_nodes, t_gpus = int(v["trainer.nnodes"]), int(v["trainer.n_gpus_per_node"])
    r_nodes, r_gpus = int(v.get("rollout.nnodes", t_nodes)), v.get("rollout.n_gpus_per_node")
    if r_gpus is None:
        out.refuse("rollout.n_gpus_per_node", None, "the Rollouter's GPUs per node (verl's fully async recipe)")
        return
    r_gpus = int(r_gpus)
    if r_nodes == t_nodes:  # the GPUs of each node shared: the Trainer's first, the Rollouter's after them
        nodes, per_node = t_nodes, t_gpus + r_gpus
        trainer = [i * per_node + g for i in range(nodes) for g in range(t_gpus)]
    elif r_gpus == t_gpus:  # nodes of their own
        nodes, per_node = t_nodes + r_nodes, t_gpus
        trainer = list(range(t_nodes * t_gpus))
    else:
        out.refuse("rollout.n_gpus_per_node", r_gpus, f"trainer.n_gpus_per_node ({t_gpus}) where the Rollouter has "
                   f"nodes of its own (rollout.nnodes {r_nodes} != trainer.nnodes {t_nodes}): one GPU count per node")
        return
    from slurm_rl.rules import compress_ranks

    rollout = sorted(set(range(nodes * per_node)) - set(trainer))
    entry = "actor,critic,inference" if critic else "actor,inference"
    why = f"trainer {t_nodes} x {t_gpus} GPUs, Rollouter {r_nodes} x {r_gpus}"
    out.set("cluster.num_nodes", nodes, "rollout.nnodes", r_nodes, why)
    out.set("cluster.gpus_per_node", per_node, "rollout.n_gpus_per_node", r_gpus, why)
    out.set("cluster.component_placement", {entry: compress_ranks(trainer), "rollout": compress_ranks(rollout)},
            "rollout.n_gpus_per_node", r_gpus, "the Trainer's GPUs (the reference on them), the Rollouter's apart")
    a = "async_training."
    threshold = float(v.get(a + "staleness_threshold") or 0.0)
    bound = math.ceil(threshold)
    out.set("algorithm.max_staleness", bound, a + "staleness_threshold", threshold,
            "a bound on each sample's age in versions (verl bounds the share of stale samples of a sync: up to "
            f"{threshold:g} x a sync's samples drawn ahead); ceil" if threshold else "synchronous")
    syncs = int(v.get(a + "trigger_parameter_sync_step") or 1)
    batches = int(v.get(a + "require_batches") or 1)
    prompts = syncs * batches * mini
    out.set("train.rollout_batch_size", prompts, a + "trigger_parameter_sync_step", syncs,
            f"x require_batches {batches} x ppo_mini_batch_size {mini}: the prompts of one weight sync (one iteration "
            "here; its mini-batches stream in as their groups complete)")
    if v.get(a + "recompute_old_log_prob"):
        out.set("algorithm.old_logprobs", "actor", a + "recompute_old_log_prob", True, "scored with the iteration's "
                "actor weights on the inference ranks")
    elif v.get(a + "use_rollout_log_probs", True):
        out.set("algorithm.old_logprobs", "rollout", a + "use_rollout_log_probs", True, "the recipe's default",
                a + "use_rollout_log_probs" in given)
    if "rollout.test_freq" in given:
        out.set("eval.every", _freq(v["rollout.test_freq"]), "rollout.test_freq", v["rollout.test_freq"])
    total = v.get("rollout.total_rollout_steps")
    if total is None:
        out.refuse("rollout.total_rollout_steps", None, f"the prompts to draw in all (a multiple of {prompts}, the "
                   "prompts of one weight sync): it sets the iterations")
        return
    iterations = int(total) // prompts
    if iterations < 1:
        out.refuse("rollout.total_rollout_steps", total, f"at least the prompts of one weight sync ({prompts})")
        return
    out.set("train.num_iterations", iterations, "rollout.total_rollout_steps", total,
            f"// {prompts} prompts per weight sync")
    _steps(v, given, out, mini * n, iterations=iterations)


def _steps(v: Mapping[str, Any], given: set[str], out: Out, samples_per_step: int,
           iterations: int | None = None) -> None:
    """trainer.total_training_steps, else total_epochs x the steps of one epoch (rows // train_batch_size,
    verl's dataloader drops the last partial batch), unless ``iterations`` are given (fully async); warmup and
    min LR follow from the steps."""
    a = A + ".optim."
    total = v.get("trainer.total_training_steps")
    if iterations is not None:
        steps = iterations
    elif total is not None:
        steps = int(total)
        out.set("train.num_iterations", steps, "trainer.total_training_steps", total)
    else:
        epochs = int(v["trainer.total_epochs"])
        rows, problem = dataset_rows(_files(v.get("data.train_files", [])))
        if rows is None:
            out.refuse("trainer.total_epochs", epochs, f"trainer.total_training_steps, or data.train_files that can "
                       f"be read ({problem}): an epoch's steps are its rows // data.train_batch_size")
            return
        per_epoch = rows // int(v["data.train_batch_size"])
        steps = epochs * per_epoch
        if steps < 1:
            out.refuse("data.train_batch_size", v["data.train_batch_size"],
                       f"at most the training rows ({rows}): verl drops the last partial batch of an epoch")
            return
        out.set("train.num_iterations", steps, "trainer.total_epochs", epochs,
                f"{epochs} epochs x ({rows} rows // data.train_batch_size {v['data.train_batch_size']})")
    warm = v.get(a + "lr_warmup_steps")
    ratio = v.get(a + "lr_warmup_steps_ratio")
    if warm is not None and int(warm) >= 0:
        out.set("actor.lr_warmup_samples", int(warm) * samples_per_step, a + "lr_warmup_steps", warm,
                "steps x samples per step")
    elif ratio:
        out.set("actor.lr_warmup_samples", int(float(ratio) * steps) * samples_per_step, a + "lr_warmup_steps_ratio",
                ratio, "share of the steps x samples per step")
    if v.get(a + "min_lr_ratio"):
        lr = float(v[a + "lr"])
        out.set("actor.min_lr", lr * float(v[a + "min_lr_ratio"]), a + "min_lr_ratio", v[a + "min_lr_ratio"],
                "x optim.lr")
        out.set("actor.lr_decay_samples", max(steps * samples_per_step - (out.ours.get("actor", {}).get(
            "lr_warmup_samples") or 0), 1), a + "min_lr_ratio", v[a + "min_lr_ratio"], "decay over the steps")


def _detect(doc: Mapping[str, Any]) -> bool:
    return ARR in doc or "trainer" in doc


VERL = Dialect(name="verl", title="verl", table=TABLE, defaults=DEFAULTS, detect=_detect, derive=derive)
