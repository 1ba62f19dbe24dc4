"""Roles with emulated compute: real processes, files, epochs and Arrow batches; GPU work is a sleep.

Per iteration ``k`` (placement fixed at the iteration's gate):
- rollout: the lowest rollout rank publishes the iteration's requests as claimable pending work;
  every rollout rank claims chunks, "generates" them (cost model), and streams ``rollouts`` shards.
- inference: streams ``rollouts`` shards as they appear (round-robin by shard over the inference
  ranks) and writes ``inference`` shards with reference logprobs.
- actor: the lowest actor rank cuts the stream into mini-batches of ``train.global_batch_size``
  samples and publishes each as an ``actor_batch`` shard; every actor rank trains on its
  token-balanced data-parallel share of each mini-batch.
A rank holding several roles (collocated components) runs them one after the other.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slurm_rl.config import Config
from slurm_rl.control.epochs import Epoch
from slurm_rl.control.paths import RunPaths
from slurm_rl.data import emulated as fake
from slurm_rl.data.gc import collect_garbage
from slurm_rl.data.layout import expected_path
from slurm_rl.data.migration import claim_pending, write_pending
from slurm_rl.data.partition import take_dp_share
from slurm_rl.data.reader import StageReader
from slurm_rl.data.schemas import ACTOR_BATCH, INFERENCE, ROLLOUTS
from slurm_rl.data.writer import StageWriter, write_expected
from slurm_rl.engines.emulated import CostModel, emulate
from slurm_rl.launch.rank_env import RankInfo
from slurm_rl.worker.runtime import WorkerRuntime

ROLLOUTS_STAGE = "rollouts"
INFERENCE_STAGE = "inference"
ACTOR_STAGE = "actor_batch"


def _tokens(table: pa.Table, column: str = "response_ids") -> int:
    if table.num_rows == 0:
        return 0
    return int(pc.sum(pc.list_value_length(table.column(column))).as_py() or 0)


class EmulatedRoles:
    """The :class:`~slurm_rl.worker.runtime.Roles` of ``runtime.device: emulated``."""

    def __init__(self, cfg: Config, info: RankInfo, paths: RunPaths) -> None:
        self.cfg = cfg
        self.info = info
        self.paths = paths
        self.run_dir = paths.run_dir
        self.cost = CostModel.from_config(cfg.emulated)
        self.samples_per_iteration = cfg.train.rollout_batch_size * cfg.train.group_size
        self.poll = cfg.runtime.poll_interval_s
        self.timeout = cfg.runtime.wait_timeout_s
        mean, top = cfg.emulated.response_len_mean, cfg.emulated.response_len_max
        # Long-tailed response lengths (lognormal around the configured mean, capped).
        sigma = 0.8
        mu = float(np.log(max(1, mean))) - sigma**2 / 2
        self.response_len = lambda rng, n: np.clip(rng.lognormal(mu, sigma, n), 1, top).astype(np.int64)

    # -- epoch transitions ----------------------------------------------------------------------
    def transition(self, old: Epoch | None, new: Epoch, rt: WorkerRuntime) -> dict[str, Any]:
        """Emulate the actor reshard: ranks joining the actor receive their share of the state."""
        start = time.monotonic()
        rank = self.info.rank
        old_actor = set(old.ranks_of("actor")) if old else set()
        new_actor = set(new.ranks_of("actor"))
        received = 0
        if old is not None and old_actor != new_actor and rank in new_actor and rank not in old_actor:
            total = self.cost.reshard_bytes(len(old_actor), len(new_actor))
            joining = len(new_actor - old_actor)
            received = total // max(1, joining)
            emulate(self.cost.reshard_seconds(received * joining))
        released = bool(old is not None and rank in old_actor and rank not in new_actor)
        return {"bytes_moved": received, "seconds": time.monotonic() - start, "released_actor_state": released}

    # -- one iteration --------------------------------------------------------------------------
    def run_iteration(self, iteration: int, rt: WorkerRuntime) -> None:
        assert rt.epoch is not None
        epoch = rt.epoch
        for role in ("rollout", "inference", "actor"):
            if role in rt.roles:
                getattr(self, f"_{role}")(iteration, epoch, rt)

    def _rollout(self, k: int, epoch: Epoch, rt: WorkerRuntime) -> None:
        ranks = sorted(epoch.ranks_of("rollout"))
        rank = self.info.rank
        if rank == ranks[0]:
            prompts = fake.make_fake_prompts(k, self.cfg.train.rollout_batch_size, self.cfg.emulated.prompt_len, self.cfg.runtime.seed)
            requests = fake.make_fake_requests(prompts, self.cfg.train.group_size, seed=self.cfg.runtime.seed, weight_version=k)
            chunks = max(1, min(requests.num_rows, 4 * len(ranks)))
            write_pending(self.run_dir, k, rank, requests, num_chunks=chunks)
            write_expected(self.run_dir, k, ROLLOUTS_STAGE, ranks)
        else:
            self._wait_for(expected_path(self.run_dir, k, ROLLOUTS_STAGE), f"the requests of iteration {k} from rollout rank {ranks[0]}", rt)
        chunk = max(1, self.samples_per_iteration // (4 * len(ranks)))
        done = 0
        with StageWriter(self.run_dir, k, ROLLOUTS_STAGE, rank, ROLLOUTS) as writer:
            while True:
                rt.safe_point()
                requests = claim_pending(self.run_dir, k, rank, max_rows=chunk)
                if requests.num_rows == 0:
                    break
                rollouts = fake.finish_requests(
                    requests, self.response_len, seed=self.cfg.runtime.seed + k, weight_version=k, rollout_rank=rank
                )
                emulate(self.cost.share_seconds("rollout", _tokens(rollouts), len(ranks)))
                writer.write(rollouts)
                done += rollouts.num_rows
                rt.report("working", role="rollout", samples_done=done)

    def _inference(self, k: int, epoch: Epoch, rt: WorkerRuntime) -> None:
        ranks = sorted(epoch.ranks_of("inference"))
        rank = self.info.rank
        index = ranks.index(rank)
        if index == 0:
            write_expected(self.run_dir, k, INFERENCE_STAGE, ranks)
        reader = StageReader(self.run_dir, k, ROLLOUTS_STAGE, None, self.poll, self.timeout, on_poll=rt.safe_point)
        done = 0
        with StageWriter(self.run_dir, k, INFERENCE_STAGE, rank, INFERENCE) as writer:
            for n, shard in enumerate(reader.iter_entries()):
                if n % len(ranks) != index:
                    continue
                out = fake.make_fake_inference(shard.table, seed=self.cfg.runtime.seed + k, inference_rank=rank)
                emulate(self.cost.share_seconds("inference", _tokens(out) + _tokens(out, "prompt_ids"), len(ranks)))
                writer.write(out)
                done += out.num_rows
                rt.report("working", role="inference", samples_done=done)

    def _actor(self, k: int, epoch: Epoch, rt: WorkerRuntime) -> None:
        ranks = sorted(epoch.ranks_of("actor"))
        rank = self.info.rank
        dp_rank, dp = ranks.index(rank), len(ranks)
        gbs = self.cfg.train.global_batch_size
        source = INFERENCE_STAGE if epoch.ranks_of("inference") else ROLLOUTS_STAGE
        if dp_rank == 0:
            self._cut_minibatches(k, source, gbs, rt)
        reader = StageReader(self.run_dir, k, ACTOR_STAGE, [ranks[0]], self.poll, self.timeout, on_poll=rt.safe_point)
        started = time.monotonic()
        rewards: list[float] = []
        steps = 0
        for shard in reader.iter_entries():
            share = take_dp_share(shard.table, dp_rank, dp, group_column=None)
            emulate(self.cost.share_seconds("actor", _tokens(share) + _tokens(share, "prompt_ids"), dp))
            rewards.extend(shard.table.column("reward").to_pylist())
            steps += 1
            rt.report("working", role="actor", minibatches_done=steps)
        if dp_rank == 0:
            self._record_metrics(k, rewards, steps, time.monotonic() - started)
            collect_garbage(self.run_dir, consumed_through_iteration=k, keep_last=self.cfg.runtime.keep_iterations)

    def _cut_minibatches(self, k: int, source: str, gbs: int, rt: WorkerRuntime) -> None:
        """Leader: publish each run of ``gbs`` samples as one ``actor_batch`` shard, as they arrive."""
        reader = StageReader(self.run_dir, k, source, None, self.poll, self.timeout, on_poll=rt.safe_point)
        buffered: list[pa.Table] = []
        rows = 0
        with StageWriter(self.run_dir, k, ACTOR_STAGE, self.info.rank, ACTOR_BATCH) as writer:
            for shard in reader.iter_entries():
                table = shard.table
                if source == ROLLOUTS_STAGE:
                    table = fake.make_fake_inference(table, seed=k, inference_rank=self.info.rank)
                buffered.append(table)
                rows += table.num_rows
                while rows >= gbs:
                    merged = pa.concat_tables(buffered).combine_chunks()
                    writer.write(fake.make_actor_batch(merged.slice(0, gbs)))
                    rest = merged.slice(gbs)
                    buffered, rows = ([rest] if rest.num_rows else []), rest.num_rows
            if rows:
                raise RuntimeError(
                    f"iteration {k}: {rows} samples left over after cutting mini-batches of {gbs} "
                    f"(train.rollout_batch_size x train.group_size must be a multiple of train.global_batch_size)"
                )

    def _record_metrics(self, k: int, rewards: list[float], steps: int, seconds: float) -> None:
        row = {
            "iteration": k,
            "reward_mean": float(np.mean(rewards)) if rewards else None,
            "samples": len(rewards),
            "minibatches": steps,
            "seconds": seconds,
            "time": time.time(),
            "emulated": True,
        }
        fd = os.open(self.run_dir / "metrics.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (json.dumps(row) + "\n").encode())
        finally:
            os.close(fd)

    def _wait_for(self, path, what: str, rt: WorkerRuntime) -> None:
        deadline = time.monotonic() + self.timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.info.rank} (host {self.info.host}) waited {self.timeout:.0f}s for {what} ({path})")
            rt.safe_point()
            time.sleep(self.poll)

    def close(self) -> None:
        pass
