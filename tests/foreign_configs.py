"""A verl user's and an RLinf user's configs, with their paths pointed at local files.

``verl_gsm8k_grpo`` is the command line of verl's GSM8K GRPO example (``examples/grpo_trainer/run_qwen2-7b.sh``:
its overrides on verl's default config), ``rlinf_math_grpo`` the keys and values of RLinf's math GRPO config
(``examples/reasoning/config/math/qwen2.5-1.5b-grpo-megatron.yaml``). Only the model and data paths differ
from the sources; the files they point at are written here (GSM8K's row count and layout, synthetic questions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GSM8K_TRAIN_ROWS = 7473  # GSM8K's training split: verl's epochs -> steps depend on it
SUFFIX = " Let's think step by step and output the final answer after \"####\"."


def write_gsm8k_parquet(path: Path, rows: int, seed: int) -> Path:
    """GSM8K in verl's preprocessed layout (``examples/data_preprocess/gsm8k.py``): data_source, a chat prompt,
    the answer in reward_model.ground_truth."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = []
    for i in range(rows):
        a, b = (i * 7 + seed) % 50, (i * 13 + seed) % 50
        records.append({"data_source": "openai/gsm8k",
                        "prompt": [{"role": "user", "content": f"What is {a}+{b}?{SUFFIX}"}],
                        "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                        "extra_info": {"split": "train", "index": i}})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def write_math_jsonl(path: Path, rows: int) -> Path:
    """Math prompts as RLinf's reasoning datasets hold them: a prompt and an answer per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(rows):
            a, b = i % 30, (i * 7) % 30
            f.write(json.dumps({"prompt": f"Compute {a}*{b}. Put the answer in \\boxed{{}}.", "answer": str(a * b)})
                    + "\n")
    return path


def verl_gsm8k_grpo(train: Path, test: Path, model: Path) -> list[str]:
    """verl's GSM8K GRPO command line (its overrides), paths replaced."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={train}", f"data.val_files={test}",
        "data.train_batch_size=1024", "data.max_prompt_length=512", "data.max_response_length=1024",
        "data.filter_overlong_prompts=True", "data.truncation='error'",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=256",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.logger=['console','wandb']",
        "trainer.project_name='verl_grpo_example_gsm8k'",
        "trainer.experiment_name='qwen2_7b_function_rm'",
        "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
        "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs=15",
    ]


def verl_fully_async(train: Path, test: Path, model: Path) -> list[str]:
    """verl's fully async DAPO recipe on one node (recipe/fully_async_policy: 4 Trainer and 4 Rollouter GPUs,
    staleness_threshold 1, partial rollout), its keys this translation knows, paths replaced."""
    return [
        f"data.train_files={train}", f"data.val_files={test}", "data.prompt_key=prompt",
        "data.max_prompt_length=2048", "data.max_response_length=8192", "data.filter_overlong_prompts=True",
        "data.train_batch_size=0", "data.gen_batch_size=1", "data.return_raw_chat=True",
        "actor_rollout_ref.rollout.n=16", "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.clip_ratio_low=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.hybrid_engine=False",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.mode=async",
        "trainer.logger=['console']", "trainer.nnodes=1", "trainer.n_gpus_per_node=4",
        "rollout.nnodes=1", "rollout.n_gpus_per_node=4", "rollout.total_rollout_steps=51200",
        "rollout.total_epochs=10", "rollout.test_freq=10",
        "async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=4",
        "async_training.partial_rollout=True",
    ]


def rlinf_math_grpo(train: Path, model: Path, output_dir: Path) -> dict[str, Any]:
    """RLinf's math GRPO config (every key of the source), paths replaced."""
    return {
        "defaults": [{"override hydra/job_logging": "stdout"}],
        "hydra": {"run": {"dir": "."}, "output_subdir": None},
        "cluster": {"num_nodes": 16, "component_placement": {"actor,rollout,reward": "all"}},
        "runner": {
            "task_type": "reasoning",
            "logger": {"log_path": "${runner.output_dir}/${runner.experiment_name}", "project_name": "rlinf",
                       "experiment_name": "${runner.experiment_name}", "logger_backends": ["tensorboard"]},
            "max_epochs": 5, "max_steps": -1, "val_check_interval": 1, "save_interval": 50, "seq_length": 28672,
            "enable_dynamic_batch_size": False, "max_tokens_per_mbs": 28672, "resume_dir": None,
            "experiment_name": "grpo-1.5b", "output_dir": str(output_dir)},
        "algorithm": {
            "group_size": 16, "n_minibatches": 4, "training_batch_size_per_gpu": 1, "rollout_batch_size_per_gpu": None,
            "logprob_forward_micro_batch_size": 1, "val_rollout_batch_size_per_gpu": 4, "recompute_logprobs": True,
            "shuffle_rollout": False, "loss_type": "grpo", "loss_agg_func": "token-mean", "kl_beta": 0.0,
            "kl_penalty_type": "low_var_kl", "ratio_clip_eps": 0.2, "entropy_bonus": 0.0, "calculate_entropy": False,
            "clip_ratio_c": None, "clip_ratio_low": None, "clip_ratio_high": None, "adv_type": "grpo",
            "normalize_advantages": True, "early_stop_imp_ratio": 5.0, "use_valid_token_scale": False,
            "sampling_params": {"use_greedy": False, "temperature": 1.0, "top_k": 1000000, "top_p": 1.0,
                                "repetition_penalty": 1.0,
                                "max_new_tokens": "${subtract:${runner.seq_length}, ${data.max_prompt_length}}",
                                "min_new_tokens": 1}},
        "rollout": {
            "group_name": "RolloutGroup", "gpu_memory_utilization": 0.55, "model_dir": str(model),
            "model_arch": "qwen2.5", "enforce_eager": False, "distributed_executor_backend": "mp",
            "disable_log_stats": False, "detokenize": False, "padding": None, "eos": None, "rollout_backend": "sglang",
            "sglang": {"attention_backend": "triton", "decode_log_interval": 500000, "use_torch_compile": False,
                       "torch_compile_max_bs": 128},
            "vllm": {"attention_backend": "FLASH_ATTN", "enable_chunked_prefill": True, "enable_prefix_caching": True,
                     "enable_flash_infer_sampler": True, "max_num_batched_tokens": None, "torch_profiler_dir": None},
            "return_logprobs": "${not:${algorithm.recompute_logprobs}}", "tensor_parallel_size": 1,
            "pipeline_parallel_size": 1, "validate_weight": False, "validate_save_dir": None, "print_outputs": False,
            "max_running_requests": 64, "cuda_graph_max_bs": 128},
        "data": {
            "type": "math", "dataset_name": "boba", "max_prompt_length": 1024, "filter_prompt_by_length": True,
            "rollout_batch_size": 512, "val_rollout_batch_size": None, "num_workers": 2, "prompt_key": "prompt",
            "shuffle": True, "validation_shuffle": True, "seed": 1234, "train_data_paths": [str(train)],
            "val_data_paths": [str(train)]},
        "actor": {
            "group_name": "ActorGroup", "training_backend": "megatron", "mcore_gpt": True, "spec_name": "decoder_gpt",
            "checkpoint_load_path": None, "offload_optimizer": True, "offload_weight": True, "offload_grad": True,
            "enable_dp_load_balance": False, "calculate_flops": False, "seed": 1234,
            "model": {"precision": "fp16", "add_bias_linear": False, "tensor_model_parallel_size": 2,
                      "pipeline_model_parallel_size": 1, "activation": "swiglu", "sequence_parallel": True,
                      "recompute_method": "block", "recompute_granularity": "full", "recompute_num_layers": 20,
                      "seq_length": "${runner.seq_length}", "encoder_seq_length": "${runner.seq_length}",
                      "normalization": "rmsnorm", "position_embedding_type": "rope", "apply_rope_fusion": True,
                      "bias_dropout_fusion": False, "persist_layer_norm": False, "bias_activation_fusion": False,
                      "attention_softmax_in_fp32": True, "batch_p2p_comm": False, "variable_seq_lengths": True,
                      "gradient_accumulation_fusion": False, "moe_token_dispatcher_type": "alltoall",
                      "use_cpu_initialization": False},
            "optim": {"optimizer": "adam", "bf16": False, "fp16": True, "lr": 2e-05, "adam_beta1": 0.9,
                      "adam_beta2": 0.95, "adam_eps": 1.0e-05, "min_lr": 2.0e-6, "weight_decay": 0.05,
                      "use_distributed_optimizer": True, "overlap_grad_reduce": False, "overlap_param_gather": False,
                      "optimizer_enable_pin": False, "overlap_param_gather_with_optimizer_step": False,
                      "clip_grad": 0.8, "loss_scale": 65536},
            "lr_sched": {"lr_warmup_fraction": 0.01, "lr_warmup_init": 0.0, "lr_warmup_iters": 0, "max_lr": 2.0e-5,
                         "min_lr": 0.0, "lr_decay_style": "constant", "lr_decay_iters": 10},
            "tokenizer": {"tokenizer_model": str(model), "use_fast": False, "trust_remote_code": True,
                          "padding_side": "right"},
            "megatron": {"ddp_bucket_size": None, "distributed_backend": "nccl", "distributed_timeout_minutes": 30,
                         "ckpt_format": "torch", "use_dist_ckpt": False, "tp_comm_bootstrap_backend": "nccl",
                         "tp_comm_overlap_cfg": None, "use_hf_ckpt": True, "use_profiler": False,
                         "ckpt_convertor": {"model": "DeepSeek-R1-Distill-Qwen-1.5B", "model_type": None,
                                            "hf_model_path": "${rollout.model_dir}",
                                            "save_path": "${runner.output_dir}/${runner.experiment_name}/converted",
                                            "use_gpu_num": 0, "use_gpu_index": None, "process_num": 16,
                                            "tensor_model_parallel_size": "${actor.model.tensor_model_parallel_size}",
                                            "pipeline_model_parallel_size":
                                                "${actor.model.pipeline_model_parallel_size}"},
                         "profiler": {"output_dir": "${runner.output_dir}/${runner.experiment_name}/profiler",
                                      "activities": ["cpu", "cuda"], "record_shapes": False}}},
        "reward": {"group_name": "RewardGroup", "use_reward_model": False, "reward_type": "math", "reward_scale": 5.0,
                   "tokenizer": {"tokenizer_model": "${actor.tokenizer.tokenizer_model}", "use_fast": False}},
        "critic": {"use_critic_model": False},
    }


def rlinf_math_grpo_dynamic(train: Path, model: Path, output_dir: Path) -> dict[str, Any]:
    """RLinf's one-node dynamic-scheduling math config (``qwen2.5-1.5b-grpo-megatron-dynamic-1node.yaml``): the
    math GRPO config with its cluster (auto scheduler, RLinf's scheduler knobs, a disaggregated placement) and the
    keys that differ."""
    cfg = rlinf_math_grpo(train, model, output_dir)
    cfg["cluster"] = {"num_nodes": 1, "auto_scheduler": True, "assign_policy": "greedy",
                      "use_pre_process_policy": True, "rollout_use_all_gpus": True, "monitor_interval": 1,
                      "preprocess_threshold": 0.3, "migrate_out_max_bs": 80, "use_wait_before_last_iter_policy": False,
                      "recreate_nccl_groups": False, "fuse_rollout_inference_only": True,
                      "component_placement": {"actor": "0-1", "rollout": "2-5", "inference": "6-7", "reward": "all"}}
    cfg["runner"]["seq_length"] = 2048
    cfg["algorithm"].update(max_num_gen_batches=1, loss_type="actor", normalize_advantages=False,
                            calculate_entropy=True)
    cfg["inference"] = {"model_arch": "${rollout.model_arch}", "group_name": "InferenceGroup", "load_from_actor": True,
                        "model": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
                                  "sequence_parallel": True}}
    cfg["rollout"].update(gpu_memory_utilization=0.70, precision="${actor.model.precision}", max_running_requests=128)
    cfg["data"].update(rollout_batch_size=32, answer_key="answer", apply_chat_template=False)
    return cfg
