"""Roles with real engines (``runtime.device: cpu | cuda``): GRPO on a verifiable toy task.

Same flow as the emulated roles — epochs, gates, Arrow stages — with real compute:
- every rank joins one torch.distributed world (gloo on cpu, nccl on cuda); sub-groups are
  created by every rank in the same order when an epoch is applied (``GroupCache.ensure``);
- actor: megatron-core GPT trained by :class:`ActorTrainer` (DP over the actor ranks), resharded in
  place when an epoch changes the actor's ranks;
- rollout: an hf (or vllm) engine; at the start of each iteration the actor leader broadcasts its
  weights (converted to HF names) to the rollout ranks, so iteration ``k`` samples with version
  ``k`` (on-policy);
- inference: reference-policy logprobs from the frozen initial weights (rebuilt from the seed).
Epochs are applied at iteration gates.
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slurm_rl.config import Config
from slurm_rl.control.epochs import Epoch
from slurm_rl.control.paths import RunPaths
from slurm_rl.data.emulated import make_actor_batch
from slurm_rl.data.gc import collect_garbage
from slurm_rl.data.layout import expected_path
from slurm_rl.data.manifest import produced_rows
from slurm_rl.data.migration import claim_pending, write_pending
from slurm_rl.data.reader import StageReader
from slurm_rl.data.schemas import ACTOR_BATCH, INFERENCE, PENDING, ROLLOUTS, make_group_id, make_sample_id
from slurm_rl.data.writer import StageWriter, write_expected
from slurm_rl.launch.rank_env import RankInfo
from slurm_rl.metrics import append_metrics
from slurm_rl.worker.runtime import WorkerRuntime

ROLLOUTS_STAGE = "rollouts"
INFERENCE_STAGE = "inference"
ACTOR_STAGE = "actor_batch"


def init_world(info: RankInfo, device: str, timeout_s: float) -> None:
    """Join the allocation-wide torch.distributed world (gloo on cpu, nccl on cuda)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        import torch

        torch.cuda.set_device(info.local_rank % max(1, torch.cuda.device_count()))
    dist.init_process_group(
        backend,
        init_method=f"tcp://{info.master_addr}:{info.master_port}",
        rank=info.rank,
        world_size=info.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


class RealRoles:
    """The :class:`~slurm_rl.worker.runtime.Roles` of ``runtime.device: cpu | cuda``."""

    def __init__(self, cfg: Config, info: RankInfo, paths: RunPaths) -> None:
        import torch

        from slurm_rl.engines.actor.groups import GroupCache
        from slurm_rl.engines.actor.microbatch import BatchConfig
        from slurm_rl.engines.actor.optimizer import OptimConfig
        from slurm_rl.engines.model_config import ModelConfig
        from slurm_rl.rl.tasks import TaskConfig
        from slurm_rl.rl.tokenizer import CharTokenizer

        self.cfg, self.info, self.paths, self.run_dir = cfg, info, paths, paths.run_dir
        self.device = "cuda" if cfg.runtime.device == "cuda" else "cpu"
        torch.set_num_threads(int(cfg.actor.get("threads", 1)))
        init_world(info, cfg.runtime.device, cfg.runtime.wait_timeout_s)
        self.tok = CharTokenizer()
        self.task = TaskConfig(**dict(cfg.task))
        model = dict(cfg.model)
        model.setdefault("vocab_size", self.tok.vocab_size)
        self.model_cfg = ModelConfig.from_dict(model)
        actor = dict(cfg.actor)
        actor.pop("threads", None)
        self.optim_cfg = OptimConfig.from_dict(actor)
        self.batch_cfg = BatchConfig(
            global_batch_size=cfg.train.global_batch_size,
            micro_batch_size=cfg.train.micro_batch_size,
            max_tokens_per_microbatch=cfg.train.max_tokens_per_microbatch,
        )
        algo = dict(cfg.algorithm)
        self.clip_eps = float(algo.get("clip_eps", 0.2))
        self.kl_coef = float(algo.get("kl_coef", 0.0))
        self.temperature = float(algo.get("temperature", 1.0))
        self.backend = str(cfg.rollout.get("backend", "hf"))
        self.groups = GroupCache(timeout=cfg.runtime.wait_timeout_s)
        self.seed = cfg.runtime.seed
        self.trainer: Any = None
        self.engine: Any = None
        self.ref: Any = None
        self.sync_seconds = 0.0
        self.sync_bytes = 0

    # -- epoch transitions ----------------------------------------------------------------------
    @staticmethod
    def _sync_ranks(epoch: Epoch) -> list[int]:
        actor, rollout = epoch.ranks_of("actor"), epoch.ranks_of("rollout")
        return sorted({min(actor), *rollout})

    def transition(self, old: Epoch | None, new: Epoch, rt: WorkerRuntime) -> dict[str, Any]:
        """Create the epoch's groups (every rank, same order), reshard the actor, move engines."""
        from slurm_rl.engines.actor.groups import transition_rank_sets
        from slurm_rl.engines.actor.trainer import ActorTrainer

        start = time.perf_counter()
        rank = self.info.rank
        new_actor = sorted(new.ranks_of("actor"))
        old_actor = sorted(old.ranks_of("actor")) if old else []
        if old is not None and not rt.at_gate:
            # Mid-iteration: no process group may be created here (new_group is collective over the
            # world and other ranks may be inside a collective), so only rollout may shrink.
            self._check_mid_iteration(old, new)
        elif old is None or old_actor != new_actor:
            sets = [new_actor] if old is None else [list(s) for s in transition_rank_sets(old_actor, new_actor)]
            self.groups.ensure(sets, f"epoch {new.epoch}")
        figures: dict[str, Any] = {"bytes_moved": 0, "seconds": 0.0}
        if self.trainer is None:
            self.trainer = ActorTrainer(self.model_cfg, self.optim_cfg, self.batch_cfg, new_actor, self.groups,
                                        self.seed, self.device)
        elif old_actor != new_actor and rank in set(old_actor) | set(new_actor):
            moved = self.trainer.reshard(new_actor, epoch=new.epoch)
            figures["bytes_moved"] = int(moved.get("bytes_received", 0))
            figures["reshard_seconds"] = moved.get("seconds", 0.0)
        roles = set(new.role_of(rank))
        if "rollout" in roles and self.engine is None:
            from slurm_rl.engines.rollout import make_rollout_engine

            self.engine = make_rollout_engine(self.backend, self.model_cfg, device=self.device, seed=self.seed,
                                              pad_id=self.tok.pad_id)
        elif "rollout" not in roles and self.engine is not None:
            self.engine.release()
            self.engine = None
        if "inference" in roles and self.ref is None:
            self.ref = self._reference_scorer()
        elif "inference" not in roles:
            self.ref = None
        figures["seconds"] = time.perf_counter() - start
        return figures

    @staticmethod
    def _check_mid_iteration(old: Epoch, new: Epoch) -> None:
        changed = [c for c in ("actor", "inference") if sorted(old.ranks_of(c)) != sorted(new.ranks_of(c))]
        grown = set(new.ranks_of("rollout")) - set(old.ranks_of("rollout"))
        if changed or grown:
            raise RuntimeError(
                f"epoch {new.epoch} changes {', '.join(changed) or 'rollout (grows by ' + str(sorted(grown)) + ')'} "
                "mid-iteration; with real engines such changes apply at iteration gates only "
                "(mid-iteration epochs may only release rollout ranks)")

    def _reference_scorer(self) -> Any:
        """The frozen initial policy: every rank builds the same weights from the seed."""
        from slurm_rl.engines.actor.model import build_gpt_model
        from slurm_rl.engines.inference import ReferenceScorer

        initial = build_gpt_model(self.model_cfg, self.seed, "cpu")
        return ReferenceScorer(self.model_cfg, initial.named_parameters(), device=self.device)

    # -- one iteration --------------------------------------------------------------------------
    def run_iteration(self, iteration: int, rt: WorkerRuntime) -> None:
        assert rt.epoch is not None
        epoch = rt.epoch
        self.iteration_started = time.time()
        # Counters the live coordinator reads (scheduler/live_state.py); every report carries them.
        rt.counters.update({"rollout_finished": 0, "rollout_running": 0, "migrated_out": 0, "inference_done": 0,
                            "actor_minibatches_done": 0, "actor_busy": False})
        # Every rank, same order, right after the gate: the group of this iteration's weight sync.
        self.groups.ensure([self._sync_ranks(epoch)], f"iteration {iteration} weight sync")
        self._sync_weights(iteration, epoch)
        for role in ("rollout", "inference", "actor"):
            if role in rt.roles:
                getattr(self, f"_{role}")(iteration, epoch, rt)

    def _sync_weights(self, k: int, epoch: Epoch) -> None:
        """Actor leader -> rollout ranks: weights of version ``k`` (after ``k`` actor iterations)."""
        from slurm_rl.engines.convert import megatron_to_hf
        from slurm_rl.engines.weight_sync import broadcast_weights

        ranks = self._sync_ranks(epoch)
        rank = self.info.rank
        if rank not in ranks:
            return
        src = min(epoch.ranks_of("actor"))
        named = megatron_to_hf(self.trainer.named_parameters_for_sync(), self.model_cfg) if rank == src else None
        received, stats = broadcast_weights(
            named, src, self.groups.get(ranks, "weight sync"), timeout=self.cfg.runtime.wait_timeout_s,
            what=f"weight sync v{k}",
        )
        if self.engine is not None and rank != src:
            self.engine.update_weights(received, version=k)
        self.sync_seconds = float(getattr(stats, "seconds", 0.0))
        self.sync_bytes = int(getattr(stats, "bytes", 0))

    def _publish_requests(self, k: int, ranks: list[int]) -> None:
        """Rollout leader: the iteration's prompts, ``group_size`` requests each, as claimable work."""
        from slurm_rl.rl.tasks import sample_problems

        g = self.cfg.train.group_size
        problems = sample_problems(self.task, self.tok, self.seed, k, self.cfg.train.rollout_batch_size)
        rows = []
        for p_idx, prob in enumerate(problems):
            for j in range(g):
                sid = make_sample_id(k, p_idx, j, g)
                rows.append({
                    "sample_id": sid, "group_id": make_group_id(k, p_idx), "sample_index": j,
                    "prompt_ids": prob.prompt_ids, "prompt_text": prob.prompt, "partial_response_ids": [],
                    "partial_logprobs": [], "seed": (self.seed * 1_000_003 + sid) % (2**62), "step": 0,
                    "weight_version": k, "metadata_json": json.dumps({"target": prob.target}),
                })
        table = pa.Table.from_pylist(rows, schema=PENDING)
        write_pending(self.run_dir, k, self.info.rank, table, num_chunks=max(1, min(len(rows) // g, 4 * len(ranks))))
        write_expected(self.run_dir, k, ROLLOUTS_STAGE, ranks)

    def _rollout(self, k: int, epoch: Epoch, rt: WorkerRuntime) -> None:
        """Claim request chunks and generate them; a rank released mid-iteration hands back the rest."""
        ranks = sorted(epoch.ranks_of("rollout"))
        rank = self.info.rank
        if rank == ranks[0]:
            self._publish_requests(k, ranks)
        else:
            path = expected_path(self.run_dir, k, ROLLOUTS_STAGE)
            rt.wait_for(path.exists, f"the requests of iteration {k} from rollout rank {ranks[0]} ({path})")
        samples = self.cfg.train.rollout_batch_size * self.cfg.train.group_size
        chunk = max(1, samples // (4 * len(ranks)))
        sub_batch = max(1, int(self.cfg.rollout.get("sub_batch", chunk)))
        done = 0
        with StageWriter(self.run_dir, k, ROLLOUTS_STAGE, rank, ROLLOUTS) as writer:
            while "rollout" in rt.roles:
                requests = claim_pending(self.run_dir, k, rank, max_rows=chunk)
                if requests.num_rows == 0:
                    if produced_rows(self.run_dir, k, ROLLOUTS_STAGE, ranks) >= samples:
                        break  # every sample of the iteration exists (migrated ones included)
                    time.sleep(self.cfg.runtime.poll_interval_s)
                    rt.safe_point()
                    continue
                rows = requests.to_pylist()
                for start in range(0, len(rows), sub_batch):
                    # The safe point comes before each sub-batch, so a release always finds the
                    # claimed requests it has not started (at least this sub-batch) to hand back.
                    rt.safe_point()
                    if "rollout" not in rt.roles:  # released: the unstarted requests migrate
                        rest = pa.Table.from_pylist(rows[start:], schema=PENDING)
                        write_pending(self.run_dir, k, rank, rest, tag=rt.epoch.epoch if rt.epoch else 0,
                                      num_chunks=max(1, min(len(rows) - start, len(ranks))))
                        rt.counters.update(rollout_running=0, migrated_out=rt.counters["migrated_out"] + len(rows) - start)
                        rt.report("working", role="rollout")
                        break
                    batch = rows[start:start + sub_batch]
                    rt.counters.update(rollout_running=len(rows) - start)
                    writer.write(self._generate(k, batch))
                    done += len(batch)
                    rt.counters.update(rollout_finished=done, rollout_running=len(rows) - start - len(batch))
                    rt.report("working", role="rollout")

    def _generate(self, k: int, rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
        """Generate one batch of requests; the ROLLOUTS columns with rewards."""
        from slurm_rl.engines.rollout import SamplingParams
        from slurm_rl.rl.tasks import score_answer

        rank = self.info.rank
        t0 = time.time()
        sampling = SamplingParams(
            max_new_tokens=self.task.max_new_tokens, temperature=self.temperature,
            seed=int(rows[0]["seed"]) % (2**31), stop_token_ids=(self.tok.eos_id,),
        )
        gens = self.engine.generate([r["prompt_ids"] for r in rows], sampling)
        t1 = time.time()
        versions = sorted({g.weight_version for g in gens})
        if versions != [k]:
            raise RuntimeError(f"rank {rank}: iteration {k} sampled with weight versions {versions}, "
                               f"expected {k} (on-policy)")
        return {
            "sample_id": [r["sample_id"] for r in rows], "group_id": [r["group_id"] for r in rows],
            "sample_index": [r["sample_index"] for r in rows], "prompt_ids": [r["prompt_ids"] for r in rows],
            "prompt_text": [r["prompt_text"] for r in rows],
            "response_ids": [g.token_ids for g in gens], "sampled_logprobs": [g.logprobs for g in gens],
            "reward": [score_answer(g.token_ids, json.loads(r["metadata_json"])["target"], self.tok)
                       for g, r in zip(gens, rows)],
            "finish_reason": [g.finish_reason for g in gens], "weight_version": [g.weight_version for g in gens],
            "rollout_rank": [rank] * len(rows), "t_start": [t0] * len(rows), "t_end": [t1] * len(rows),
        }

    def _inference(self, k: int, epoch: Epoch, rt: WorkerRuntime) -> None:
        ranks = sorted(epoch.ranks_of("inference"))
        rank = self.info.rank
        index = ranks.index(rank)
        if index == 0:
            write_expected(self.run_dir, k, INFERENCE_STAGE, ranks)
        reader = StageReader(self.run_dir, k, ROLLOUTS_STAGE, None, self.cfg.runtime.poll_interval_s,
                             self.cfg.runtime.wait_timeout_s, on_poll=rt.safe_point)
        done = 0
        with StageWriter(self.run_dir, k, INFERENCE_STAGE, rank, INFERENCE) as writer:
            for n, shard in enumerate(reader.iter_entries()):
                if n % len(ranks) != index:
                    continue
                table = shard.table
                prompts = table.column("prompt_ids").to_pylist()
                responses = table.column("response_ids").to_pylist()
                scores = self.ref.score([p + r for p, r in zip(prompts, responses)])
                ref = [s[len(p) - 1:].tolist() for s, p in zip(scores, prompts)]
                cols = {name: table.column(name) for name in ROLLOUTS.names}
                cols.update(ref_logprobs=pa.array(ref, pa.list_(pa.float32())),
                            values=pa.nulls(table.num_rows, pa.list_(pa.float32())),
                            inference_rank=pa.array([rank] * table.num_rows, pa.int32()))
                writer.write(pa.table(cols, schema=INFERENCE))
                done += table.num_rows
                rt.counters.update(inference_done=done)
                rt.report("working", role="inference")

    def _actor(self, k: int, epoch: Epoch, rt: WorkerRuntime) -> None:
        from slurm_rl.engines.actor.microbatch import shard_for_rank

        ranks = sorted(epoch.ranks_of("actor"))
        rank = self.info.rank
        dp_rank, dp = ranks.index(rank), len(ranks)
        if dp_rank == 0:
            self._cut_minibatches(k, epoch, rt)
        reader = StageReader(self.run_dir, k, ACTOR_STAGE, [ranks[0]], self.cfg.runtime.poll_interval_s,
                             self.cfg.runtime.wait_timeout_s, on_poll=rt.safe_point)
        stats: list[dict[str, float]] = []
        rewards: list[float] = []
        kls: list[float] = []
        tokens = 0
        train_s = 0.0
        for step, shard in enumerate(reader.iter_entries()):
            rows = shard.table.to_pylist()
            mine = shard_for_rank(rows, dp_rank, dp)
            t0 = time.perf_counter()
            rt.counters.update(actor_busy=True)
            rt.report("working", role="actor")
            stats.append(self.trainer.train_step([self._sample(r) for r in mine], self._loss_fn()))
            train_s += time.perf_counter() - t0
            rewards.extend(r["reward"] for r in rows)
            kls.extend(_k3(r["old_logprobs"], r["ref_logprobs"]) for r in rows)
            tokens += sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
            rt.counters.update(actor_busy=False, actor_minibatches_done=step + 1)
            rt.report("working", role="actor")
        if dp_rank == 0:
            seconds = time.time() - self.iteration_started
            append_metrics(self.run_dir, {
                "iteration": k, "reward_mean": float(np.mean(rewards)) if rewards else None,
                "kl": float(np.mean(kls)) if kls else None,
                "loss": float(np.mean([s["loss"] for s in stats])) if stats else None,
                "lr": stats[-1]["lr"] if stats else None, "samples": len(rewards), "minibatches": len(stats),
                "consumed_samples": stats[-1]["consumed_samples"] if stats else None,
                "seconds": seconds, "train_s": train_s, "sync_s": self.sync_seconds, "sync_bytes": self.sync_bytes,
                "tokens_per_s": tokens / seconds if seconds > 0 else None,
                "actor_dp": dp, "time": time.time(),
            })
            collect_garbage(self.run_dir, consumed_through_iteration=k, keep_last=self.cfg.runtime.keep_iterations)

    def _sample(self, row: dict[str, Any]) -> dict[str, Any]:
        """One trainer sample: prompt+response ids with per-token fields in next-token layout."""
        prompt, response = row["prompt_ids"], row["response_ids"]
        width = len(prompt) + len(response) - 1
        start = len(prompt) - 1

        def place(values: list[float]) -> list[float]:
            out = [0.0] * width
            out[start:start + len(values)] = values
            return out

        mask = place([1.0] * len(response))
        return {"input_ids": prompt + response, "loss_mask": mask, "old_logprobs": place(row["old_logprobs"]),
                "ref_logprobs": place(row["ref_logprobs"]), "advantages": [row["advantage"] * m for m in mask]}

    def _loss_fn(self) -> Any:
        from slurm_rl.rl.grpo import grpo_token_loss

        clip, kl = self.clip_eps, self.kl_coef

        def loss(logprobs: Any, batch: dict[str, Any]) -> Any:
            return grpo_token_loss(logprobs, batch["old_logprobs"], batch["advantages"],
                                   clip_eps=clip, ref_logprobs=batch["ref_logprobs"], kl_coef=kl)

        return loss

    def _cut_minibatches(self, k: int, epoch: Epoch, rt: WorkerRuntime) -> None:
        """Actor leader: publish runs of whole groups, ``global_batch_size`` samples each, as they arrive."""
        source = INFERENCE_STAGE if epoch.ranks_of("inference") else ROLLOUTS_STAGE
        if source == ROLLOUTS_STAGE:
            raise RuntimeError(f"iteration {k}: the real roles need an inference component for reference logprobs")
        g, gbs = self.cfg.train.group_size, self.cfg.train.global_batch_size
        reader = StageReader(self.run_dir, k, source, None, self.cfg.runtime.poll_interval_s,
                             self.cfg.runtime.wait_timeout_s, on_poll=rt.safe_point)
        partial: dict[int, list[pa.Table]] = {}
        ready: list[pa.Table] = []
        ready_rows = 0
        with StageWriter(self.run_dir, k, ACTOR_STAGE, self.info.rank, ACTOR_BATCH) as writer:
            for shard in reader.iter_entries():
                table = shard.table
                for gid in pc.unique(table.column("group_id")).to_pylist():
                    part = table.filter(pc.equal(table.column("group_id"), gid))
                    partial.setdefault(gid, []).append(part)
                    if sum(t.num_rows for t in partial[gid]) == g:
                        ready.extend(partial.pop(gid))
                        ready_rows += g
                while ready_rows >= gbs:
                    merged = pa.concat_tables(ready).combine_chunks()
                    writer.write(make_actor_batch(merged.slice(0, gbs)))
                    rest = merged.slice(gbs)
                    ready, ready_rows = ([rest] if rest.num_rows else []), rest.num_rows
            if ready_rows or partial:
                raise RuntimeError(f"iteration {k}: {ready_rows} samples and {len(partial)} incomplete groups left "
                                   f"after cutting mini-batches of {gbs}")

    def close(self) -> None:
        import torch.distributed as dist

        if self.engine is not None:
            self.engine.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _k3(sampled: list[float], ref: list[float]) -> float:
    """Mean k3 estimate of KL(rollout policy || reference) over a response's tokens."""
    if not sampled:
        return 0.0
    d = np.asarray(ref, dtype=np.float64) - np.asarray(sampled, dtype=np.float64)
    return float(np.mean(np.exp(d) - d - 1.0))
