"""The launch paths on a real Slurm (sbatch, submitit slurm executor) and submitit's local executor."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from emulated_configs import emulated_config, write_config
from slurm_rl.inspect.report import report_json
from slurm_rl.launch.hostfile import rank_hosts
from slurm_rl.launch.node import node_ranks, rank_env
from slurm_rl.launch.rank_env import (
    RankDiscoveryError,
    RankInfo,
    bind_accelerators,
    check_node,
    discover_rank,
    port_for_job,
)
from slurm_rl.placement import parse_placement
from cli_command import CLI

REPO = Path(__file__).resolve().parents[1]


def _slurm_config(tmp_path: Path, run_dir: Path) -> Path:
    """2 nodes x 4 slots; gpus_per_node comes from the allocation."""
    cfg = emulated_config(run_dir, nodes=2, gpus_per_node=4)
    del cfg["cluster"]["gpus_per_node"]
    return write_config(tmp_path / "slurm.yaml", cfg)


def _check_run(run_dir: Path, world: int, nodes: int | None = None) -> None:
    records = report_json(run_dir)["epochs"]
    assert len(records) == 3, records
    assert all(r["acks"] == world for r in records)
    if nodes is not None:  # the ranks ran on that many of the cluster's nodes (whichever Slurm picked)
        seen = {json.loads(p.read_text())["host"] for p in (run_dir / "control" / "acks" / "000000").glob("rank-*.json")}
        assert len(seen) == nodes and all(h.startswith("n") and h[1:].isdigit() for h in seen), seen


def test_rank_discovery_sources() -> None:
    local = discover_rank({"SLURM_RL_RANK": "3", "SLURM_RL_WORLD_SIZE": "8", "SLURM_RL_LOCAL_RANK": "3",
                           "SLURM_RL_JOB_ID": "local-1"})
    assert (local.rank, local.world_size, local.source) == (3, 8, "local")
    slurm = discover_rank({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
                           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "2",
                           "SLURMD_NODENAME": "n2", "SLURM_RL_MASTER_ADDR": "127.0.0.1"})
    assert (slurm.rank, slurm.node_rank, slurm.host, slurm.source) == (5, 1, "n2", "slurm")
    assert slurm.master_port == port_for_job("4242") != port_for_job("4243")
    with pytest.raises(RankDiscoveryError, match="SLURM_RL_RANK"):
        discover_rank({})
    with pytest.raises(RankDiscoveryError, match="SLURM_NTASKS"):
        discover_rank({"SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "localhost"})


@pytest.mark.slow
def test_submitit_local_executor(tmp_path: Path) -> None:
    from slurm_rl.launch.submit import submit

    run_dir = tmp_path / "run"
    job = submit(write_config(tmp_path / "c.yaml", emulated_config(run_dir)), executor="local")
    assert job.results() == [0]  # one task: it forks the node's 8 ranks
    _check_run(run_dir, 8)


@pytest.mark.slow
@pytest.mark.slurm
def test_sbatch_path_on_real_slurm(slurm_cluster, tmp_path: Path) -> None:
    """The former launch, one srun task per rank (``SLURM_RL_FORKSERVER=0``); the other sbatch tests
    run the default, a task per node that forks its ranks."""
    run_dir = tmp_path / "run"
    log = tmp_path / "job.out"
    rc, _ = slurm_cluster.sbatch_wait("--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4", f"--output={log}",
                                      "--export=ALL,SLURM_RL_FORKSERVER=0",
                                      "sbatch/train.sh", str(_slurm_config(tmp_path, run_dir)), cwd=REPO)
    text = log.read_text() if log.exists() else ""
    assert rc == 0, text
    assert "slurm_rl node" not in text and text.count("source slurm] run dir") == 8, text
    # the allocation holds (fake) GPUs and the run emulates: its first line says so
    first, second = text.splitlines()[:2]
    assert first.startswith("slurm_rl: EMULATING: runtime.device is emulated") and "SLURM_JOB_GPUS=" in first, text
    assert second == f"slurm_rl run dir: {run_dir}"
    _check_run(run_dir, 8, nodes=2)
    inspected = subprocess.run([*CLI, "inspect", str(run_dir)], cwd=REPO,
                               capture_output=True, text=True, timeout=60)
    assert inspected.returncode == 0 and "placement epochs" in inspected.stdout


@pytest.mark.slow
@pytest.mark.slurm
def test_sbatch_rejects_bad_config_with_exit_2(slurm_cluster, tmp_path: Path) -> None:
    cfg = emulated_config(tmp_path / "never", nodes=2, gpus_per_node=4)
    cfg["cluster"]["component_placement"]["inference"] = "6-9"
    log = tmp_path / "job.out"
    rc, _ = slurm_cluster.sbatch_wait("--nodes=1", "--ntasks-per-node=1", f"--output={log}", "sbatch/train.sh",
                                      str(write_config(tmp_path / "bad.yaml", cfg)), cwd=REPO, timeout=300)
    assert rc == 2, log.read_text() if log.exists() else ""
    assert "cluster.component_placement.inference" in log.read_text()
    assert not (tmp_path / "never").exists()


@pytest.mark.slow
@pytest.mark.slurm
def test_submitit_slurm_executor(slurm_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_rl.launch.submit import submit

    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    run_dir = tmp_path / "run"
    # Submitting happens outside the allocation, so the config states the slots per node.
    config = write_config(tmp_path / "c.yaml", emulated_config(run_dir, nodes=2, gpus_per_node=4))
    job = submit(config, executor="slurm", slurm_params={"gres": "gpu:4"})
    assert job.results() == [0] * 2  # a task per node, each forking its node's 4 ranks
    _check_run(run_dir, 8, nodes=2)
    if slurm_cluster.accounting:
        assert slurm_cluster.wait_sacct_state(str(job.job_id)) == "COMPLETED"


def test_node_task_serves_its_nodes_ranks_with_their_srun_variables() -> None:
    """RLinf's "4-7:0-1" on 2 nodes: srun task 0 forks ranks 0-3 on node 0, task 1 ranks 4 and 5."""
    placement = parse_placement({"actor": "0-3", "rollout": "4-7:0-1"}, num_slots=8, num_nodes=2)
    node_of_rank = [placement.node_of_rank(r) for r in range(placement.world_size)]
    assert node_ranks(node_of_rank, 0) == (0, [0, 1, 2, 3])
    assert node_ranks(node_of_rank, 1) == (1, [4, 5])
    with pytest.raises(ValueError, match="srun task 2 but the placement holds ranks on 2 nodes"):
        node_ranks(node_of_rank, 2)
    assert node_ranks([1, 0, 1], 0) == (1, [0, 2])  # nodes in the order of their first rank, as the hostfile
    env = rank_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]"}, 5, 1, 6, 1)
    info = discover_rank(dict(env, SLURM_RL_MASTER_ADDR="127.0.0.1"))
    assert (info.rank, info.world_size, info.local_rank, info.node_rank, info.source) == (5, 6, 1, 1, "slurm")


def test_a_group_job_step_has_a_task_per_node_where_its_ranks_fill_the_allocation() -> None:
    """sbatch/mux.sh: a job whose ranks fill the allocation's tasks, as many on every node, runs a task per node
    that forks the ranks srun's block distribution would have put there; any other shape, a task per rank."""
    from slurm_rl.launch.node import block_layout, tasks_per_node
    from slurm_rl.mux.launcher import node_step

    assert tasks_per_node("4(x2),3") == [4, 4, 3] and tasks_per_node("8") == [8]
    assert block_layout([4, 4]) == [0] * 4 + [1] * 4
    assert node_step(8, {"SLURM_TASKS_PER_NODE": "4(x2)"}) == [4, 4]
    assert node_step(8, {"SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_RL_FORKSERVER": "0"}) is None
    assert node_step(6, {"SLURM_TASKS_PER_NODE": "4(x2)"}) is None  # fewer ranks than tasks: srun places them
    assert node_step(7, {"SLURM_TASKS_PER_NODE": "4,3"}) is None  # unequal nodes: one --cpus-per-task fits none
    assert node_step(8, {}) is None


def test_node_task_kills_what_is_left_below_it() -> None:
    """A process whose parent ended (an orphan, as rank 0's coordinator is once rank 0 died) is still
    found below the node's task and killed with the rest."""
    script = textwrap.dedent("""
        import os, subprocess, sys, time
        from slurm_rl.launch.node import become_subreaper, descendants, kill_descendants

        assert become_subreaper()
        middle = subprocess.Popen([sys.executable, "-c", "import subprocess; print(subprocess.Popen(['sleep', '300']).pid)"],
                                  stdout=subprocess.PIPE, text=True)
        orphan = int(middle.stdout.readline())
        middle.wait()  # the sleep it started is now ours
        stay = subprocess.Popen(["sleep", "300"])
        assert {orphan, stay.pid} <= set(descendants(os.getpid())), (orphan, stay.pid)
        print(kill_descendants() == {orphan, stay.pid})
        stay.wait()
        _, status = os.waitpid(orphan, 0)
        print(os.waitstatus_to_exitcode(status), stay.returncode)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "-9", "-9"], out.stdout


def _info(rank: int, node: int, source: str = "slurm", nodes: int = 2) -> RankInfo:
    return RankInfo(rank=rank, world_size=6, local_rank=0, node_rank=node, num_nodes=nodes, host=f"n{node + 1}",
                    master_addr="127.0.0.1", master_port=1, job_id="1", source=source)


def test_each_rank_sees_its_own_accelerators() -> None:
    # 2 nodes x 4: actor one process per GPU on node 0, rollout 2 processes of 2 GPUs on node 1
    p = parse_placement({"actor": "0-3", "rollout": "4-7:0-1"}, 8, num_nodes=2)
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}  # Slurm's GRES list of the node
    assert bind_accelerators(p, _info(5, 1), env) == "2,3"
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_RL_SLOTS": "6,7"}
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}  # the list is read through, not assumed 0-based
    assert bind_accelerators(p, _info(4, 1), env) == "4,5" and env["SLURM_RL_SLOTS"] == "4,5"
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}  # local launcher: one machine, global slots
    assert bind_accelerators(p, _info(5, 0, source="local", nodes=1), env) == "6,7"
    env = {"CUDA_VISIBLE_DEVICES": "0"}  # fewer accelerators than the placement: left alone
    assert bind_accelerators(p, _info(5, 1), env) is None and env == {"CUDA_VISIBLE_DEVICES": "0"}
    # srun must put each rank on its placement's node
    assert check_node(p, _info(4, 1)) is None
    assert "placement puts it on node 1" in str(check_node(p, _info(4, 0)))
    assert rank_hosts(p, ["n1", "n2"]) == ["n1"] * 4 + ["n2"] * 2
    with pytest.raises(ValueError, match="spans 2 nodes"):
        rank_hosts(p, ["n1"])


@pytest.mark.slow
def test_local_launcher_gives_a_rank_two_gpus(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = emulated_config(run_dir, nodes=1, gpus_per_node=4, iterations=1)
    cfg["cluster"]["component_placement"] = {"actor": "0-1", "rollout": "2-3:0"}
    cfg["scheduler"] = {"policy": "static"}
    proc = subprocess.run([*CLI, "run", str(write_config(tmp_path / "c.yaml", cfg))],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "starting 3 ranks" in proc.stdout
    assert "[rank 2] slots [2, 3] CUDA_VISIBLE_DEVICES=2,3" in (run_dir / "logs" / "rank-0002.log").read_text()
    assert "[rank 1] slots [1] CUDA_VISIBLE_DEVICES=1" in (run_dir / "logs" / "rank-0001.log").read_text()


@pytest.mark.slow
@pytest.mark.slurm
def test_sbatch_rank_owning_two_gpus_sees_both(slurm_cluster, tmp_path: Path) -> None:
    """RLinf's "4-7:0-1": 2 rollout processes of 2 GPUs each on the job's second node; 4 actor ranks
    on its first (6 tasks over 2 nodes, placed by srun --distribution=arbitrary)."""
    run_dir = tmp_path / "run"
    cfg = emulated_config(run_dir, nodes=2, gpus_per_node=4, iterations=2)
    del cfg["cluster"]["gpus_per_node"]
    cfg["cluster"]["component_placement"] = {"actor": "0-3", "rollout": "4-7:0-1"}
    cfg["scheduler"] = {"policy": "static"}
    log = tmp_path / "job.out"
    rc, _ = slurm_cluster.sbatch_wait("--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4", f"--output={log}",
                                      "sbatch/train.sh", str(write_config(tmp_path / "c.yaml", cfg)), cwd=REPO)
    text = log.read_text() if log.exists() else ""
    assert rc == 0, text
    nodes = re.search(r"slurm_rl job \d+: 2 nodes, 8 tasks, nodes n\[(\d+)[-,](\d+)\]", text)
    assert nodes is not None, text
    first, second = (f"n{i}" for i in nodes.groups())  # the job's nodes, in Slurm's order
    for line in [f"[rank 4/6 host {second} source slurm]", "[rank 4] slots [4, 5] CUDA_VISIBLE_DEVICES=0,1",
                 f"[rank 5/6 host {second} source slurm]", "[rank 5] slots [6, 7] CUDA_VISIBLE_DEVICES=2,3",
                 f"[rank 0/6 host {first} source slurm]", "[rank 0] slots [0] CUDA_VISIBLE_DEVICES=0",
                 "[rank 3] slots [3] CUDA_VISIBLE_DEVICES=3"]:
        assert line in text, text
    # one srun task per node forked that node's ranks
    assert re.search(rf"slurm_rl node {first} \(pid \d+\): node 0, ranks \[0, 1, 2, 3\], device emulated", text), text
    assert re.search(rf"slurm_rl node {second} \(pid \d+\): node 1, ranks \[4, 5\], device emulated", text), text
    records = report_json(run_dir)["epochs"]
    assert records and all(r["acks"] == 6 for r in records), records
