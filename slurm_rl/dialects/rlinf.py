"""RLinf's reasoning (math) config (``examples/reasoning/config/math/*.yaml``), key by key.

RLinf's ``cluster`` section is ours already (same keys, same placement forms); the rest maps here. RLinf's
interpolations (``${runner.seq_length}``) and resolvers (``subtract``, ``not``, ...) are resolved first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm_rl.dialects.core import Dialect, Key, Out
from slurm_rl.dialects.rows import dataset_rows

ESTIMATORS = {"grpo": "grpo", "reinpp": "reinforce_plus_plus", "reinpp_baseline": "reinforce_plus_plus_baseline",
              "gae": "gae", "ppo": "gae", "rloo": "rloo"}
MEGATRON = "Megatron's runtime knobs: set by the actor engine here"
RAY = "RLinf's worker-group name (Ray); one Slurm allocation here"
FROM_HF = "from model.path's config.json here"
MICRO = "scoring micro-batches are sized by the engines here"


def _files(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def _one_of(*allowed: Any) -> Any:
    return lambda v: None if v in allowed else "one of " + ", ".join(map(str, allowed))


def _false(v: Any) -> bool:
    return not v


def _null(v: Any) -> bool:
    return v is None


def _backends(v: Any) -> list[str]:
    return [str(x) for x in (v if isinstance(v, (list, tuple)) else [v])]


def _backend_refusal(v: Any) -> str | None:
    bad = [x for x in _backends(v) if x not in ("console", "tensorboard", "wandb", "mlflow", "file")]
    return None if not bad else f"a list of console, tensorboard, wandb, mlflow, file ({', '.join(bad)}: not written here)"


def _precision(v: Any) -> str:
    return {"fp32": "fp32", "bf16": "bf16", "fp16": "bf16"}[str(v)]


def _precision_refusal(v: Any) -> str | None:
    return None if str(v) in ("fp32", "bf16", "fp16") else "fp32, bf16 or fp16 (fp16 runs as bf16 here)"


TABLE: tuple[Key, ...] = (
    # cluster: ours already
    Key("cluster.num_nodes", "nodes", "cluster.num_nodes", int),
    Key("cluster.gpus_per_node", "accelerator slots per node (ours; RLinf asks Ray)", "cluster.gpus_per_node"),
    Key("cluster.component_placement", "which GPUs serve which component", "cluster.component_placement",
        leaf=True),
    Key("cluster.auto_scheduler", "RLinf's dynamic scheduling", "cluster.auto_scheduler", bool),
    Key("cluster.use_pre_process_policy", "idle actor GPUs pre-process rollouts", "cluster.use_pre_process_policy",
        bool),
    Key("cluster.use_wait_before_last_iter_policy", "hold the placement in the last iteration",
        "cluster.use_wait_before_last_iter_policy", bool),
    Key("cluster.preprocess_threshold", "pre-process ends at this outstanding fraction",
        "scheduler.pre_process_threshold", float),
    Key("cluster.assign_policy", "how rollout GPUs are handed to the actor",
        ignored="scheduler.policy auto hands whole instances to the actor at mini-batch boundaries",
        benign=lambda v: v in (None, "greedy")),
    Key("cluster.rollout_use_all_gpus", "the rollout may use every GPU", ignored="the placement says it"),
    Key("cluster.monitor_interval", "seconds between scheduler checks", ignored="the coordinator checks every "
        "runtime.poll_interval_s and at every mini-batch boundary"),
    Key("cluster.migrate_out_max_bs", "requests a rollout instance hands over at once",
        ignored="a released rollout rank hands back all its unfinished requests"),
    Key("cluster.recreate_nccl_groups", "rebuild NCCL groups on a switch", ignored="sub-groups are cached by rank "
        "set here", benign=_false),
    Key("cluster.fuse_rollout_inference_only", "fuse rollout and inference", ignored="the placement says which "
        "ranks share components"),
    Key("cluster.node_groups", "node groups", "cluster.node_groups", leaf=True),
    # runner
    Key("runner.task_type", "reasoning | embodied | ...", refuse=_one_of("reasoning", "math"),
        ignored="reasoning: the only task here"),
    Key("runner.logger.logger_backends", "where metrics go live", "runtime.logger", _backends,
        refuse=_backend_refusal),
    Key("runner.logger.project_name", "the tracker's project", "runtime.project_name", str),
    Key("runner.logger.experiment_name", "the tracker's run name", "runtime.experiment_name", str),
    Key("runner.logger.log_path", "where the logs go", ignored="RUN_DIR/logs and the trackers' own directories"),
    Key("runner.max_epochs", "passes over the training prompts", "train.num_iterations", derived=True),
    Key("runner.max_steps", "steps (-1: max_epochs)", "train.num_iterations", derived=True),
    Key("runner.val_check_interval", "validation every N steps", "eval.every", lambda v: max(int(v), 0)),
    Key("runner.save_interval", "a checkpoint every N steps", "runtime.checkpoint_every", lambda v: max(int(v), 0)),
    Key("runner.seq_length", "prompt + response tokens", "rollout.max_new_tokens", derived=True),
    Key("runner.enable_dynamic_batch_size", "micro-batches by a token budget", "train.max_tokens_per_microbatch",
        derived=True),
    Key("runner.max_tokens_per_mbs", "the token budget of a micro-batch", "train.max_tokens_per_microbatch",
        derived=True),
    Key("runner.resume_dir", "resume from a checkpoint dir", refuse=lambda v: None if v is None else (
        "null: a run resumes with slurm-rl run --resume RUN_DIR (sbatch: requeue)"), ignored="null"),
    Key("runner.experiment_name", "the run's name", "runtime.run_dir", derived=True),
    Key("runner.output_dir", "where runs go", "runtime.run_dir", derived=True),
    # algorithm
    Key("algorithm.group_size", "responses per prompt", "train.group_size", int),
    Key("algorithm.n_minibatches", "optimizer steps per iteration", "train.global_batch_size", derived=True),
    Key("algorithm.training_batch_size_per_gpu", "samples per forward/backward", "train.micro_batch_size", int),
    Key("algorithm.rollout_batch_size_per_gpu", "prompts per rollout GPU", ignored="the rollout ranks claim "
        "requests from the iteration's table (scheduler.max_running_requests each)"),
    Key("algorithm.logprob_forward_micro_batch_size", "micro-batch of log-prob scoring", ignored=MICRO),
    Key("algorithm.val_rollout_batch_size_per_gpu", "prompts per GPU in validation", ignored=MICRO),
    Key("algorithm.recompute_logprobs", "recompute the old log-probs with the actor's weights",
        "algorithm.old_logprobs", lambda v: "actor" if v else "rollout"),
    Key("algorithm.shuffle_rollout", "shuffle the rollouts before training", ignored="mini-batches are cut in "
        "train.minibatch_order", benign=_false),
    Key("algorithm.loss_type", "grpo | actor | ppo", ignored="the policy loss is PPO's clipped loss on "
        "algorithm.adv_estimator's advantages", benign=lambda v: v in ("grpo", "actor", "ppo", "actor_critic")),
    Key("algorithm.loss_agg_func", "how token losses are aggregated", "algorithm.loss_agg_mode"),
    Key("algorithm.kl_beta", "weight of the KL loss to the reference", "algorithm.kl_coef", float),
    Key("algorithm.kl_penalty_type", "the KL estimate", "algorithm.kl_loss_type"),
    Key("algorithm.ratio_clip_eps", "PPO ratio clip", "algorithm.clip_eps", float),
    Key("algorithm.entropy_bonus", "weight of the entropy bonus", "algorithm.entropy_coeff", float),
    Key("algorithm.calculate_entropy", "log the entropy", ignored="the entropy is computed where "
        "algorithm.entropy_coeff > 0"),
    Key("algorithm.clip_ratio_c", "dual clip (null: off)", "algorithm.clip_ratio_c", float),
    Key("algorithm.clip_ratio_low", "lower ratio clip (null: ratio_clip_eps)", "algorithm.clip_ratio_low", float),
    Key("algorithm.clip_ratio_high", "upper ratio clip (null: ratio_clip_eps)", "algorithm.clip_ratio_high", float),
    Key("algorithm.adv_type", "the advantage estimator", "algorithm.adv_estimator", lambda v: ESTIMATORS[v],
        refuse=_one_of(*ESTIMATORS)),
    Key("algorithm.normalize_advantages", "whiten the batch's advantages",
        ignored="no batch-wide whitening here: GRPO's advantages are normalised per group "
        "(algorithm.norm_adv_by_std_in_grpo)", benign=_false),
    Key("algorithm.early_stop_imp_ratio", "drop tokens whose importance ratio exceeds it",
        ignored="not done here (the dual clip algorithm.clip_ratio_c bounds negative-advantage ratios)",
        benign=_null),
    Key("algorithm.use_valid_token_scale", "scale the loss by valid tokens", ignored="algorithm.loss_agg_mode "
        "sets the scaling", benign=_false),
    Key("algorithm.max_num_gen_batches", "generation batches per step (dynamic sampling)",
        "algorithm.filter_groups.max_num_gen_batches", lambda v: max(int(v), 0)),
    Key("algorithm.sampling_params.use_greedy", "greedy rollout", refuse=lambda v: None if not v else (
        "false (the rollout samples; eval.temperature 0 is greedy validation)"), ignored="false: sampling"),
    Key("algorithm.sampling_params.temperature", "sampling temperature", "algorithm.temperature", float),
    Key("algorithm.sampling_params.top_k", "sample among the k most likely tokens (>= 1,000,000: off)",
        "rollout.top_k", lambda v: 0 if int(v) <= 0 or int(v) >= 1_000_000 else int(v)),
    Key("algorithm.sampling_params.top_p", "nucleus sampling mass", "rollout.top_p", float),
    Key("algorithm.sampling_params.repetition_penalty", "repetition penalty",
        refuse=lambda v: None if float(v) == 1.0 else "1.0 (no repetition penalty here)", ignored="1.0: none"),
    Key("algorithm.sampling_params.max_new_tokens", "generated tokens per response", "rollout.max_new_tokens", int),
    Key("algorithm.sampling_params.min_new_tokens", "fewest generated tokens", ignored="EOS may end a response "
        "at any length", benign=lambda v: v in (None, 0, 1)),
    # rollout
    Key("rollout.rollout_backend", "sglang | vllm", "rollout.backend", str,
        refuse=lambda v: None if v in ("vllm", "hf") else "vllm or hf (SGLang is not an engine here)"),
    Key("rollout.gpu_memory_utilization", "vLLM's share of GPU memory", "rollout.gpu_memory_utilization", float),
    Key("rollout.model_dir", "the Hugging Face checkpoint", "model.path", str),
    Key("rollout.model_arch", "the architecture", ignored=FROM_HF),
    Key("rollout.precision", "the rollout's precision", ignored="vLLM loads the checkpoint's dtype"),
    Key("rollout.tensor_parallel_size", "GPUs per rollout instance", "scheduler.rollout_ranks_per_instance", derived=True),
    Key("rollout.pipeline_parallel_size", "pipeline stages of the rollout",
        refuse=lambda v: None if int(v) == 1 else "1 (no rollout pipeline parallelism here)", ignored="1"),
    Key("rollout.max_running_requests", "requests a rollout instance runs at once", "scheduler.max_running_requests",
        int),
    Key("rollout.group_name", "Ray worker group", ignored=RAY),
    Key("rollout.return_logprobs", "the engine returns log-probs", ignored="always kept here"),
    Key("rollout.enforce_eager", "no CUDA graphs", ignored="vLLM runs as the rollout engine sets it"),
    Key("rollout.distributed_executor_backend", "vLLM's executor", ignored="one engine per rank here"),
    Key("rollout.disable_log_stats", "vLLM's stats log", ignored="vLLM's default"),
    Key("rollout.detokenize", "detokenize outputs", ignored="the reward detokenizes what it scores"),
    Key("rollout.padding", "pad token", ignored="from the tokenizer"),
    Key("rollout.eos", "EOS token", ignored="from the tokenizer (rollout.stop adds stop strings)"),
    Key("rollout.validate_weight", "check weights after sync", ignored="not done here", benign=_false),
    Key("rollout.validate_save_dir", "where checked weights go", ignored="not done here"),
    Key("rollout.print_outputs", "print generated text", ignored="not done here", benign=_false),
    Key("rollout.cuda_graph_max_bs", "CUDA graph batch cap", ignored="vLLM's default"),
    Key("rollout.sglang.*", "SGLang's knobs", ignored="SGLang is not an engine here"),
    Key("rollout.vllm.*", "vLLM's knobs", ignored="the rollout engine sets vLLM's options"),
    # inference (reference policy scoring)
    Key("inference.*", "the inference component's engine", ignored="the inference ranks score with the actor's "
        "engine and layout here (cluster.component_placement places them)"),
    # data
    Key("data.type", "math | ...", ignored="prompts and answers come from the files; reward.name scores them"),
    Key("data.dataset_name", "the dataset's name", ignored="the files are the dataset"),
    Key("data.max_prompt_length", "prompt tokens kept", "data.max_prompt_length", int),
    Key("data.filter_prompt_by_length", "drop longer prompts", "data.overlong", lambda v: "drop" if v else "error"),
    Key("data.rollout_batch_size", "prompts per step", "train.rollout_batch_size", int),
    Key("data.val_rollout_batch_size", "prompts per validation batch", ignored="eval.max_prompts limits them"),
    Key("data.num_workers", "data loader workers", ignored="prompts are read from memory-mapped files"),
    Key("data.prompt_key", "the prompt column", "data.prompt_key", str),
    Key("data.answer_key", "the answer column", "data.answer_key", str),
    Key("data.apply_chat_template", "wrap prompts in the chat template", "data.apply_chat_template", bool),
    Key("data.shuffle", "shuffle the prompts every epoch", "data.shuffle", bool),
    Key("data.validation_shuffle", "shuffle validation prompts", ignored="validation prompts are read in order"),
    Key("data.seed", "the data order's seed", "runtime.seed", int),
    Key("data.train_data_paths", "prompt files", "data.train_files", _files),
    Key("data.val_data_paths", "validation prompt files", "data.val_files", _files),
    # actor
    Key("actor.group_name", "Ray worker group", ignored=RAY),
    Key("actor.training_backend", "megatron | fsdp", ignored="the actor trains with megatron-core here",
        benign=lambda v: v == "megatron"),
    Key("actor.mcore_gpt", "megatron-core's GPT", ignored="always"),
    Key("actor.spec_name", "megatron-core layer spec", ignored="one spec per architecture here"),
    Key("actor.checkpoint_load_path", "a Megatron checkpoint to start from", refuse=lambda v: None if v is None else
        "null: the actor loads model.path (Hugging Face) on every rank", ignored="null"),
    Key("actor.offload_optimizer", "park the optimizer state between phases", "actor.offload_optimizer", bool),
    Key("actor.offload_weight", "park the weights between phases", "actor.offload_weight", bool),
    Key("actor.offload_grad", "park the gradients between phases", "actor.offload_grad", bool),
    Key("actor.enable_dp_load_balance", "balance the DP ranks' token loads", "train.balance_batch", bool),
    Key("actor.calculate_flops", "count FLOPs", ignored="perf/mfu/actor is logged where the peak FLOPs are known"),
    Key("actor.seed", "the actor's seed", "runtime.seed", int),
    Key("actor.model.precision", "fp16 | bf16 | fp32", "actor.precision", _precision, refuse=_precision_refusal),
    Key("actor.model.tensor_model_parallel_size", "the actor's tensor-parallel size", "actor.tensor_parallel", int),
    Key("actor.model.pipeline_model_parallel_size", "pipeline stages", "actor.pipeline_parallel", int),
    Key("actor.model.sequence_parallel", "Megatron's sequence parallelism", ignored="not used here"),
    Key("actor.model.recompute_granularity", "full | selective", "actor.recompute",
        lambda v: "none" if v is None else str(v)),
    Key("actor.model.recompute_method", "block | uniform", ignored="megatron-core's default with actor.recompute"),
    Key("actor.model.recompute_num_layers", "layers recomputed", ignored="every layer with actor.recompute full"),
    Key("actor.model.seq_length", "sequence length", ignored="from the data and rollout.max_new_tokens"),
    Key("actor.model.encoder_seq_length", "sequence length", ignored="from the data and rollout.max_new_tokens"),
    Key("actor.model.add_bias_linear", "linear biases", ignored=FROM_HF),
    Key("actor.model.activation", "activation", ignored=FROM_HF),
    Key("actor.model.normalization", "normalization", ignored=FROM_HF),
    Key("actor.model.position_embedding_type", "position embedding", ignored=FROM_HF),
    Key("actor.model.*", "Megatron's model knobs", ignored=MEGATRON),
    Key("actor.optim.optimizer", "adam", refuse=_one_of("adam", "adamw"), ignored="AdamW here"),
    Key("actor.optim.bf16", "bf16 optimizer", ignored="actor.precision"),
    Key("actor.optim.fp16", "fp16 optimizer", ignored="actor.precision"),
    Key("actor.optim.lr", "peak learning rate", "actor.lr", float),
    Key("actor.optim.adam_beta1", "Adam beta1", "actor.beta1", float),
    Key("actor.optim.adam_beta2", "Adam beta2", "actor.beta2", float),
    Key("actor.optim.adam_eps", "Adam epsilon", "actor.eps", float),
    Key("actor.optim.min_lr", "the optimizer's min LR (lr_sched.min_lr sets the schedule's)", ignored="the "
        "schedule's floor is actor.lr_sched.min_lr"),
    Key("actor.optim.weight_decay", "weight decay", "actor.weight_decay", float),
    Key("actor.optim.use_distributed_optimizer", "shard the optimizer over DP", "actor.zero1", bool),
    Key("actor.optim.clip_grad", "global gradient-norm clip", "actor.clip_grad", float),
    Key("actor.optim.loss_scale", "fp16 loss scale", ignored="no fp16 loss scaling (fp16 runs as bf16)"),
    Key("actor.optim.*", "Megatron's optimizer knobs", ignored=MEGATRON),
    Key("actor.lr_sched.lr_warmup_fraction", "warmup share of the decay steps", "actor.lr_warmup_samples",
        derived=True),
    Key("actor.lr_sched.lr_warmup_iters", "warmup optimizer steps", "actor.lr_warmup_samples", derived=True),
    Key("actor.lr_sched.lr_warmup_init", "the LR warmup starts at", ignored="warmup starts at 0",
        benign=lambda v: not v),
    Key("actor.lr_sched.max_lr", "peak LR of the schedule", "actor.lr", float),
    Key("actor.lr_sched.min_lr", "the LR at the end of the decay", "actor.min_lr", float),
    Key("actor.lr_sched.lr_decay_style", "constant | cosine | linear", "actor.lr_decay_style", str),
    Key("actor.lr_sched.lr_decay_iters", "decay optimizer steps", "actor.lr_decay_samples", derived=True),
    Key("actor.tokenizer.tokenizer_model", "the tokenizer", "model.tokenizer_path", str),
    Key("actor.tokenizer.*", "tokenizer loading knobs", ignored="the tokenizer loads with transformers' defaults"),
    Key("actor.megatron.*", "Megatron's runtime, checkpoint conversion and profiler", ignored=MEGATRON),
    # reward
    Key("reward.group_name", "Ray worker group", ignored=RAY),
    Key("reward.use_reward_model", "a reward model", refuse=lambda v: None if not v else (
        "false (reward models are not served here: reward.name or reward.fn)"), ignored="false: rule-based"),
    Key("reward.reward_type", "math | ...", "reward.name", lambda v: "math" if v == "math" else str(v)),
    Key("reward.reward_scale", "the reward times this", ignored="no reward scaling here (GRPO's group "
        "normalisation cancels it; it would scale a KL-in-reward's weight)", benign=lambda v: float(v) == 1.0),
    Key("reward.tokenizer.*", "the reward's tokenizer", ignored="the reward scores text"),
    Key("critic.use_critic_model", "PPO's critic", refuse=lambda v: None if not v else (
        "false; a critic here: algorithm.adv_estimator gae with a critic in cluster.component_placement"),
        ignored="false: no critic"),
    Key("hydra.*", "Hydra's own settings", ignored="no Hydra here"),
    Key("defaults", "Hydra's defaults list", ignored="no Hydra here"),
)


def derive(v: Mapping[str, Any], given: set[str], out: Out) -> None:
    """What several RLinf keys set together."""
    prompts, group = int(v["data.rollout_batch_size"]), int(v["algorithm.group_size"])
    n_mb = int(v.get("algorithm.n_minibatches", 1))
    samples = prompts * group
    if n_mb < 1 or samples % n_mb:
        out.refuse("algorithm.n_minibatches", n_mb, f"a divisor of data.rollout_batch_size x algorithm.group_size "
                   f"({prompts} x {group} = {samples})")
        return
    out.set("train.global_batch_size", samples // n_mb, "algorithm.n_minibatches", n_mb,
            f"{prompts} prompts x {group} responses / {n_mb} mini-batches")
    if "algorithm.sampling_params.max_new_tokens" not in v and "runner.seq_length" in v:
        tokens = int(v["runner.seq_length"]) - int(v.get("data.max_prompt_length", 0) or 0)
        out.set("rollout.max_new_tokens", tokens, "runner.seq_length", v["runner.seq_length"], "- max_prompt_length")
    dyn = bool(v.get("runner.enable_dynamic_batch_size"))
    cap = int(v["runner.max_tokens_per_mbs"]) if dyn and v.get("runner.max_tokens_per_mbs") else None
    if "runner.enable_dynamic_batch_size" in v:
        out.set("train.max_tokens_per_microbatch", cap, "runner.enable_dynamic_batch_size", dyn,
                "runner.max_tokens_per_mbs" if dyn else "fixed micro-batches")
    if str(v.get("actor.model.precision")) == "fp16":
        out.warnings.append("actor.model.precision=fp16 runs as bf16: fp16 with loss scaling is not done here "
                            "(bf16 is the half precision of the actor)")
    tp = v.get("rollout.tensor_parallel_size")
    if tp is not None and int(tp) > 1:
        out.ignore("rollout.tensor_parallel_size", tp, "one rollout engine per rank here (no rollout tensor "
                   "parallelism): each rank holds the whole model", warn=True)
    if v.get("runner.output_dir") is not None and v.get("runner.experiment_name") is not None:
        run_dir = f"{v['runner.output_dir']}/{v['runner.experiment_name']}"
        out.set("runtime.run_dir", run_dir, "runner.output_dir", v["runner.output_dir"], "/ runner.experiment_name")
    if v.get("algorithm.clip_ratio_c") is None and "algorithm.clip_ratio_c" in v:
        out.ignore("algorithm.clip_ratio_c", None, "null (no dual clip) is not done here: the dual clip "
                   "algorithm.clip_ratio_c stays 3.0", warn=True)
    placement = v.get("cluster.component_placement")
    if v.get("algorithm.recompute_logprobs", True) and isinstance(placement, Mapping) and not any(
            "inference" in (n.strip() for n in str(k).split(",")) for k in placement):
        entry = next((k for k in placement if "actor" in (n.strip() for n in str(k).split(","))), None)
        if entry is not None:  # RLinf's actor recomputes them on its GPUs: here the inference component there does
            moved = {(f"{entry},inference" if k == entry else k): p for k, p in placement.items()}
            out.set("cluster.component_placement", moved, "algorithm.recompute_logprobs", True,
                    "the actor's GPUs recompute the old log-probs: the inference component on them")
    _steps(v, given, out, samples // n_mb, samples)


def _steps(v: Mapping[str, Any], given: set[str], out: Out, per_step: int, per_iteration: int) -> None:
    """runner.max_steps, else max_epochs x (rows // data.rollout_batch_size); the LR schedule's steps in samples."""
    max_steps = v.get("runner.max_steps")
    if max_steps is not None and int(max_steps) > 0:
        steps = int(max_steps)
        out.set("train.num_iterations", steps, "runner.max_steps", max_steps)
    else:
        epochs = int(v.get("runner.max_epochs", 1))
        rows, problem = dataset_rows(_files(v.get("data.train_data_paths", [])))
        if rows is None:
            out.refuse("runner.max_epochs", epochs, f"runner.max_steps > 0, or data.train_data_paths that can be "
                       f"read ({problem}): an epoch's steps are its rows // data.rollout_batch_size")
            return
        steps = epochs * (rows // int(v["data.rollout_batch_size"]))
        if steps < 1:
            out.refuse("data.rollout_batch_size", v["data.rollout_batch_size"], f"at most the training rows ({rows})")
            return
        out.set("train.num_iterations", steps, "runner.max_epochs", epochs,
                f"{epochs} epochs x ({rows} rows // data.rollout_batch_size {v['data.rollout_batch_size']})")
    optimizer_steps = steps * (per_iteration // per_step)
    s = "actor.lr_sched."
    decay = v.get(s + "lr_decay_iters")
    if decay is not None and int(decay) > 0 and v.get(s + "lr_decay_style", "constant") != "constant":
        out.set("actor.lr_decay_samples", int(decay) * per_step, s + "lr_decay_iters", decay, "x samples per step")
    warm_iters = v.get(s + "lr_warmup_iters")
    fraction = v.get(s + "lr_warmup_fraction")
    if warm_iters:
        out.set("actor.lr_warmup_samples", int(warm_iters) * per_step, s + "lr_warmup_iters", warm_iters,
                "x samples per step")
    elif fraction:
        base = int(decay) if decay else optimizer_steps
        out.set("actor.lr_warmup_samples", int(float(fraction) * base) * per_step, s + "lr_warmup_fraction", fraction,
                f"x {'lr_decay_iters' if decay else 'the optimizer steps'} ({base}) x samples per step")


def _detect(doc: Mapping[str, Any]) -> bool:
    return "runner" in doc


RLINF = Dialect(name="rlinf", title="RLinf", table=TABLE, defaults={}, detect=_detect, derive=derive)
