"""Compute with the calibrated cost model (``runtime.device: emulated``): no torch, no engines.

Work is timed, not done: a call returns synthetic Arrow rows and the wall time at which a GPU
would have finished them (the simulator's laws, ``slurm_rl.engines.emulated``). Response lengths
follow ``slurm_rl.scheduler.lengths.LengthModel`` with the simulator's seed and draw order, so an
emulated run and ``slurm-rl simulate`` see the same workload.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from slurm_rl.config import Config, actor_offloads, critic_tp
from slurm_rl.control.epochs import Epoch
from slurm_rl.data import emulated as fake
from slurm_rl.data.schemas import ID_STRIDE, count_tokens
from slurm_rl.engines.emulated import DecodeBatch, emulate
from slurm_rl.launch.rank_env import RankInfo
from slurm_rl.rl.advantages import needs_critic
from slurm_rl.scheduler.cost_model import BYTES_PER_PARAM_STATE, CostModel
from slurm_rl.scheduler.lengths import LengthModel


def iteration_lengths(model: LengthModel, seed: int, iteration: int, n: int) -> np.ndarray:
    """Response lengths of the ``n`` requests of ``iteration`` (the simulator's draw order)."""
    rng = random.Random(seed)
    lengths: list[int] = []
    for _ in range(iteration + 1):
        lengths = model.sample(rng, n)
    return np.asarray(lengths, dtype=np.int64)


class EmulatedDecoder:
    """Continuous batching in virtual time: per-request decode steps (``DecodeBatch``)."""

    def __init__(self, compute: "EmulatedCompute", k: int) -> None:
        self.c, self.k = compute, k  # the weights' version (the samples may be of iterations ahead: async RL)
        self.version = k  # the weights' version now (partial rollout: later ones land while requests decode)
        self.batch = DecodeBatch(compute.cost, compute.rollout_tp, compute.max_running)
        self.rows: dict[int, pa.Table] = {}  # running sample id -> its request row
        self.first: dict[int, int] = {}  # running sample id -> the version that drew its first token here
        self.early: list[pa.Table] = []  # finished before weights landed, not returned yet
        # per (iteration, generation batch) the response lengths: the first batch's as the simulator draws them,
        # dynamic sampling's later ones their own draws
        self.drawn: dict[tuple[int, int], np.ndarray] = {}

    def _length(self, sid: int) -> int:
        j, index = divmod(sid, ID_STRIDE)
        block, i = divmod(index, self.c.samples)
        if (j, block) not in self.drawn:
            if block == 0:
                lengths = iteration_lengths(self.c.lengths, self.c.scheduler_seed, j, self.c.samples)
            else:
                rng = random.Random(f"{self.c.scheduler_seed}/{j}/{block}")
                lengths = self.c.lengths.sample(rng, self.c.samples)
            self.drawn[j, block] = np.asarray(lengths, dtype=np.int64)
        return int(self.drawn[j, block][i])

    def free_slots(self) -> int:
        return self.batch.free_slots

    def held(self) -> int:
        return len(self.batch.running)

    def admit(self, requests: pa.Table, now: float) -> None:
        steps = requests.column("step").to_pylist()
        for i, sid in enumerate(requests.column("sample_id").to_pylist()):
            self.rows[sid] = requests.slice(i, 1)
            self.first[sid] = self.version
            self.batch.admit(sid, int(steps[i]), self._length(sid), now)

    def _take(self, sids: list[int]) -> pa.Table:
        return pa.concat_tables([self.rows.pop(s) for s in sids]).combine_chunks()

    @property
    def lands_between_tokens(self) -> bool:
        return False  # virtual time: weights land at the wall time the protocol sees them, between any steps

    def land(self, version: int, now: float) -> None:
        finished = self.advance(now)
        if finished is not None:
            self.early.append(finished)
        self.version = version

    def advance(self, now: float) -> pa.Table | None:
        done = self.batch.advance(now)
        early, self.early = self.early, []
        if not done:
            return pa.concat_tables(early) if early else None
        parts = []
        for j in sorted({s // ID_STRIDE for s in done}):  # each iteration's samples seeded by it, whatever the version
            sids = [s for s in done if s // ID_STRIDE == j]
            targets = np.asarray([self._length(s) for s in sids], dtype=np.int64)
            table = fake.finish_requests(self._take(sids), targets, seed=self.c.seed + j, weight_version=self.k,
                                         rollout_rank=self.c.rank)
            first = pa.array([self.first.pop(s) for s in sids], pa.int64())
            table = table.set_column(table.schema.get_field_index("weight_version"), "weight_version", first)
            last = pa.array(np.full(len(sids), self.version, np.int64))
            parts.append(table.set_column(table.schema.get_field_index("weight_version_last"), "weight_version_last",
                                          last))
        out = pa.concat_tables(early + parts) if len(early + parts) > 1 else parts[0]
        if self.c.reward_apart:  # the reward ranks score them (EmulatedCompute.reward)
            out = out.set_column(out.schema.get_field_index("reward"), "reward",
                                 pa.array(np.full(out.num_rows, np.nan, np.float32)))
        return out

    def next_event_at(self) -> float | None:
        return self.batch.next_finish_at()

    def step_seconds(self) -> float | None:
        return self.batch.step_seconds()

    def evict(self, now: float, epoch: int) -> tuple[pa.Table | None, pa.Table | None]:
        finished = self.advance(now)
        generated = self.batch.evict_all()
        if not generated:
            return finished, None
        sids = list(generated)
        for s in sids:
            self.first.pop(s, None)
        requests = self._take(sids)
        have = requests.column("step").to_numpy().astype(np.int64)
        new = np.asarray([max(0, generated[s] - int(h)) for s, h in zip(sids, have)], dtype=np.int64)
        return finished, fake.advance_requests(requests, new, seed=self.c.seed + epoch)


class EmulatedCompute:
    """The :class:`~slurm_rl.worker.compute.Compute` of the cost model."""

    def __init__(self, cfg: Config, info: RankInfo) -> None:
        e = cfg.emulated
        self.cfg, self.rank = cfg, info.rank
        self.cost = CostModel.from_config(e)
        self.seed = cfg.runtime.seed
        self.scheduler_seed = int(cfg.scheduler.seed)
        self.samples = cfg.train.rollout_batch_size * cfg.train.group_size
        self.lengths = LengthModel(mean=float(e.response_len_mean), max_len=int(e.response_len_max),
                                   dist=e.response_len_dist, sigma=float(e.response_len_sigma),
                                   alpha=float(e.response_len_alpha))
        self.max_running = int(cfg.scheduler.max_running_requests)
        self.rollout_tp = int(cfg.scheduler.rollout_ranks_per_instance)
        self.actor_tp = int(cfg.scheduler.actor_ranks_per_instance)
        self.inference_busy_until = 0.0
        self.reward_apart = bool(cfg.placement.reward_ranks)  # the reward placed on ranks of its own

    def on_roles(self, old: Epoch | None, new: Epoch) -> dict[str, Any]:
        return {}

    def requests(self, k: int, batch: int = 0, position: int | None = None) -> pa.Table:
        from slurm_rl.rl.filter_groups import prompts_per_batch

        cfg = self.cfg
        n = prompts_per_batch(cfg)  # synthetic prompts: a batch's own, whatever its stream position
        prompts = fake.make_fake_prompts(k, n, cfg.emulated.prompt_len, cfg.runtime.seed, first_index=batch * n)
        return fake.make_fake_requests(prompts, cfg.train.group_size, seed=cfg.runtime.seed, weight_version=k)

    def decoder(self, k: int, landing: Callable[[], None] | None = None) -> EmulatedDecoder:
        return EmulatedDecoder(self, k)

    def reward(self, k: int, rollouts: pa.Table, requests: pa.Table) -> pa.Table:
        rewards = fake.sample_rewards(rollouts.column("sample_id").to_numpy(), self.seed + k)  # as the rollout's
        return rollouts.set_column(rollouts.schema.get_field_index("reward"), "reward", pa.array(rewards))

    def score(self, k: int, rollouts: pa.Table, now: float, share_ranks: int) -> tuple[pa.Table, float]:
        out = fake.make_fake_inference(rollouts, seed=self.seed + k, inference_rank=self.rank,
                                       with_values=needs_critic(self.cfg.algorithm))
        seconds = self.cost.share_seconds("inference", count_tokens(out) + count_tokens(out, "prompt_ids"), share_ranks)
        self.inference_busy_until = max(now, self.inference_busy_until) + seconds
        return out, self.inference_busy_until

    def reshard(self, old: list[int], new: list[int], epoch: int, old_tp: int = 1, new_tp: int = 1
                ) -> dict[str, Any]:
        nbytes = self.cost.reshard_bytes(len(old) // max(old_tp, self.actor_tp), len(new) // max(new_tp, self.actor_tp))
        joiners = set(new) - set(old)
        received = nbytes // max(1, len(joiners)) if self.rank in joiners else 0
        return {"bytes_moved": nbytes, "bytes_received": received, "seconds": self.cost.transfer_seconds(nbytes)}

    def sync_weights(self, k: int, src: int, ranks: list[int], gather: list[int] | None = None,
                     in_place: bool = False, sharded: list[list[int]] | None = None) -> dict[str, Any]:
        return {}

    def land_weights(self, version: int, src: int, ranks: list[int], gather: list[int]) -> dict[str, Any]:
        return {}

    def switch_phase(self, phase: str) -> dict[str, Any]:
        """Where ``actor.offload_*`` parks the actor, its share of the state moves to host memory or back:
        the cost model's ``offload_seconds`` (the simulator's collocated mode charges the same)."""
        if not actor_offloads(self.cfg):
            return {"phase": phase, "bytes": 0, "seconds": 0.0}
        nbytes = self.cost.model_params * BYTES_PER_PARAM_STATE // max(1, self.actor_tp)
        return {"phase": phase, "bytes": nbytes, "seconds": emulate(self.cost.offload_seconds(self.actor_tp))}

    def predict_switch_seconds(self) -> float:
        return self.cost.offload_seconds(self.actor_tp) if actor_offloads(self.cfg) else 0.0

    def predict_train_seconds(self, tokens: int, old: list[int], new: list[int]) -> float:
        reshard = 0.0
        if old and new and sorted(old) != sorted(new):  # the simulator's law, paid by the next mini-batch
            reshard = self.cost.reshard_seconds(len(old) // self.actor_tp, len(new) // self.actor_tp)
        return reshard + self.cost.seconds("actor", tokens, len(new) // self.actor_tp)

    def train(self, k: int, index: int, batch: pa.Table, ranks: list[int], ready_at: float | None
              ) -> tuple[float, dict[str, Any]]:
        assert ready_at is not None  # stamped by the cutter from predict_train_seconds
        return ready_at, {}

    def sync_critic(self, k: int, src: int, ranks: list[int], gather: list[int]) -> dict[str, Any]:
        return {}

    def train_critic(self, k: int, index: int, batch: pa.Table, ranks: list[int]) -> tuple[float, dict[str, Any]]:
        """The critic's step costs what the actor's does at the same DP size (the same architecture)."""
        tokens = count_tokens(batch, "response_ids") + count_tokens(batch, "prompt_ids")
        return time.time() + self.cost.seconds("actor", tokens, max(1, len(ranks) // critic_tp(self.cfg))), {}

    def _switch(self) -> dict[str, Any]:
        """A warm switch costs ``mux.park_s`` (calibrated; the group file's ``park_s``)."""
        seconds = emulate(float(self.cfg.mux.park_s))
        return {"seconds": seconds, "bytes": self.cost.model_params * BYTES_PER_PARAM_STATE}

    def park(self) -> dict[str, Any]:
        return self._switch()

    def unpark(self) -> dict[str, Any]:
        return self._switch()

    def evaluate(self, k: int) -> dict[str, Any] | None:
        return None  # emulated runs read no validation files

    def save_state(self, directory: Path, iteration: int) -> None:
        pass  # the cost model has no state: a checkpoint is the manifest (iteration, epoch, metrics)

    def load_state(self, directory: Path) -> None:
        pass

    def close(self, finished: bool = True) -> None:
        pass
