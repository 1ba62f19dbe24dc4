"""DAPO's dynamic sampling (``algorithm.filter_groups``) on real runs, both computes.

Each iteration draws generation batches of ``data.gen_batch_size`` prompts until
``train.rollout_batch_size`` groups whose rewards differ are kept; the actor trains the first kept
groups in index order, never a group whose responses all scored the same. Checked from the files:
every drawn prompt was generated once, exactly the kept groups were trained, the next iteration's
prompts follow on in the data stream, and a run stopped and resumed draws and trains what the
uninterrupted one does.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from emulated_configs import emulated_config, write_config
from resume_helpers import BACKENDS, assert_same_outcome, cli, run_until_stopped
from shared_runs import launch, shared_root, shared_run
from slurm_rl.data.reader import StageReader
from slurm_rl.data.schemas import ID_STRIDE
from slurm_rl.metrics import read_metrics
from slurm_rl.rl.dataset import stream_rows
from toy_data import TOY_DATA, TOY_REWARD, TOY_REWARD_WORKERS

ITERATIONS = 3  # resume_helpers' outcome checks compare this many
RBS, GEN, G = 8, 4, 4  # groups trained per iteration, prompts per generation batch, group size


def dapo_config(backend: str, run_dir: Path) -> dict:
    """4 ranks (actor 0, inference 1, rollout 2-3), static, index order; 8 groups of 4 trained per
    iteration, drawn 4 prompts at a time. The emulated rewards are fair coins (1 group in 8 ties);
    cpu: the toy copy task's partial credit from a random model (about half the groups tie at 0)."""
    if backend == "emulated":
        cfg = emulated_config(run_dir, gpus_per_node=4, iterations=ITERATIONS, keep_iterations=10)
        cfg["train"].update(rollout_batch_size=RBS, global_batch_size=16)
    else:
        cfg = {
            "cluster": {"num_nodes": 1, "gpus_per_node": 4},
            "runtime": {"device": "cpu", "run_dir": str(run_dir), "wait_timeout_s": 120.0, "ack_timeout_s": 120.0,
                        "heartbeat_timeout_s": 60.0, "run_timeout_s": 600.0, "keep_iterations": 10},
            "train": {"num_iterations": ITERATIONS, "rollout_batch_size": RBS, "group_size": G,
                      "global_batch_size": 16, "micro_batch_size": 8},
            "model": {"hidden_size": 64, "num_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
            "data": {"train_files": [str(TOY_DATA / "copy_6.jsonl")]},
            "reward": {"fn": TOY_REWARD, "workers": TOY_REWARD_WORKERS},
            "actor": {"lr": 1.0e-3},
            "rollout": {"backend": "hf", "sub_batch": 4, "max_new_tokens": 7},
        }
    cfg["cluster"]["component_placement"] = {"actor": "0", "inference": "1", "rollout": "2-3"}
    cfg["scheduler"] = {"policy": "static", "max_running_requests": 16}
    cfg["train"]["minibatch_order"] = "index"
    cfg.setdefault("data", {})["gen_batch_size"] = GEN
    cfg["algorithm"] = {"filter_groups": {"enable": True, "metric": "acc"}}
    return cfg


def dapo_run(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Path:
    def make(base: Path) -> tuple[Path, str]:
        run_dir = base / "run"
        return run_dir, launch(base / "c.yaml", dapo_config(backend, run_dir), "--no-inspect")

    return shared_run(shared_root(tmp_path_factory), f"dapo-{backend}", make)[0]


def groups_of(table) -> dict[int, list[float]]:
    out: dict[int, list[float]] = defaultdict(list)
    for g, r in zip(table.column("group_id").to_pylist(), table.column("reward").to_pylist()):
        out[g].append(r)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_kept_groups_are_trained_and_the_data_stream_follows_on(backend: str, tmp_path_factory) -> None:
    run_dir = dapo_run(tmp_path_factory, backend)
    metrics = read_metrics(run_dir)
    assert [m["iteration"] for m in metrics] == list(range(ITERATIONS))
    drawn_before, dropped_seen = 0, 0
    for k, m in enumerate(metrics):
        generated = groups_of(StageReader(run_dir, k, "rollouts", None, timeout_s=5).read_all())
        # every prompt of every generation batch opened was generated once, whole
        assert m["prompts_drawn"] == m["num_gen_batches"] * GEN
        assert sorted(generated) == [k * ID_STRIDE + i for i in range(m["prompts_drawn"])]
        assert all(len(v) == G for v in generated.values())
        kept = [g for g in sorted(generated) if len(set(generated[g])) > 1]
        assert m["filter_groups/kept_groups"] == len(kept) >= RBS
        assert m["filter_groups/dropped_groups"] == len(generated) - len(kept)
        # a batch opened only while fewer groups than needed were kept in the ones before it
        assert len([g for g in kept if g - k * ID_STRIDE < m["prompts_drawn"] - GEN]) < RBS
        dropped_seen += m["filter_groups/dropped_groups"]
        # the actor trained the first RBS kept groups in index order, each whole
        trained = groups_of(StageReader(run_dir, k, "actor_batch", [0], timeout_s=5).read_all())
        assert sorted(trained) == kept[:RBS]
        assert m["samples"] == RBS * G and m["minibatches"] == RBS * G // 16
        if backend == "cpu":  # the prompts are the data stream's next ones: iteration k starts where k-1 stopped
            rows = [json.loads(line) for line in (TOY_DATA / "copy_6.jsonl").read_text().splitlines()]
            want = [rows[i]["prompt"] for i in stream_rows(list(range(len(rows))), 1234, drawn_before,
                                                                m["prompts_drawn"], True)]
            table = StageReader(run_dir, k, "rollouts", None, timeout_s=5).read_all()
            text = dict(zip(table.column("group_id").to_pylist(), table.column("prompt_text").to_pylist()))
            assert [text[g] for g in sorted(text)] == want
        drawn_before += m["prompts_drawn"]
    assert dropped_seen > 0  # the filter had something to do


@pytest.mark.slow  # both computes: the quick loop has the emulated resume checks of test_resume
@pytest.mark.parametrize("backend", ["emulated", "cpu"])
def test_stopped_dapo_run_resumes_drawing_the_same_prompts(backend: str, tmp_path_factory, tmp_path: Path) -> None:
    reference = dapo_run(tmp_path_factory, backend)
    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    cfg = dapo_config(backend, run_dir)
    cfg["runtime"]["poll_interval_s"] = 0.25  # the stop lands before the run ends
    config.write_text(yaml.safe_dump(cfg))
    run_until_stopped(config, run_dir, at_iteration=1)
    assert [m["iteration"] for m in read_metrics(run_dir)] == [0]
    resumed = cli("run", "--resume", str(run_dir), "--no-inspect")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_same_outcome(run_dir, reference, ITERATIONS)
    for got, want in zip(read_metrics(run_dir), read_metrics(reference)):
        assert got["prompts_drawn"] == want["prompts_drawn"] and got["num_gen_batches"] == want["num_gen_batches"]


def test_too_few_kept_groups_after_the_limit_fail_the_run_naming_it(tmp_path: Path) -> None:
    """Generation batches of 2 prompts, at most 3: 6 prompts can never give the 8 groups needed."""
    cfg = dapo_config("emulated", tmp_path / "run")
    cfg["data"]["gen_batch_size"] = 2
    cfg["algorithm"]["filter_groups"]["max_num_gen_batches"] = 3
    proc = cli("run", str(write_config(tmp_path / "c.yaml", cfg)), "--no-inspect")
    assert proc.returncode == 1
    text = proc.stdout + proc.stderr
    assert "DynamicSamplingExhausted" in text and "after 3 generation batches of 2 prompts" in text, text[-3000:]
    assert "max_num_gen_batches = 3" in text


def test_bad_dynamic_sampling_keys_exit_2_naming_each(tmp_path: Path) -> None:
    cfg = dapo_config("emulated", tmp_path / "run")
    cfg["algorithm"]["filter_groups"].update(metric="seq_final_reward", max_num_gen_batches=-1)
    cfg["data"]["gen_batch_size"] = 0
    cfg["train"].update(group_size=3, rollout_batch_size=16, minibatch_order="arrival")  # 16 a batch: not whole groups
    cfg["cluster"]["auto_scheduler"], cfg["scheduler"]["policy"] = True, "auto"
    proc = cli("validate", str(write_config(tmp_path / "c.yaml", cfg)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = proc.stdout + proc.stderr
    for line in ("algorithm.filter_groups.metric: got 'seq_final_reward'; allowed: one of acc, score, seq_reward",
                 "algorithm.filter_groups.max_num_gen_batches: got -1",
                 "data.gen_batch_size: got 0",
                 "train.global_batch_size: got 16; allowed: a multiple of train.group_size (3)",
                 "algorithm.filter_groups.enable: got True; allowed: false, or scheduler.policy static (here auto)"):
        assert line in text, text
    assert not (tmp_path / "run").exists()


def test_group_metric_keeps_and_the_stream_position() -> None:
    from types import SimpleNamespace

    from slurm_rl.rl.filter_groups import group_metric, keeps, prompts_before

    assert keeps([0.0, 1.0]) and keeps([0.5]) and not keeps([0.25, 0.25, 0.25])
    shaping = SimpleNamespace(enable=True, len=2, penalty_factor=1.0)
    # 4 new tokens at most, the last 2 shaped: lengths 3 and 4 lose 0.5 and 1.0
    shaped = [1.0 - 0.5, 1.0 - 1.0, 1.0]
    assert group_metric(shaped, [3, 4, 2], "seq_reward", shaping, 4) == shaped
    assert group_metric(shaped, [3, 4, 2], "acc", shaping, 4) == [1.0, 1.0, 1.0]  # the score before shaping: a tie
    rows = [{"iteration": 0, "prompts_drawn": 12}, {"iteration": 1, "prompts_drawn": 8},
            {"iteration": 1, "prompts_drawn": 16}, {"iteration": 2}]  # iteration 1 re-run after a resume: its last row
    assert prompts_before(rows, 0, 8) == 0 and prompts_before(rows, 2, 8) == 28 and prompts_before(rows, 3, 8) == 36
    with pytest.raises(LookupError, match=r"iteration\(s\) \[3, 4\]"):
        prompts_before(rows, 5, 8)
