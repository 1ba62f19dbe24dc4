"""Runs that bring their own model, data and reward: a ``cpu`` run under ``auto`` trains a made
Hugging Face checkpoint (Llama, Qwen2, Qwen3) on JSONL and Parquet prompt files with each built-in
reward, and a random model with a user ``reward.fn``; the trained actor exports to a directory
``transformers`` loads; bad inputs stop ``validate`` and ``run`` with exit code 2 before a launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from shared_runs import REPO, cli, shared_root, shared_run
from slurm_rl.metrics import read_metrics
from cli_command import CLI

pytestmark = pytest.mark.slow

ITERATIONS = 2
USER_REWARD = '''
def reward(prompt, response, answer, extra):
    """0.5 for a prompt of the add task handed over whole (prompt, answer and extra columns); the
    rows of even id raise (scored 0 and counted under reward.on_error: zero)."""
    if extra["id"] % 2 == 0:
        raise ValueError("even row")
    return 0.5 if prompt.endswith("=") and answer.startswith("####") and extra["task"] == "add" else 0.0
'''


def write_verl_gsm8k(path: Path, split: str, rows: list[dict[str, Any]]) -> Path:
    """Rows laid out exactly as verl's GSM8K preprocessing (examples/data_preprocess/gsm8k.py) writes
    them: chat-message ``prompt``, ``data_source``, ``ability``, the answer nested at
    ``reward_model.ground_truth`` (the number after "####") and ``extra_info``."""
    out = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": r["prompt"]}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": r["answer"].split("####")[-1].strip()},
            "extra_info": {"split": split, "index": i, "answer": r["answer"], "question": r["prompt"]}}
           for i, r in enumerate(rows)]
    pq.write_table(pa.Table.from_pylist(out), path)
    return path


def _inputs(root: Path) -> dict[str, Path]:
    """Checkpoints (with a chat template), prompt files in JSONL and Parquet, a user reward module."""
    from slurm_rl.toy.checkpoint import make_checkpoint
    from slurm_rl.toy.tasks import task_rows, write_task_dataset
    from slurm_rl.toy.tokenizer import CHAT_TEMPLATE, train_tokenizer

    tok = train_tokenizer(root / "tokenizer", chat_template=CHAT_TEMPLATE)
    size = dict(vocab_size=(len(tok) + 7) // 8 * 8, hidden_size=64, num_layers=1, max_position_embeddings=64)
    out = {"llama": make_checkpoint(root / "llama", "llama", tokenizer_dir=root / "tokenizer", num_kv_heads=1,
                                    **size),
           "qwen2": make_checkpoint(root / "qwen2", "qwen2", tokenizer_dir=root / "tokenizer", num_kv_heads=1,
                                    tie_word_embeddings=True, **size),
           "qwen3": make_checkpoint(root / "qwen3", "qwen3", tokenizer_dir=root / "tokenizer", head_dim=48, **size)}
    out["add.jsonl"] = write_task_dataset(root / "add.jsonl", "add", rows=40, max_operand=4)
    out["add.parquet"] = write_task_dataset(root / "add.parquet", "add", rows=40, max_operand=4, first_id=40,
                                            chat=True)
    out["val.jsonl"] = write_task_dataset(root / "val.jsonl", "add", rows=6, max_operand=4, first_id=80)
    out["verl-train.parquet"] = write_verl_gsm8k(root / "verl-train.parquet", "train",
                                                 list(task_rows("add", rows=40, max_operand=4, first_id=40)))
    out["verl-test.parquet"] = write_verl_gsm8k(root / "verl-test.parquet", "test",
                                                list(task_rows("add", rows=6, max_operand=4, first_id=80)))
    rows = [{"question": r["prompt"], "answer": r["answer"].removeprefix("#### ")}
            for r in task_rows("add", rows=40, max_operand=4)]
    pq.write_table(pa.Table.from_pylist(rows), root / "math.parquet")  # answers "7": math-verify parses them
    out["math.parquet"] = root / "math.parquet"
    out["copy.jsonl"] = write_task_dataset(root / "copy.jsonl", "copy", rows=40, length=3, alphabet=4)
    (root / "user_rewards").mkdir()
    (root / "user_rewards" / "__init__.py").write_text("")
    (root / "user_rewards" / "toy.py").write_text(USER_REWARD)
    out["user"] = root
    return out


def _config(run_dir: Path, **sections: Any) -> dict:
    """3 ranks under auto: the rollout and inference ranks join the actor inside each iteration."""
    cfg: dict[str, Any] = {
        "cluster": {"num_nodes": 1, "gpus_per_node": 3, "auto_scheduler": True,
                    "component_placement": {"actor": "0", "rollout": "1", "inference": "2"}},
        "runtime": {"device": "cpu", "run_dir": str(run_dir), "wait_timeout_s": 300.0, "ack_timeout_s": 300.0,
                    "heartbeat_timeout_s": 120.0, "run_timeout_s": 600.0},
        "train": {"num_iterations": ITERATIONS, "rollout_batch_size": 4, "group_size": 4,
                  "global_batch_size": 8, "micro_batch_size": 4},
        "scheduler": {"policy": "auto", "max_running_requests": 16},
        "actor": {"lr": 1.0e-3},
        "algorithm": {"kl_coef": 0.05},
        "rollout": {"backend": "hf", "max_new_tokens": 4},
        "reward": {"workers": 1},
    }
    for name, section in sections.items():
        cfg[name] = {**cfg.get(name, {}), **section}
    return cfg


VERL_DATA = {"answer_key": "reward_model.ground_truth"}  # what a verl user's GSM8K files need, nothing else
RUNS: dict[str, Any] = {  # gsm8k: verl's files as they are, scored through reward.name auto (data_source)
    "gsm8k": lambda f: {"model": {"path": str(f["llama"])},
                        "data": {"train_files": [str(f["verl-train.parquet"])],
                                 "val_files": [str(f["verl-test.parquet"])], **VERL_DATA},
                        "reward": {"name": "auto"}, "eval": {"every": 1, "n": 2}},
    "math": lambda f: {"model": {"path": str(f["qwen2"])},
                       "data": {"train_files": [str(f["math.parquet"])], "prompt_key": "question",
                                "apply_chat_template": False},
                       "reward": {"name": "math"},
                       "algorithm": {"use_kl_in_reward": True, "kl_penalty": "low_var_kl",
                                     "kl_ctrl": {"type": "adaptive", "kl_coef": 0.01, "target_kl": 0.001, "horizon": 32}}},
    "exact": lambda f: {"model": {"path": str(f["qwen3"])},
                        "data": {"train_files": [str(f["copy.jsonl"])], "max_prompt_length": 30},
                        "reward": {"name": "exact"}, "rollout": {"stop": ["d"]}},
    "fn": lambda f: {"model": {"hidden_size": 64, "num_layers": 1, "num_attention_heads": 2,
                               "max_position_embeddings": 32},
                     "data": {"train_files": [str(f["add.jsonl"])]},
                     "reward": {"fn": "user_rewards.toy:reward", "on_error": "zero"}},
}


@pytest.fixture(scope="session")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Made once per session, shared by the xdist workers (the runs spread over them)."""
    def make(base: Path) -> tuple[Path, str]:
        return base, json.dumps({k: str(v) for k, v in _inputs(base).items()})

    return {k: Path(v) for k, v in json.loads(shared_run(shared_root(tmp_path_factory), "hf-inputs", make)[1]).items()}


def _run(base: Path, cfg: dict, user: Path) -> tuple[Path, str]:
    config = base / "c.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = dict(os.environ)
    if "fn" in cfg.get("reward", {}):  # the user's module on PYTHONPATH (its run then starts fresh interpreters)
        env["PYTHONPATH"] = os.pathsep.join([str(user), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([*CLI, "run", str(config), "--no-inspect"], cwd=REPO,
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Path(cfg["runtime"]["run_dir"]), proc.stdout


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]):
    root = shared_root(tmp_path_factory)

    def get(name: str) -> Path:
        return shared_run(root, f"hf-run-{name}", lambda base: _run(base, _config(base / "run", **RUNS[name](inputs)),
                                                                     inputs["user"]))[0]
    return get


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_cpu_auto_run_trains_on_prompt_files_with_each_reward(runs, name: str) -> None:
    run_dir = runs(name)
    metrics = read_metrics(run_dir)
    assert [m["iteration"] for m in metrics] == list(range(ITERATIONS))
    assert all(m["samples"] == 16 and 0.0 <= m["reward_mean"] <= 1.0 and m["loss"] == m["loss"] for m in metrics)
    assert len({m["prompts_digest"] for m in metrics}) == ITERATIONS  # each iteration its own prompts
    # auto moved ranks: the actor (rank 0 alone in the placement) trained with more ranks
    assert any(p["dp"] > 1 for m in metrics for p in m["plan"]), [m["plan"] for m in metrics]
    if name == "fn":  # the user function saw prompt, answer and extra columns; its errors scored 0, counted
        assert all(m["reward_mean"] == 0.5 * (16 - m["reward_errors"]) / 16 for m in metrics), metrics
        assert sum(m["reward_errors"] for m in metrics) > 0 and all(m["reward_timeouts"] == 0 for m in metrics)
    else:
        assert all(m["reward_errors"] == 0 == m["reward_timeouts"] for m in metrics)
    if name == "math":  # the KL in the reward under verl's adaptive controller, iteration after iteration
        from slurm_rl.rl.kl_ctrl import adaptive_update

        assert metrics[0]["kl_ctrl/kl_coef"] == 0.01
        for m, nxt in zip(metrics, metrics[1:]):
            assert m["kl_ctrl/current_kl"] >= 0.0
            assert nxt["kl_ctrl/kl_coef"] == pytest.approx(adaptive_update(
                m["kl_ctrl/kl_coef"], m["kl_ctrl/current_kl"], m["samples"], 0.001, 32), rel=1e-12)
        assert metrics[-1]["kl_ctrl/kl_coef"] != 0.01
    if name == "gsm8k":  # evaluated before the first iteration and after each
        assert all(m["val/prompts"] == 6.0 and m["val/n"] == 2.0 and 0.0 <= m["val/pass@1"] <= 1.0 for m in metrics)
        assert (run_dir / "eval" / "iter-000000.json").exists()
    assert (run_dir / "checkpoints" / "final" / "model.safetensors").exists()


def test_stop_strings_cut_responses(runs) -> None:
    """``rollout.stop: ["d"]``: no response of the copy run goes on after a "d"."""
    from transformers import AutoTokenizer

    import pyarrow.ipc as ipc

    run_dir = runs("exact")
    tok = AutoTokenizer.from_pretrained(str(yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["path"]))
    shards = sorted((run_dir / "data").glob(f"iter-{ITERATIONS - 1:06d}/rollouts/shard-*.arrow"))
    assert shards
    texts = [tok.decode(ids, skip_special_tokens=True) for s in shards
             for ids in ipc.open_file(pa.memory_map(str(s))).read_all().column("response_ids").to_pylist()]
    assert all("d" not in t[:-1] for t in texts), texts


@pytest.mark.parametrize("name", ["gsm8k", "fn"])
def test_export_loads_in_transformers_with_the_trained_weights(runs, name: str, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slurm_rl.engines.convert import megatron_to_hf
    from slurm_rl.engines.hf_checkpoint import model_config_from_dir

    run_dir = runs(name)
    proc = cli("export", str(run_dir), "--to", str(tmp_path / "hf"))
    assert proc.returncode == 0, proc.stderr
    assert "exported" in proc.stdout
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert tok("3+4=")["input_ids"]
    cfg = model_config_from_dir(tmp_path / "hf")
    trained = dict(megatron_to_hf(load_file(run_dir / "checkpoints" / "final" / "model.safetensors").items(), cfg))
    state = model.state_dict()
    assert all(torch.equal(state[n], t) for n, t in trained.items())
    if name != "gsm8k":
        return
    again = cli("export", str(run_dir), "--to", str(tmp_path / "hf"))
    assert again.returncode == 2 and "exists and is not empty" in again.stderr
    missing = cli("export", str(run_dir), "--checkpoint", "iter-7", "--to", str(tmp_path / "x"))
    assert missing.returncode == 2 and "--checkpoint: 'iter-7' has no actor weights" in missing.stderr
    assert "this run has: final" in missing.stderr


def _bad(inputs: dict[str, Path], tmp_path: Path, **sections: Any) -> subprocess.CompletedProcess[str]:
    cfg = _config(tmp_path / "run", **sections)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cli("validate", str(config))


def test_bad_inputs_exit_2_before_a_launch_with_every_problem(inputs: dict[str, Path], tmp_path: Path) -> None:
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"prompt": "1+1=", "answer": "#### 2"}\n{"question": "2+2=", "answer": "#### 4"}\n')
    proc = _bad(inputs, tmp_path, model={"path": str(tmp_path / "no-model")},
                data={"train_files": [str(bad_jsonl), str(tmp_path / "gone.jsonl")]},
                reward={"fn": "no_such_module.rewards:score"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    print(err)
    assert f"model.path: got '{tmp_path / 'no-model'}'; allowed: an existing, readable Hugging Face checkpoint" in err
    assert "data.train_files[0]" in err and "line 2" in err and "question" in err  # file, row and the keys it has
    assert "data.train_files[1]" in err and "gone.jsonl" in err
    assert "no_such_module" in err
    assert not (tmp_path / "run").exists()  # nothing made
    # a run refuses the same way, before any rank starts
    run = cli("run", str(tmp_path / "bad.yaml"))
    assert run.returncode == 2 and "model.path" in run.stderr and not (tmp_path / "run").exists()


def test_no_prompt_left_after_filtering_is_refused(inputs: dict[str, Path], tmp_path: Path) -> None:
    from slurm_rl.config import config_from_mapping
    from slurm_rl.inputs import input_problems

    def problems(**data: Any) -> list[str]:
        cfg = config_from_mapping(_config(tmp_path / "run", model={"path": str(inputs["llama"])}, reward={"name": "gsm8k"},
                                          data={"train_files": [str(inputs["add.jsonl"])], **data}))
        return [str(issue) for issue in input_problems(cfg)]

    assert problems() == []
    (dropped,) = problems(max_prompt_length=3)
    print(dropped)
    assert dropped.startswith("data.max_prompt_length: got 3; allowed: a limit that keeps at least one prompt")
    (strict,) = problems(max_prompt_length=3, overlong="error")
    print(strict)
    assert strict.startswith("data.max_prompt_length: got 3; allowed: at least every prompt's length: ")
    assert "add.jsonl:1 has 23 tokens (> 3)" in strict


def test_a_corrupt_data_file_read_mid_run_names_file_and_row(inputs: dict[str, Path], tmp_path: Path) -> None:
    """Valid at launch, damaged before the rank reads it: the run fails naming the file and the row."""
    from slurm_rl.rl.dataset import PromptDataset
    from slurm_rl.rl.tokenizer import load_tokenizer
    from slurm_rl.worker.real_compute import data_spec
    from slurm_rl.config import config_from_mapping

    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "#### 2"}) + "\n{oops\n")
    cfg = config_from_mapping(_config(tmp_path / "run", data={"train_files": [str(data)]}, reward={"name": "gsm8k"},
                                      model={"hidden_size": 64, "num_attention_heads": 2}))
    with pytest.raises(Exception) as exc:
        PromptDataset.load(cfg.data.train_files, data_spec(cfg), load_tokenizer(None, None))
    assert str(data) in str(exc.value) and "2" in str(exc.value)


def test_verl_rows_load_as_they_are_and_a_wrong_answer_key_is_refused(inputs: dict[str, Path], tmp_path: Path) -> None:
    from slurm_rl.config import config_from_mapping
    from slurm_rl.inputs import input_problems
    from slurm_rl.rl.dataset import DataSpec, PromptDataset
    from slurm_rl.rl.tokenizer import load_tokenizer

    def problems(answer_key: str, reward: str = "auto") -> list[str]:
        cfg = config_from_mapping(_config(tmp_path / "run", model={"path": str(inputs["llama"])}, reward={"name": reward},
                                          data={"train_files": [str(inputs["verl-train.parquet"])],
                                                "answer_key": answer_key}))
        return [str(issue) for issue in input_problems(cfg)]

    assert problems("reward_model.ground_truth") == []
    # the whole mapping is not an answer gsm8k can read: refused before launch, not on every sample
    (whole,) = problems("reward_model", reward="gsm8k")
    assert whole.startswith("data.answer_key: got 'reward_model'") and "is not a GSM8K solution" in whole, whole
    (nested,) = problems("reward_model.truth")
    assert "column 'reward_model' has keys ['style', 'ground_truth']" in nested, nested
    (top,) = problems("labels.ground_truth")
    assert "has keys ['data_source', 'prompt', 'ability', 'reward_model', 'extra_info']" in top, top
    spec = DataSpec(train_files=(str(inputs["verl-train.parquet"]),), answer_key="reward_model.ground_truth")
    rows = PromptDataset.load(spec.train_files, spec, load_tokenizer(str(inputs["llama"]), None)).rows
    assert rows[0].answer == rows[0].extra["extra_info"]["answer"].split("#### ")[-1]
    assert rows[0].extra["data_source"] == "openai/gsm8k" and rows[0].raw_prompt == rows[0].extra["extra_info"]["question"]
