"""No silent emulation, and RLinf's switch means what it says:

* ``runtime.device`` defaults to ``auto``: ``cuda`` where the process sees GPUs, else ``cpu``;
  ``emulated`` only when a config names it, and a run that emulates while it holds GPUs says so first;
* ``cluster.auto_scheduler: true`` turns dynamic scheduling on (RLinf's docs' example runs ``auto``
  with pre-process), a dynamic policy without it is refused naming both keys.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emulated_configs import FAST_COSTS
from shared_runs import launch
from slurm_rl.config import ConfigError, config_from_mapping, load_config
from slurm_rl.control.epochs import EpochStore
from slurm_rl.control.paths import RunPaths
from toy_data import TOY_DATA, TOY_REWARD, TOY_REWARD_WORKERS
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]
REAL = {"data": {"train_files": [str(TOY_DATA / "add_4.jsonl")]},
        "reward": {"fn": TOY_REWARD, "workers": TOY_REWARD_WORKERS}}
# The example of RLinf's docs for its auto scheduler, as given there
RLINF_EXAMPLE = {"cluster": {"num_nodes": 1, "auto_scheduler": True, "use_pre_process_policy": True,
                             "use_wait_before_last_iter_policy": False,
                             "component_placement": {"actor": "0-1", "rollout": "2-5", "inference": "6-7"}}}


def _cluster(**extra) -> dict:
    return {"cluster": {"num_nodes": 1, "gpus_per_node": 4,
                        "component_placement": {"actor": "0", "rollout": "1-2", "inference": "3"}, **extra}}


def _fake_nvidia_smi(tmp_path: Path, gpus: int) -> dict[str, str]:
    """An environment whose PATH finds an ``nvidia-smi -L`` listing ``gpus`` GPUs (this machine has none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    lines = "\n".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'" for i in range(gpus))
    script.write_text(f"#!/bin/sh\n{lines}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_default_device_is_cpu_without_gpus_and_emulated_only_when_named() -> None:
    cfg = config_from_mapping({**_cluster(), **REAL}, env={})
    assert cfg.runtime.device == "cpu"
    assert yaml.safe_load(cfg.to_yaml())["runtime"]["device"] == "auto"  # each rank resolves it itself
    assert config_from_mapping({**_cluster(), "runtime": {"device": "emulated"}}, env={}).runtime.device == "emulated"
    with pytest.raises(ConfigError) as exc:  # auto is a real device: it needs prompts and a reward
        config_from_mapping(_cluster(), env={})
    assert "data.train_files" in str(exc.value) and "runtime.device cpu" in str(exc.value)


def test_auto_is_cuda_where_the_process_sees_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, 4)["PATH"])
    assert config_from_mapping({**_cluster(), **REAL}, env={}).runtime.device == "cuda"
    hidden = config_from_mapping({**_cluster(), **REAL}, env={"CUDA_VISIBLE_DEVICES": ""})
    assert hidden.runtime.device == "cpu"  # Slurm bound no GPU to this step


def test_a_run_that_emulates_on_gpus_says_so_first(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**_cluster(), "runtime": {"device": "emulated", "run_dir": str(tmp_path / "r")}}))
    env = dict(os.environ, SLURM_JOB_GPUS="0,1,2,3")
    out = subprocess.run([*CLI, "prepare", str(config)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[0].startswith("slurm_rl: EMULATING: runtime.device is emulated"), out.stderr
    assert "SLURM_JOB_GPUS=0,1,2,3" in out.stderr.splitlines()[0]
    quiet = subprocess.run([*CLI, "prepare", str(config),
                            f"runtime.run_dir={tmp_path / 'r2'}"], cwd=REPO,
                           env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
                           capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and "EMULATING" not in quiet.stderr  # no GPUs held: nothing to say


def test_rlinf_docs_example_is_scheduled_dynamically(tmp_path: Path) -> None:
    """RLinf's own example (auto_scheduler: True, use_pre_process_policy: True) validates as policy
    auto with pre-process on, and an emulated run of it moves the actor's ranks inside iterations."""
    doc = {**RLINF_EXAMPLE, "runtime": {"device": "emulated", "run_dir": str(tmp_path / "run")}}
    doc["cluster"] = {**doc["cluster"], "gpus_per_node": 8}
    cfg = config_from_mapping(doc, env={})
    assert cfg.scheduler.policy == "auto" and cfg.cluster.use_pre_process_policy
    doc["train"] = {"num_iterations": 2, "rollout_batch_size": 16, "group_size": 8, "global_batch_size": 32,
                    "micro_batch_size": 4}
    doc["emulated"] = dict(FAST_COSTS)
    launch(tmp_path / "c.yaml", doc, "--no-inspect")
    epochs = EpochStore(RunPaths(tmp_path / "run")).all()
    for k in range(2):
        actor_sets = {tuple(e.ranks_of("actor")) for e in epochs if e.iteration == k}
        assert len(actor_sets) > 1, [(e.iteration, e.ranks_of("actor"), e.reason) for e in epochs]


@pytest.mark.parametrize("policy", ["auto", "plan"])
def test_a_dynamic_policy_without_the_switch_exits_2_naming_both_keys(tmp_path: Path, policy: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**_cluster(), "runtime": {"device": "emulated"}}))
    out = subprocess.run([*CLI, "validate", str(config),
                          f"scheduler.policy={policy}", "cluster.auto_scheduler=false"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    line = next(x for x in out.stderr.splitlines() if x.strip().startswith("scheduler.policy"))
    assert f"got '{policy}'" in line and "cluster.auto_scheduler" in line, out.stderr
    # the switch on with the static policy named is refused too, naming both keys
    with pytest.raises(ConfigError) as exc:
        load_config(config, ["scheduler.policy=static", "cluster.auto_scheduler=true"], env={})
    assert "cluster.auto_scheduler: got True" in str(exc.value) and "scheduler.policy static" in str(exc.value)
    # scripted placement changes are not RLinf's dynamic scheduling: allowed either way
    assert load_config(config, ["scheduler.policy=scripted"], env={}).scheduler.policy == "scripted"


def test_validate_names_the_device_the_policy_and_the_model() -> None:
    """The cluster example runs real engines: validate says which device (auto -> cpu here), which
    policy, and what model (architecture and size), in text and JSON."""
    base = [*CLI, "validate", str(REPO / "configs/examples/slurm_2x4.yaml"),
            "cluster.gpus_per_node=4", "model.path=null", f"data.train_files=[{TOY_DATA / 'add_4.jsonl'}]",
            "data.val_files=[]"]  # a random Llama of the model.* sizes (the example's toy files are made by the quickstart)
    text = subprocess.run(base, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    assert "device cpu (runtime.device auto" in text.stdout and "scheduling auto (cluster.auto_scheduler true)" in text.stdout
    assert "model: llama" in text.stdout and "M parameters" in text.stdout
    doc = json.loads(subprocess.run(base + ["--json"], cwd=REPO, capture_output=True, text=True, timeout=120).stdout)
    assert (doc["device"], doc["device_setting"], doc["policy"]) == ("cpu", "auto", "auto")
    assert doc["model"]["architecture"] == "llama" and doc["model"]["parameters"] > 100_000
    emulated = subprocess.run([*CLI, "validate", str(REPO / "configs/examples/emulated_8.yaml"),
                               "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert json.loads(emulated.stdout)["device"] == "emulated"
