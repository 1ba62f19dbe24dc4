"""Real engines on CPU through the whole system: gloo world, megatron actor, hf rollout, Arrow handoff."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from slurm_rl.control.acks import read_reshards
from slurm_rl.control.epochs import EpochStore
from slurm_rl.control.paths import RunPaths
from slurm_rl.inspect.report import read_metrics
from toy_data import TOY_DATA, TOY_REWARD
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]


def cpu_config(run_dir: Path, nodes: int = 1, gpus_per_node: int = 4, iterations: int = 3) -> dict:
    """Tiny GRPO run: actor | rollout x2 | inference; at iteration 1 the actor grows to DP 2."""
    return {
        "cluster": {"num_nodes": nodes, "gpus_per_node": gpus_per_node,
                    "component_placement": {"actor": "0", "rollout": "1-2", "inference": "3"}},
        "runtime": {"device": "cpu", "run_dir": str(run_dir), "wait_timeout_s": 300.0, "ack_timeout_s": 300.0,
                    "heartbeat_timeout_s": 120.0, "run_timeout_s": 900.0},
        "train": {"num_iterations": iterations, "rollout_batch_size": 4, "group_size": 4,
                  "global_batch_size": 8, "micro_batch_size": 4},
        "scheduler": {"policy": "scripted", "script": [
            {"at_iteration": 1, "placement": {"actor": "0-1", "rollout": "2", "inference": "3"}},
        ]},
        "model": {"hidden_size": 64, "num_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
        "data": {"train_files": [str(TOY_DATA / "add_4.jsonl")]}, "reward": {"fn": TOY_REWARD},
        "actor": {"lr": 1.0e-3},
        "algorithm": {"clip_eps": 0.2, "kl_coef": 0.05},
        "rollout": {"backend": "hf", "max_new_tokens": 3},
    }


def _check_real_run(run_dir: Path, iterations: int) -> None:
    metrics = read_metrics(run_dir)
    assert [m["iteration"] for m in metrics] == list(range(iterations))
    for m in metrics:
        assert m["samples"] == 16 and m["minibatches"] == 2
        assert 0.0 <= m["reward_mean"] <= 1.0 and m["kl"] >= 0.0
        assert m["loss"] == m["loss"]  # not NaN
    # consumed samples advance by the global batch per step, whatever the DP size
    assert [m["consumed_samples"] for m in metrics] == [16.0 * (i + 1) for i in range(iterations)]
    assert [m["actor_dp"] for m in metrics] == [1] + [2] * (iterations - 1)
    # On-policy: the rollouts kept for the last iteration were sampled with its weight version.
    last = iterations - 1
    shards = sorted((run_dir / "data" / f"iter-{last:06d}" / "rollouts").glob("shard-*.arrow"))
    assert shards
    for shard in shards:
        with pa.memory_map(str(shard)) as source:
            table = pa.ipc.open_file(source).read_all()
        assert set(table.column("weight_version").to_pylist()) == {last}
        assert set(table.column("weight_version_last").to_pylist()) == {last}  # no weights landed mid-generation


@pytest.mark.slow
def test_real_cpu_run_with_actor_reshard(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(cpu_config(run_dir)))
    proc = subprocess.run([*CLI, "run", str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reward curve" in proc.stdout
    _check_real_run(run_dir, 3)
    epochs = EpochStore(RunPaths(run_dir)).all()
    assert [e.ranks_of("actor") for e in epochs] == [[0], [0, 1]]
    moved = {r["rank"]: r["figures"] for r in read_reshards(RunPaths(run_dir), 1)}
    assert moved[1]["bytes_received"] > 0  # rank 1 received the actor state in place, at iteration 1's start
    assert (run_dir / "checkpoints" / "final" / "model.safetensors").exists()


@pytest.mark.slow
@pytest.mark.slurm
def test_real_cpu_run_through_sbatch(slurm_cluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = cpu_config(run_dir, nodes=2, gpus_per_node=2)
    del cfg["cluster"]["gpus_per_node"]  # from the allocation
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = tmp_path / "job.out"
    rc, _ = slurm_cluster.sbatch_wait("--nodes=2", "--ntasks-per-node=2", "--gres=gpu:2", f"--output={log}",
                                      "sbatch/train.sh", str(path), cwd=REPO, timeout=900)
    assert rc == 0, log.read_text() if log.exists() else ""
    _check_real_run(run_dir, 3)
