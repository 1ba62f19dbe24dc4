"""Compute with the real engines (``runtime.device: cpu | cuda``): GRPO on a prompt dataset.

- every rank joins one torch.distributed world (gloo on cpu, nccl on cuda); sub-groups are
  created by their members only when first used (``engines.actor.groups``), so a reshard at a
  mini-batch boundary involves only the ranks it moves;
- actor: megatron-core GPT trained by :class:`ActorTrainer` (DP over the actor ranks), resharded
  in place; a rank that may join the actor holds a warm model skeleton (dynamic policies;
  ``actor.warm_joiners: false`` saves that memory at the cost of a build on the critical path);
- rollout: an hf (or vllm) engine, sampling each request with its own seed (batch-invariant, so
  migration does not change a sample); parked while the rank serves another role, woken without
  a rebuild when it returns;
- the model is ``model.path`` (a Hugging Face checkpoint every engine loads) or a random model of
  the ``model`` sizes; prompts come from ``data.train_files`` (``rl.dataset``: the prompts of an
  iteration are a pure function of (seed, iteration)); rewards run in worker processes (``rewards``);
- inference: reference-policy logprobs from the frozen initial weights (the checkpoint, or the
  random init rebuilt from the seed);
- at the end the actor is saved to ``RUN_DIR/checkpoints/final`` (``engines.actor.checkpoint``).
Calls block; the protocol's next pass is the next safe point.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from slurm_rl.config import Config, actor_offloads, actor_precision, critic_tp
from slurm_rl.control.epochs import Epoch
from slurm_rl.control.paths import RunPaths
from slurm_rl.data.schemas import ID_STRIDE, PENDING, ROLLOUTS, inference_table, make_group_id, make_sample_id
from slurm_rl.launch.rank_env import RankInfo
from slurm_rl.resume.checkpoints import ACTOR_DIR, CRITIC_DIR
from slurm_rl.rl.advantages import needs_critic
from slurm_rl.scheduler.live_state import start_placement
from slurm_rl.worker.errors import ProtocolError


def init_world(info: RankInfo, device: str, timeout_s: float, gpu: int | None = None) -> None:
    """Join the allocation-wide torch.distributed world (gloo on cpu, nccl on cuda); on cuda the
    rank uses GPU ``gpu`` (default: its local rank)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        import torch

        if gpu is None:  # the worker narrowed CUDA_VISIBLE_DEVICES to the rank's own GPUs: the first
            gpu = 0 if os.environ.get("SLURM_RL_SLOTS") else info.local_rank
        torch.cuda.set_device(gpu % max(1, torch.cuda.device_count()))
    dist.init_process_group(
        backend,
        init_method=f"tcp://{info.master_addr}:{info.master_port}",
        rank=info.rank,
        world_size=info.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def _group_gpu(cfg: Config, info: RankInfo) -> int | None:
    """Inside a co-execution group a rank computes on the GPU of its group slot (the slot every
    member's rank on it time-shares): slot modulo ``group.gpus_per_node``."""
    if cfg.mux.group_dir is None:
        return None
    from pathlib import Path

    from slurm_rl.mux.group_state import read_group_json

    group = read_group_json(Path(cfg.mux.group_dir))
    _, slot = group["jobs"][cfg.mux.job]["rank_slots"][str(info.rank)]
    return int(slot) % int(group.get("gpus_per_node", 8))


def engine_model_config(cfg: Config, vocab_size: int) -> Any:
    """The engines' ``ModelConfig``: ``model.path``'s config.json, or the ``model`` sizes of a
    random model (``vocab_size`` when the section's is null)."""
    from slurm_rl.config import model_sizes
    from slurm_rl.engines.model_config import ModelConfig

    if cfg.model.path is not None:
        from slurm_rl.engines.hf_checkpoint import model_config_from_dir

        return model_config_from_dir(cfg.model.path)
    fields = {k: v for k, v in model_sizes(cfg.model).items() if v is not None}
    fields["vocab_size"] = fields.get("vocab_size") or vocab_size
    return ModelConfig(**fields)


def engine_optim_config(cfg: Config) -> Any:
    """The actor's ``OptimConfig`` of the validated ``actor`` section (its optimizer keys)."""
    import dataclasses

    from slurm_rl.engines.actor.optimizer import OptimConfig

    section = dataclasses.asdict(cfg.actor)
    return OptimConfig(**{f.name: section[f.name] for f in dataclasses.fields(OptimConfig)})


def critic_optim_config(cfg: Config) -> Any:
    """The critic's ``OptimConfig``: the actor's optimizer keys with ``critic.lr`` (null: ``actor.lr``)."""
    import dataclasses

    optim = engine_optim_config(cfg)
    return optim if cfg.critic.lr is None else dataclasses.replace(optim, lr=cfg.critic.lr,
                                                                  min_lr=min(optim.min_lr, cfg.critic.lr))


def data_spec(cfg: Config) -> Any:
    """The ``rl.dataset.DataSpec`` of the validated ``data`` section."""
    from slurm_rl.rl.dataset import DataSpec

    d = cfg.data
    return DataSpec(train_files=tuple(d.train_files), val_files=tuple(d.val_files), prompt_key=d.prompt_key,
                    answer_key=d.answer_key, apply_chat_template=d.apply_chat_template,
                    max_prompt_length=d.max_prompt_length, overlong=d.overlong, shuffle=d.shuffle)


class RealDecoder:
    """Synchronous generation: admitted requests are generated as one sub-batch by ``advance``.

    Nothing is ever half-generated between calls, so an eviction hands back whole requests.
    """

    def __init__(self, compute: "RealCompute", k: int, sub_batch: int, landing: Callable[[], None] | None = None
                 ) -> None:
        if compute.engine is None:
            raise ProtocolError(f"rank {compute.rank}: rollout in iteration {k} without a rollout engine")
        if compute.engine.weight_version != k:
            raise ProtocolError(f"rank {compute.rank}: rollout engine holds weights v{compute.engine.weight_version}, "
                                f"iteration {k} needs v{k} (on-policy)")
        self.c, self.k, self.sub_batch = compute, k, sub_batch
        self.landing = landing  # partial rollout: called at each token boundary (the next weights may land)
        self.admitted: pa.Table | None = None

    def free_slots(self) -> int:
        return 0 if self.admitted is not None else self.sub_batch

    def held(self) -> int:
        return 0 if self.admitted is None else self.admitted.num_rows

    def admit(self, requests: pa.Table, now: float) -> None:
        self.admitted = requests if self.admitted is None else pa.concat_tables([self.admitted, requests])

    def advance(self, now: float) -> pa.Table | None:
        if self.admitted is None:
            return None
        rows, self.admitted = self.admitted.to_pylist(), None
        # the samples of the iteration each row trains in (ahead of k in an asynchronous run), scored as its
        its = sorted({int(r["sample_id"]) // ID_STRIDE for r in rows})
        parts = [self.c.generate(j, [r for r in rows if int(r["sample_id"]) // ID_STRIDE == j], self.landing)
                 for j in its]
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    @property
    def lands_between_tokens(self) -> bool:
        return self.landing is not None

    def land(self, version: int, now: float) -> None:
        """The engine records each token's version (``generate``): nothing to do here."""

    def next_event_at(self) -> float | None:
        return None if self.admitted is None else time.time()

    def step_seconds(self) -> float | None:
        return None  # synchronous generation: no per-step figure

    def evict(self, now: float, epoch: int) -> tuple[pa.Table | None, pa.Table | None]:
        rest, self.admitted = self.admitted, None
        return None, rest


class RealCompute:
    """The :class:`~slurm_rl.worker.compute.Compute` of the real engines."""

    def __init__(self, cfg: Config, info: RankInfo, paths: RunPaths) -> None:
        import torch

        from slurm_rl.engines.actor.groups import GroupCache
        from slurm_rl.engines.actor.microbatch import BatchConfig
        from slurm_rl.engines.actor.trainer import ActorTrainer
        from slurm_rl.rl.tokenizer import CharTokenizer

        self.cfg, self.info, self.rank, self.run_dir = cfg, info, info.rank, paths.run_dir
        self.device = "cuda" if cfg.runtime.device == "cuda" else "cpu"
        torch.set_num_threads(cfg.actor.threads)
        init_world(info, cfg.runtime.device, cfg.runtime.wait_timeout_s, gpu=_group_gpu(cfg, info))
        self.checkpoint = cfg.model.path
        # the tokenizer (transformers: ~1 s of imports) is loaded by the ranks that use it (rollout)
        own_tokenizer = cfg.model.path is None and cfg.model.tokenizer_path is not None
        self.model_cfg = engine_model_config(cfg, len(self.tok) if own_tokenizer else CharTokenizer().vocab_size)
        self._dataset: Any = None  # rl.dataset.PromptDataset, loaded by the first requests()
        self._val: Any = None  # the validation prompts, loaded by the first evaluate()
        self._rewards: Any = None  # rewards.RewardRunner, started by the first generate() (or reward())
        self.reward_apart = bool(cfg.placement.reward_ranks)  # the reward placed on ranks of its own
        self._reward_faults: dict[int, tuple[int, int]] = {}  # iteration -> (errors, timeouts) scored 0
        optim_cfg = engine_optim_config(cfg)
        batch_cfg = BatchConfig(global_batch_size=cfg.train.global_batch_size,
                                micro_batch_size=cfg.train.micro_batch_size,
                                max_tokens_per_microbatch=cfg.train.max_tokens_per_microbatch,
                                remove_padding=cfg.train.use_remove_padding,
                                balance_batch=cfg.train.balance_batch)
        self.algorithm = cfg.algorithm
        self.horizon = cfg.rollout.max_new_tokens
        self.temperature = cfg.algorithm.temperature
        self.backend = cfg.rollout.backend
        self.sub_batch = cfg.rollout.sub_batch or cfg.scheduler.max_running_requests
        self.seed = cfg.runtime.seed
        self.groups = GroupCache(timeout=cfg.runtime.wait_timeout_s)
        initial = sorted(start_placement(cfg)["actor"])  # epoch 0's (every rank where plan time-slices)
        self.trainer = ActorTrainer(self.model_cfg, optim_cfg, batch_cfg, initial, self.groups, self.seed, self.device,
                                    checkpoint=self.checkpoint, tp=cfg.actor.tensor_parallel,
                                    precision=actor_precision(cfg), recompute=cfg.actor.recompute,
                                    attention=cfg.actor.attention_backend)
        self.critic: Any = None  # algorithm.adv_estimator gae: PPO's critic, on the actor's ranks or its own
        self.critic_own = bool(cfg.placement.critic_ranks)  # 'critic: 4-5': ranks that train the critic only
        if needs_critic(cfg.algorithm):
            from slurm_rl.engines.actor.critic import CriticTrainer

            critic_ranks = sorted(cfg.placement.critic_ranks) if self.critic_own else initial
            self.critic = CriticTrainer(self.model_cfg, critic_optim_config(cfg), batch_cfg, critic_ranks, self.groups,
                                        self.seed, self.device, checkpoint=self.checkpoint,
                                        tp=critic_tp(cfg),
                                        precision=actor_precision(cfg), recompute=cfg.actor.recompute,
                                        attention=cfg.actor.attention_backend)
        self.warm_s = 0.0
        if cfg.actor.warm_joiners and cfg.scheduler.policy != "static" and not self.trainer.active:
            self.warm_s = self.trainer.warm() + (self.critic.warm() if self.critic is not None and not self.critic_own
                                                 else 0.0)
        self.engine: Any = None
        self.ref: Any = None
        self.policy: Any = None  # inference ranks: the iteration's actor weights (algorithm.old_logprobs: actor)
        self.values: Any = None  # the critic's weights of the iteration (inference ranks; the actor's leader)
        self._parked: list[Any] = []  # what the last park() parked (a warm switch out)

    @functools.cached_property
    def tok(self) -> Any:
        """The run's tokenizer (``rl.tokenizer.load_tokenizer``), loaded on first use."""
        from slurm_rl.rl.tokenizer import load_tokenizer

        return load_tokenizer(self.cfg.model.path, self.cfg.model.tokenizer_path)

    @functools.cached_property
    def stop_ids(self) -> tuple[int, ...]:
        """Token ids that end a response (the tokenizer's and the checkpoint's EOS)."""
        from slurm_rl.rl.tokenizer import stop_token_ids

        return stop_token_ids(self.tok, self.cfg.model.path)

    @property
    def pad_id(self) -> int:
        """The tokenizer's pad id, else its first stop id."""
        return self.tok.pad_token_id if self.tok.pad_token_id is not None else self.stop_ids[0]

    # -- roles ----------------------------------------------------------------------------------
    def on_roles(self, old: Epoch | None, new: Epoch) -> dict[str, Any]:
        roles = set(new.role_of(self.rank))
        figures: dict[str, Any] = {}
        t0 = time.perf_counter()
        if "rollout" in roles:
            if self.engine is None:
                self.engine = self._rollout_engine(new)
                figures["rollout_engine"] = "built"
                if hasattr(self.engine, "world"):  # this rank's part of a TP engine over ranks (tp_host)
                    figures["rollout_engine_shard"] = [self.engine.index, self.engine.world]
                    figures["rollout_engine_executor"] = self.engine.options.get("distributed_executor_backend")
            elif self.engine.released:
                self.engine.resume()
                figures["rollout_engine"] = "woken"
        elif self.engine is not None and not self.engine.released:
            self.engine.release()  # parked: memory freed, weights kept for a wake without rebuild
            figures["rollout_engine"] = "parked"
        if "inference" in roles and self.ref is None:
            self.ref = self._reference_scorer()
            figures["reference"] = "built"
        if "inference" in roles and self.policy is None and self.algorithm.old_logprobs == "actor":
            self.policy = self._reference_scorer(dtype=actor_precision(self.cfg))  # weights: each iteration's sync
            figures["policy_scorer"] = "built"
        if "inference" in roles and self.values is None and self.critic is not None:
            self.values = self._value_scorer()
            figures["value_scorer"] = "built"
        if figures:
            figures["engine_seconds"] = time.perf_counter() - t0
        return figures

    def _rollout_engine(self, epoch: Epoch) -> Any:
        """This rank's rollout engine: its own, or its part of a TP vLLM engine over several ranks
        (``slurm_rl.engines.rollout.tp_host``: the epoch's rollout ranks in consecutive engines of
        ``scheduler.rollout_ranks_per_instance``, the first of each driving it)."""
        from slurm_rl.engines.rollout import make_rollout_engine
        from slurm_rl.engines.rollout.tp_host import TPEngineRank

        vllm = self._vllm_options() if self.backend == "vllm" else {}
        per = int(self.cfg.scheduler.rollout_ranks_per_instance)
        if self.backend != "vllm" or per == 1:
            return make_rollout_engine(self.backend, self.model_cfg, device=self.device, seed=self.seed,
                                       pad_id=self.pad_id, checkpoint=self.checkpoint, **vllm)
        ranks = sorted(epoch.ranks_of("rollout"))
        at = ranks.index(self.rank)
        group = ranks[at - at % per: at - at % per + per]
        store = self.run_dir / "control" / "engines" / f"port{self.info.master_port}-e{epoch.epoch}-r{group[0]}.store"
        store.parent.mkdir(parents=True, exist_ok=True)
        return TPEngineRank(self.model_cfg, group.index(self.rank), per, store, device=self.device,
                            timeout_s=self.cfg.runtime.wait_timeout_s,
                            engine_kwargs=dict(vllm, seed=self.seed, pad_id=self.pad_id, checkpoint=self.checkpoint,
                                               tensor_parallel_size=per))

    def _vllm_options(self) -> dict[str, Any]:
        """The rollout section's vLLM options on this rank's device (nulls resolved)."""
        from slurm_rl.rollout_config import engine_tp, resolve_engine_options

        options = resolve_engine_options(self.cfg.rollout, str(self.device), actor_precision(self.cfg),
                                         self.cfg.data.max_prompt_length, self.model_cfg.max_position_embeddings)
        tp = engine_tp(self.cfg.rollout, self.cfg.placement)  # the slots this process owns (validated)
        return {**options, "tensor_parallel_size": tp} if tp > 1 else options

    def _reference_scorer(self, dtype: str = "fp32") -> Any:
        """The initial policy: the checkpoint, or the random init every rank rebuilds from the seed."""
        import torch

        from slurm_rl.engines.inference import ReferenceScorer

        kind = torch.bfloat16 if dtype == "bf16" else torch.float32
        packed = self.cfg.train.use_remove_padding
        if self.checkpoint is not None:
            return ReferenceScorer(self.model_cfg, None, device=self.device, checkpoint=self.checkpoint, dtype=kind,
                                   packed=packed)
        from slurm_rl.engines.actor.model import build_gpt_model

        initial = build_gpt_model(self.model_cfg, self.seed, "cpu")
        return ReferenceScorer(self.model_cfg, initial.named_parameters(), device=self.device, dtype=kind,
                               packed=packed)

    def _value_scorer(self) -> Any:
        """A copy of the critic (its weights: each iteration's sync)."""
        import torch

        from slurm_rl.engines.inference import ValueScorer

        kind = torch.bfloat16 if actor_precision(self.cfg) == "bf16" else torch.float32
        return ValueScorer(self.model_cfg, None, device=self.device, dtype=kind, packed=self.cfg.train.use_remove_padding)

    # -- rollout --------------------------------------------------------------------------------
    def dataset(self) -> Any:
        """The training prompts (``data.train_files``), loaded and tokenised once per rank."""
        if self._dataset is None:
            from slurm_rl.rl.dataset import PromptDataset

            self._dataset = PromptDataset.load(self.cfg.data.train_files, data_spec(self.cfg), self.tok)
        return self._dataset

    def requests(self, k: int, batch: int = 0, position: int | None = None) -> pa.Table:
        from slurm_rl.rl.dataset import stream_rows
        from slurm_rl.rl.filter_groups import prompts_per_batch

        g, n = self.cfg.train.group_size, prompts_per_batch(self.cfg)
        start = k * self.cfg.train.rollout_batch_size if position is None else position
        prompts = stream_rows(self.dataset(), self.seed, start, n, self.cfg.data.shuffle)
        rows = []
        for p_idx, prompt in enumerate(prompts, start=batch * n):
            meta = json.dumps({"answer": prompt.answer, "extra": prompt.extra, "source": prompt.source,
                               "prompt": prompt.raw_prompt}, default=str)
            for j in range(g):
                sid = make_sample_id(k, p_idx, j, g)
                rows.append({
                    "sample_id": sid, "group_id": make_group_id(k, p_idx), "sample_index": j,
                    "prompt_ids": list(prompt.prompt_ids), "prompt_text": prompt.prompt_text,
                    "partial_response_ids": [], "partial_logprobs": [],
                    "seed": (self.seed * 1_000_003 + sid) % (2**62), "step": 0,
                    "weight_version": k, "metadata_json": meta,
                })
        return pa.Table.from_pylist(rows, schema=PENDING)

    def decoder(self, k: int, landing: Callable[[], None] | None = None) -> RealDecoder:
        return RealDecoder(self, k, self.sub_batch, landing)

    def generate(self, k: int, rows: list[dict[str, Any]], landing: Callable[[], None] | None = None) -> pa.Table:
        """Generate ``rows`` (each with its own seed); the ROLLOUTS rows with rewards. ``landing``: called at each
        token boundary (the hf engine's partial rollout: weights staged there land at the next one)."""
        from slurm_rl.engines.rollout import SamplingParams

        t0 = time.time()
        seeds = tuple(int(r["seed"]) % (2**31) for r in rows)
        ro = self.cfg.rollout
        sampling = SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=self.temperature, top_p=ro.top_p,
                                  top_k=ro.top_k, seed=seeds[0], seeds=seeds, stop_token_ids=self.stop_ids)
        hook = {"between_tokens": lambda step: landing()} if landing is not None else {}
        gens = self.engine.generate([r["prompt_ids"] for r in rows], sampling, **hook)
        ids, logprobs, reasons = [], [], []
        for g in gens:
            n = len(self._cut(g.token_ids))
            ids.append(g.token_ids[:n])
            logprobs.append(g.logprobs[:n])
            reasons.append("stop" if n < len(g.token_ids) else g.finish_reason)
        # where the reward is placed apart, its ranks score them (``reward``); the column waits as NaN
        rewards = [math.nan] * len(rows) if self.reward_apart else self._rewards_of(rows, ids, k)
        t1 = time.time()
        return pa.Table.from_pydict({
            "sample_id": [r["sample_id"] for r in rows], "group_id": [r["group_id"] for r in rows],
            "sample_index": [r["sample_index"] for r in rows], "prompt_ids": [r["prompt_ids"] for r in rows],
            "prompt_text": [r["prompt_text"] for r in rows],
            "response_ids": ids, "sampled_logprobs": logprobs, "reward": rewards,
            "finish_reason": reasons, "weight_version": [g.weight_version for g in gens],
            "weight_version_last": [g.last_version for g in gens],
            "rollout_rank": [self.rank] * len(rows), "t_start": [t0] * len(rows), "t_end": [t1] * len(rows),
        }, schema=ROLLOUTS)

    def _rewards_of(self, rows: list[dict[str, Any]], ids: list[list[int]], k: int) -> list[float]:
        """The rewards of responses ``ids`` to the requests ``rows`` (DAPO's overlong shaping included: the
        reward column holds the shaped reward)."""
        rewards = self.score_responses(rows, ids, k)
        ob = self.cfg.reward.overlong_buffer
        if ob.enable:
            from slurm_rl.rewards.overlong import overlong_penalties

            penalties = overlong_penalties([len(x) for x in ids], self.cfg.rollout.max_new_tokens, ob.len,
                                           ob.penalty_factor)
            rewards = [r + p for r, p in zip(rewards, penalties)]
        return rewards

    def reward(self, k: int, rollouts: pa.Table, requests: pa.Table) -> pa.Table:
        rewards = self._rewards_of(requests.to_pylist(), rollouts.column("response_ids").to_pylist(), k)
        return rollouts.set_column(rollouts.schema.get_field_index("reward"), "reward", pa.array(rewards, pa.float32()))

    def evaluate(self, k: int) -> dict[str, Any] | None:
        """``eval.n`` samples per validation prompt with the rollout engine (weights v``k``), scored."""
        from slurm_rl.engines.rollout import SamplingParams
        from slurm_rl.rl.dataset import PromptDataset, val_rows
        from slurm_rl.rl.evaluation import eval_figures

        if self.engine is None or not self.cfg.data.val_files:
            return None
        ev, ro = self.cfg.eval, self.cfg.rollout
        if self._val is None:
            self._val = PromptDataset.load(self.cfg.data.val_files, data_spec(self.cfg), self.tok, key="data.val_files")
        prompts = val_rows(self._val)[:ev.max_prompts]
        rows = [{"sample_id": p_idx * ev.n + j, "prompt_ids": list(p.prompt_ids), "metadata_json": json.dumps(
                    {"answer": p.answer, "extra": p.extra, "prompt": p.raw_prompt}, default=str)}
                for p_idx, p in enumerate(prompts) for j in range(ev.n)]
        t0, rewards = time.perf_counter(), []
        for i in range(0, len(rows), self.sub_batch):
            chunk = rows[i:i + self.sub_batch]
            seeds = tuple((self.seed * 7919 + r["sample_id"]) % (2**31) for r in chunk)
            sampling = SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=ev.temperature, top_p=ro.top_p,
                                      top_k=ro.top_k, seed=seeds[0], seeds=seeds, stop_token_ids=self.stop_ids)
            gens = self.engine.generate([r["prompt_ids"] for r in chunk], sampling)
            rewards += self.score_responses(chunk, [self._cut(g.token_ids) for g in gens])
        return {**eval_figures(rewards, ev.n), "val/seconds": time.perf_counter() - t0}

    def _cut(self, ids: list[int]) -> list[int]:
        """``ids`` up to the first ``rollout.stop`` string."""
        from slurm_rl.rl.tokenizer import cut_at_stop_strings

        return ids[:cut_at_stop_strings(ids, self.tok, self.cfg.rollout.stop)] if self.cfg.rollout.stop else ids

    def score_responses(self, rows: list[dict[str, Any]], response_ids: list[list[int]],
                        k: int | None = None) -> list[float]:
        """Rewards of the responses (``reward``), computed in the reward worker processes; those of
        iteration ``k`` that scored 0 on an error or a timeout (``reward.on_error: zero``) are counted
        for its metrics row."""
        from slurm_rl.rewards import RewardRunner, RewardSample

        if self._rewards is None:
            r = self.cfg.reward
            self._rewards = RewardRunner(r.name, r.fn, timeout_s=r.timeout_s, on_error=r.on_error, workers=r.workers)
        samples = []
        for row, ids in zip(rows, response_ids):
            meta = json.loads(row["metadata_json"])
            samples.append(RewardSample(sample_id=int(row["sample_id"]), prompt=meta["prompt"],
                                        response=self.tok.decode(ids, skip_special_tokens=True),
                                        answer=meta["answer"], extra=meta["extra"]))
        result = self._rewards.score(samples)
        if k is not None and (result.errors or result.timeouts):
            from slurm_rl.metrics import record_reward_faults

            errors, timeouts = self._reward_faults.get(k, (0, 0))
            self._reward_faults = {k: (errors + result.errors, timeouts + result.timeouts)}
            record_reward_faults(self.run_dir, k, self.rank, *self._reward_faults[k])
        return [float(v) for v in result.values]

    def sync_weights(self, k: int, src: int, ranks: list[int], gather: list[int] | None = None,
                     in_place: bool = False, sharded: list[list[int]] | None = None) -> dict[str, Any]:
        """Actor rank ``src`` -> rollout ranks: weights of version ``k`` (after ``k`` actor iterations),
        in the actor's compute dtype; under TP ``src`` first gathers the shards of its TP group ``gather``.
        ``in_place``: this rank holds a full replica of the actor (collocated, TP 1) and its engines take
        its own weights, with no collective. ``sharded``: TP vLLM engines over ranks (each in TP order) to which
        ``src`` sends, after the broadcast to ``ranks``, each rank's shard of every tensor only."""
        from slurm_rl.engines.convert import megatron_to_hf
        from slurm_rl.engines.weight_sync import broadcast_weights

        if in_place:
            t0 = time.perf_counter()
            own = list(megatron_to_hf(self.trainer.full_parameters(), self.model_cfg))
            if self.engine is not None:
                self.engine.update_weights(own, version=k)
            if self.policy is not None:
                self.policy.load_weights(own)
            if self.values is not None and not self.critic_own:
                self.values.load_weights(self.critic.full_parameters())
            return {"seconds": time.perf_counter() - t0, "bytes": 0}

        full = self.trainer.full_parameters() if self.rank in (gather or [src]) else None
        named = list(megatron_to_hf(full, self.model_cfg)) if self.rank == src and full is not None else None
        with_actor = self.critic is not None and not self.critic_own
        critic = self.critic.full_parameters() if with_actor and self.rank in (gather or [src]) else None
        engine = next((e for e in sharded or [] if self.rank in e), None)
        if engine is not None:
            return self._receive_shards(k, src, engine)
        if self.rank not in ranks:  # a TP peer of the source: its shards are given
            return {}
        stats = None
        received: list[Any] = []
        if len(ranks) > 1:
            received, stats = broadcast_weights(named, src, self.groups.get(ranks, "weight sync"),
                                                timeout=self.cfg.runtime.wait_timeout_s, what=f"weight sync v{k}")
        if self.engine is not None:  # the source may serve rollout too (pre-process): its own weights
            self.engine.update_weights(named if self.rank == src else received, version=k)
        if self.policy is not None:  # an inference rank's copy of the actor (algorithm.old_logprobs: actor)
            self.policy.load_weights(named if self.rank == src else received)
        figures = {"seconds": float(getattr(stats, "seconds", 0.0)), "bytes": int(getattr(stats, "bytes", 0))}
        if self.rank == src and sharded:
            t0 = time.perf_counter()
            figures["bytes"] += sum(self._send_shards(named, engine) for engine in sharded)
            figures["seconds"] += time.perf_counter() - t0
        if with_actor:
            self._sync_critic(k, src, ranks, figures, critic)
        return figures

    def land_weights(self, version: int, src: int, ranks: list[int], gather: list[int]) -> dict[str, Any]:
        from slurm_rl.engines.convert import megatron_to_hf
        from slurm_rl.engines.weight_sync import broadcast_weights

        full = self.trainer.full_parameters() if self.rank in (gather or [src]) else None
        named = list(megatron_to_hf(full, self.model_cfg)) if self.rank == src and full is not None else None
        if self.rank not in ranks:  # a TP peer of the source: its shards are given
            return {}
        received, stats = broadcast_weights(named, src, self.groups.get(ranks, "weight sync"),
                                            timeout=self.cfg.runtime.wait_timeout_s,
                                            what=f"weight sync v{version} mid-generation")
        if self.rank != src:
            if self.engine is None:
                raise ProtocolError(f"rank {self.rank}: weights v{version} to land mid-generation, and no rollout "
                                    "engine to take them")
            self.engine.stage_weights(received, version)
        return {"seconds": float(getattr(stats, "seconds", 0.0)), "bytes": int(getattr(stats, "bytes", 0))}

    def _send_shards(self, named: list[Any], engine: list[int]) -> int:
        """Every rank of a TP engine its shard of each tensor (names, shapes and dtypes first); bytes sent."""
        import torch.distributed as dist

        from slurm_rl.engines.rollout.tp_shards import send_shards

        header = [[(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named]]
        for dst in engine:
            dist.send_object_list(header, dst=dst)
        _, sent = send_shards(named, engine, self.model_cfg.num_attention_heads, self.model_cfg.kv_groups,
                              timeout_s=self.cfg.runtime.wait_timeout_s)
        return sent

    def _receive_shards(self, k: int, src: int, engine: list[int]) -> dict[str, Any]:
        """This rank's shards from ``src`` for its part of a TP engine, loaded as version ``k``."""
        import torch
        import torch.distributed as dist

        from slurm_rl.engines.rollout.tp_shards import expand_shards, recv_shards

        t0 = time.perf_counter()
        header: list[Any] = [None]
        dist.recv_object_list(header, src=src)
        shapes = {n: (tuple(shape), getattr(torch, dtype)) for n, shape, dtype in header[0]}
        tp, index = len(engine), engine.index(self.rank)
        heads, kv = self.model_cfg.num_attention_heads, self.model_cfg.kv_groups
        own, got = recv_shards(shapes, src, tp, index, heads, kv, timeout_s=self.cfg.runtime.wait_timeout_s)
        full = {n: shape for n, (shape, _) in shapes.items()}
        self.engine.update_weights(list(expand_shards(own, full, tp, index, heads, kv)), version=k)
        return {"seconds": time.perf_counter() - t0, "bytes": got}

    def sync_critic(self, k: int, src: int, ranks: list[int], gather: list[int]) -> dict[str, Any]:
        full = self.critic.full_parameters() if self.rank in gather else None  # a collective of src's TP group
        figures: dict[str, Any] = {"seconds": 0.0, "bytes": 0}
        if self.rank in ranks:
            self._sync_critic(k, src, ranks, figures, full if self.rank == src else None)
        return figures

    def _sync_critic(self, k: int, src: int, ranks: list[int], figures: dict[str, Any], mine: Any) -> None:
        """The critic's weights of version ``k`` from ``src`` to the value scorers of ``ranks`` (the
        inference ranks use them; the rollout ranks receive and drop them). On the actor's ranks ``src`` is
        the actor's leader, which computes the values itself where no inference rank does; on ranks of its
        own ``src`` is the critic's first rank and the leader, then, one of ``ranks``. ``mine``: the full
        critic on ``src`` (gathered over its TP group)."""
        from slurm_rl.engines.weight_sync import broadcast_weights

        received: list[Any] = []
        if len(ranks) > 1:
            received, stats = broadcast_weights(mine, src, self.groups.get(ranks, "weight sync"),
                                                timeout=self.cfg.runtime.wait_timeout_s, what=f"critic sync v{k}")
            figures["seconds"] += float(getattr(stats, "seconds", 0.0))
            figures["bytes"] += int(getattr(stats, "bytes", 0))
        if self.values is None and (self.rank != src if self.critic_own else self.rank == src):
            self.values = self._value_scorer()
        if self.values is not None:
            self.values.load_weights(mine if self.rank == src else received)

    # -- inference ------------------------------------------------------------------------------
    def score(self, k: int, rollouts: pa.Table, now: float, share_ranks: int) -> tuple[pa.Table, float]:
        from slurm_rl.rl.kl_ctrl import uses_reference

        if self.ref is None and uses_reference(self.algorithm):  # the actor's leader without inference ranks
            self.ref = self._reference_scorer()
        prompts = rollouts.column("prompt_ids").to_pylist()
        responses = rollouts.column("response_ids").to_pylist()
        sequences = [p + r for p, r in zip(prompts, responses)]

        def responses_of(scorer: Any) -> list[list[float]]:
            return [s[len(p) - 1:].tolist() for s, p in zip(scorer.score(sequences), prompts)]

        # without a KL to weigh, the reference is never read: the sampled log-probs fill its column
        ref: Any = responses_of(self.ref) if self.ref is not None else rollouts.column("sampled_logprobs")
        old = None
        if self.policy is not None:  # the weights these responses were sampled with, as the actor holds them
            old = responses_of(self.policy)
        values = None
        if self.critic is not None:  # the critic of the iteration's start: GAE's values
            if self.values is None:
                raise RuntimeError(f"rank {self.rank}: values of iteration {k} asked before the critic's weights "
                                   "reached this rank (it is neither an inference rank nor the weight sync's source)")
            values = pa.array(responses_of(self.values), pa.list_(pa.float32()))
        return inference_table(rollouts, ref, self.rank, values=values, old_logprobs=old), time.time()

    # -- actor ----------------------------------------------------------------------------------
    def reshard(self, old: list[int], new: list[int], epoch: int, old_tp: int = 1, new_tp: int = 1
                ) -> dict[str, Any]:
        figures = self.trainer.reshard(new, epoch=epoch, old_ranks=old, new_tp=new_tp, old_tp=old_tp)
        if self.critic is not None and not self.critic_own:  # the critic moves with the actor (its own state)
            critic = self.critic.reshard(new, epoch=epoch, old_ranks=old, new_tp=new_tp, old_tp=old_tp)
            figures = {key: v + float(critic.get(key, 0.0)) if key.endswith(("seconds", "bytes")) else v
                       for key, v in figures.items()}
        return {key: float(v) for key, v in figures.items()}

    def predict_train_seconds(self, tokens: int, old: list[int], new: list[int]) -> float | None:
        return None  # measured, not predicted

    def predict_switch_seconds(self) -> float | None:
        return None

    def _dp_share(self, rows: list[dict[str, Any]], dp_rank: int, dp_size: int) -> list[dict[str, Any]]:
        """This DP rank's samples of a mini-batch: contiguous, or its part of the token-balanced partition
        (``train.balance_batch``, verl's key: every DP rank of the step gets a like compute load)."""
        from slurm_rl.engines.actor.microbatch import shard_for_rank

        lengths = ([len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows]
                   if self.cfg.train.balance_batch else None)
        return shard_for_rank(rows, dp_rank, dp_size, lengths, self.model_cfg.hidden_size)

    def train(self, k: int, index: int, batch: pa.Table, ranks: list[int], ready_at: float | None
              ) -> tuple[float, dict[str, Any]]:
        rows = batch.to_pylist()
        mine = self._dp_share(rows, self.trainer.dp_rank, self.trainer.dp_size)  # TP peers share one
        t0 = time.perf_counter()
        t = self.cfg.train
        later_pass = index >= t.rollout_batch_size * t.group_size // t.global_batch_size  # actor.ppo_epochs > 1
        samples = [self._sample(r) for r in mine]
        stats: dict[str, Any] = {}
        if t.critic_warmup <= k + 1 or self.critic is None:  # verl: the actor updates once critic_warmup <= step
            stats = self.trainer.train_step(samples, *self._loss(), entropy=bool(self.algorithm.entropy_coeff),
                                            schedule_samples=0 if later_pass else None)
        if self.critic is not None and not self.critic_own:  # on the same mini-batch (verl: critic, then actor)
            stats.update(self._critic_step(mine, samples, later_pass))
        return time.time(), {**stats, "train_s": time.perf_counter() - t0}

    def train_critic(self, k: int, index: int, batch: pa.Table, ranks: list[int]) -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        mine = self._dp_share(batch.to_pylist(), self.critic.dp_rank, self.critic.dp_size)
        t = self.cfg.train
        later_pass = index >= t.rollout_batch_size * t.group_size // t.global_batch_size  # actor.ppo_epochs > 1
        stats = self._critic_step(mine, [self._sample(r) for r in mine], later_pass)
        return time.time(), {**stats, "critic/train_s": time.perf_counter() - t0}

    def _critic_step(self, rows: list[dict[str, Any]], samples: list[dict[str, Any]], later_pass: bool
                     ) -> dict[str, Any]:
        """One step of PPO's critic on this rank's share of a mini-batch: its ``critic/*`` figures."""
        critic = self.critic.train_step([self._critic_sample(r, s) for r, s in zip(rows, samples)],
                                        *self._value_loss(), schedule_samples=0 if later_pass else None)
        return {f"critic/{key}": critic[key] for key in ("loss", "grad_norm", "lr", "vf_clipfrac")}

    @staticmethod
    def _critic_sample(row: dict[str, Any], sample: dict[str, Any]) -> dict[str, Any]:
        """The critic's sample: the actor's ids and mask, the rollout-time values and GAE's returns."""
        start = len(row["prompt_ids"]) - 1
        width = len(sample["loss_mask"])

        def place(values: list[float]) -> list[float]:
            out = [0.0] * width
            out[start:start + len(values)] = values
            return out

        return {"input_ids": sample["input_ids"], "loss_mask": sample["loss_mask"],
                "values": place(row["values"]), "returns": place(row["returns"])}

    def _value_loss(self) -> tuple[Any, Any]:
        """The critic's per-token loss (verl's clipped value loss, ``critic.cliprange_value``) and its
        aggregation (``critic.loss_agg_mode``, default the actor's)."""
        from slurm_rl.rl.losses import LossAggregation, value_loss

        c = self.cfg.critic

        def loss(vpreds: Any, batch: dict[str, Any]) -> Any:
            per_token, clipped = value_loss(vpreds, batch["values"], batch["returns"], c.cliprange_value)
            return per_token, {"vf_clipfrac": clipped.to(per_token.dtype)}

        return loss, LossAggregation(c.loss_agg_mode or self.algorithm.loss_agg_mode, horizon=self.horizon)

    @staticmethod
    def _sample(row: dict[str, Any]) -> dict[str, Any]:
        """One trainer sample: prompt+response ids with per-token fields in next-token layout."""
        prompt, response = row["prompt_ids"], row["response_ids"]
        width = len(prompt) + len(response) - 1
        start = len(prompt) - 1

        def place(values: list[float]) -> list[float]:
            out = [0.0] * width
            out[start:start + len(values)] = values
            return out

        mask = place([1.0] * len(response))
        per_token = row.get("token_advantages")
        advantages = place(per_token) if per_token is not None else [row["advantage"] * m for m in mask]
        sample = {"input_ids": prompt + response, "loss_mask": mask, "old_logprobs": place(row["old_logprobs"]),
                  "ref_logprobs": place(row["ref_logprobs"]), "advantages": advantages}
        if row.get("rollout_is_weights") is not None:
            sample["rollout_is_weights"] = place(row["rollout_is_weights"])
        return sample

    def _loss(self) -> tuple[Any, Any]:
        """The per-token loss of ``algorithm`` (verl's vanilla policy loss plus ``kl_coef`` times
        the ``kl_loss_type`` KL, minus ``entropy_coeff`` times the policy's entropy) and its
        aggregation over the step (``loss_agg_mode``)."""
        from slurm_rl.rl.losses import LossAggregation, PolicyLossConfig, kl_penalty, policy_diagnostics, policy_loss

        al = self.algorithm
        clip = PolicyLossConfig(clip_ratio_low=al.clip_eps if al.clip_ratio_low is None else al.clip_ratio_low,
                                clip_ratio_high=al.clip_eps if al.clip_ratio_high is None else al.clip_ratio_high,
                                clip_ratio_c=al.clip_ratio_c)
        policy, kl_coef, kl_type, entropy_coeff = policy_loss("vanilla"), al.kl_coef, al.kl_loss_type, al.entropy_coeff

        def loss(logprobs: Any, batch: dict[str, Any]) -> Any:
            per_token, _ = policy(logprobs, batch["old_logprobs"], batch["advantages"], clip)
            if "rollout_is_weights" in batch:  # algorithm.rollout_is: the policy term, weighted per token
                per_token = per_token * batch["rollout_is_weights"]
            if kl_coef:
                per_token = per_token + kl_coef * kl_penalty(logprobs, batch["ref_logprobs"].detach(), kl_type)
            if entropy_coeff:
                per_token = per_token - entropy_coeff * batch["entropy"]
            diagnostics = policy_diagnostics(logprobs, batch["old_logprobs"], batch["advantages"], clip)
            return per_token, {f"actor/{name}": value for name, value in diagnostics.items()}

        return loss, LossAggregation(al.loss_agg_mode, horizon=self.horizon)

    # -- warm switch (co-execution groups) ------------------------------------------------------
    def park(self) -> dict[str, Any]:
        """Actor state, rollout, reference and policy-scorer weights to host memory, engines and groups kept.
        Only what this call parks is resumed by :meth:`unpark` (an engine parked by a role change
        stays parked)."""
        t0, nbytes = time.perf_counter(), 0
        self._parked = []
        for trainer in (self.trainer, self.critic):
            if trainer is not None and trainer.active and not trainer.parked:
                nbytes += int(trainer.park().get("bytes", 0))
                self._parked.append(trainer)
        if self.engine is not None and not self.engine.released:
            nbytes += int((self.engine.release() or {}).get("bytes", 0))
            self._parked.append(self.engine)
        for scorer in (self.ref, self.policy, self.values):
            if scorer is not None and not scorer.parked:
                nbytes += int(scorer.park().get("bytes", 0))
                self._parked.append(scorer)
        return {"seconds": time.perf_counter() - t0, "bytes": nbytes}

    def unpark(self) -> dict[str, Any]:
        """Bring back in place what :meth:`park` parked (no rebuild)."""
        t0, nbytes = time.perf_counter(), 0
        for engine in getattr(self, "_parked", []):
            wake = engine.resume if engine is self.engine else engine.unpark
            nbytes += int((wake() or {}).get("bytes", 0))
        self._parked = []
        return {"seconds": time.perf_counter() - t0, "bytes": nbytes}

    # -- collocated phases ----------------------------------------------------------------------
    def switch_phase(self, phase: str) -> dict[str, Any]:
        t0, nbytes = time.perf_counter(), 0
        peak = self._phase_peak()
        offload = actor_offloads(self.cfg)
        scorers = [s for s in (self.ref, self.policy, self.values) if s is not None]
        if phase == "generate":
            if offload and self.trainer.active:
                for trainer in (self.trainer, self.critic):
                    if trainer is not None and trainer.active:
                        nbytes += int(trainer.park().get("bytes", 0))
            if self.engine is not None and self.engine.released:
                nbytes += int((self.engine.resume() or {}).get("bytes", 0))
            for scorer in scorers:  # parked while the rank trained (their weights of this iteration already in)
                if scorer.parked:
                    nbytes += int(scorer.unpark().get("bytes", 0))
        elif phase == "train":
            if self.engine is not None and not self.engine.released:
                nbytes += int((self.engine.release() or {}).get("bytes", 0))
            if offload:  # the scorers (reference, old log-probs, values) wait in host memory while it trains
                for scorer in scorers:
                    if not scorer.parked:
                        nbytes += int(scorer.park().get("bytes", 0))
            for trainer in (self.trainer, self.critic):
                if trainer is not None and trainer.active:
                    nbytes += int(trainer.unpark().get("bytes", 0))
        else:
            raise ValueError(f"switch_phase: unknown phase {phase!r}; allowed: generate, train")
        return {"phase": phase, "bytes": nbytes, "seconds": time.perf_counter() - t0, **peak}

    def _phase_peak(self) -> dict[str, int]:
        """On cuda, the device memory peak of the phase a switch ends (``peak_gpu_bytes``; the peak is
        reset for the next one): what the actor alone, or the rollout and inference alone, need. Not run on a
        GPU yet."""
        if self.device != "cuda":
            return {}
        import torch

        peak = int(torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
        return {"peak_gpu_bytes": peak}

    # -- run checkpoints ------------------------------------------------------------------------
    def save_state(self, directory: Path, iteration: int) -> None:
        """The actor's state into ``directory/actor`` (collective over its DP group; DP rank 0 writes),
        with the data position (``iteration``'s first prompt) in its metadata; the critic's into
        ``directory/critic`` by its ranks."""
        from slurm_rl.engines.actor.checkpoint import save_checkpoint
        from slurm_rl.rl.dataset import data_position

        if self.trainer.active:
            consumed = None
            if self.cfg.algorithm.filter_groups.enable:  # dynamic sampling drew more: the metrics rows say how many
                from slurm_rl.metrics import read_metrics
                from slurm_rl.rl.filter_groups import prompts_before

                consumed = prompts_before(read_metrics(self.run_dir), iteration, self.cfg.train.rollout_batch_size)
            self.trainer.data_state = {"iteration": iteration, "files": list(self.cfg.data.train_files),
                                       "fingerprint": self.dataset().fingerprint,
                                       **data_position(iteration, self.cfg.train.rollout_batch_size,
                                                       len(self.dataset().rows), consumed)}
        for trainer, name in ((self.trainer, ACTOR_DIR), (self.critic, CRITIC_DIR)):
            if trainer is None or not trainer.active:
                continue
            parked = trainer.parked  # a group member waits at the gate parked
            if parked:
                trainer.unpark()
            save_checkpoint(trainer, directory / name)
            if parked:
                trainer.park()

    def load_state(self, directory: Path) -> None:
        """Load the actor's state on the actor ranks of the config (any DP size)."""
        from slurm_rl.engines.actor.checkpoint import load_checkpoint

        if self.trainer.active:
            load_checkpoint(self.trainer, directory / ACTOR_DIR)
        if self.critic is not None and self.critic.active:
            load_checkpoint(self.critic, directory / CRITIC_DIR)

    def _wait_for_file(self, path: Path, what: str) -> None:
        deadline = time.monotonic() + self.cfg.runtime.wait_timeout_s
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.rank}: waited {self.cfg.runtime.wait_timeout_s:.0f}s for {what} ({path})")
            time.sleep(self.cfg.runtime.poll_interval_s)

    def close(self, finished: bool = True) -> None:
        """Save the trained actor (``RUN_DIR/checkpoints/final``, by its DP rank 0) when the run
        is complete, free the engines."""
        import torch.distributed as dist

        from slurm_rl.engines.actor.checkpoint import save_checkpoint

        final = self.run_dir / "checkpoints" / "final"
        for trainer, where in ((self.trainer, final), (self.critic, final / CRITIC_DIR)):
            if trainer is not None and trainer.active and finished:
                if trainer.parked:  # a group member ends parked
                    trainer.unpark()
                if trainer is self.critic and self.critic_own:  # its directory sits inside the actor's
                    self._wait_for_file(final / "meta.json", "the actor's final checkpoint")
                save_checkpoint(trainer, where)
        if self.engine is not None:
            self.engine.close()
        if self._rewards is not None:
            self._rewards.close()
        if dist.is_initialized():
            dist.destroy_process_group()
