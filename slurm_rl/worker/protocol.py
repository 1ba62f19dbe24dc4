"""The iteration protocol: one implementation for every device, compute behind ``worker.compute``.

One iteration ``k`` on one rank is a cooperative loop (:class:`_Iteration`): apply epochs at a safe
point, advance each part the rank currently holds, sleep until the next event. ``rt.roles`` is
re-read on every pass, so a rank whose roles change mid-iteration starts its new role's work in
the same iteration. The compute (cost model or real engines) only answers narrow calls; with real
engines a call blocks and the loop's next pass is the next safe point.

- Iteration start (every rank, same order): the actor's state moves to the actor ranks of the
  iteration's start epoch (the epoch the coordinator released the iteration with) and the actor's
  lowest rank sends weights of version ``k`` to the start epoch's rollout ranks.
- rollout: the iteration's requests are deterministic, so every rollout head builds the same
  table and claims chunks by creating ``requests/claim-NNNNNN`` exclusively (one winner per chunk,
  no directory listing). A rank released from rollout stops at its next safe point and hands its
  unfinished requests (with partial responses, where the engine has them) back as pending tickets;
  the remaining ranks claim them once the initial chunks are gone. Rollout ends when every sample
  of the iteration is listed in some ``rollouts`` manifest.
- inference: the inference ranks of the start epoch share the ``rollouts`` shards by a hash of
  (producer, seq) and write ``inference`` shards; a rank released after its share simply closes.
- actor: the cutter (lowest actor rank of the start epoch, else of the last actor) cuts whole GRPO
  groups into mini-batches of ``train.global_batch_size`` once the previous one was trained and
  (dynamic policies) the coordinator answered the boundary, and stamps each with the epoch in
  force (``plan.json``, written before the shard). Every rank walks the plan: it applies epochs up
  to the stamp; when the stamped actor ranks differ from the ranks holding the actor's state, the
  union of both reshards in place (the same decision on every rank: it depends on the plan only);
  then the stamped ranks train the mini-batch and its first rank writes ``trained-NNNNNN.json``.
  So actor growth takes effect at a mini-batch boundary every rank agrees on.
"""

from __future__ import annotations

import collections
import json
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from slurm_rl.config import Config, actor_offloads, critic_tp
from slurm_rl.control.acks import write_reshard
from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.epochs import Epoch, read_epoch_file
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.data.actor_batch import kl_in_reward, make_actor_batch, mismatch
from slurm_rl.data.follow import StageFollower
from slurm_rl.data.gc import collect_garbage
from slurm_rl.data.layout import expected_path, manifest_path, stage_dir
from slurm_rl.data.manifest import ProducerManifest
from slurm_rl.data.migration import claim_pending, write_pending
from slurm_rl.data.schemas import ACTOR_BATCH, ID_STRIDE, INFERENCE, PENDING, ROLLOUTS, count_tokens, inference_table
from slurm_rl.data.shardio import open_shard
from slurm_rl.data.writer import StageWriter, write_expected
from slurm_rl.errors import WorkerError
from slurm_rl.faults import fault_point
from slurm_rl.fsio import stat_key
from slurm_rl.launch.rank_env import RankInfo
from slurm_rl.metrics import append_metrics, read_metrics, reward_faults
from slurm_rl.resume.replay import save_replay
from slurm_rl.resume.restart import read_resume_point
from slurm_rl.rl.advantages import needs_critic
from slurm_rl.rl.evaluation import eval_due, eval_path, write_eval
from slurm_rl.rl.filter_groups import (DRAWN_KEY, group_metric, keeps, prompts_before, prompts_per_batch,
                                        read_rounds, write_rounds)
from slurm_rl.rl.formulas import k3
from slurm_rl.rl.kl_ctrl import COEF_KEY, KL_KEY, kl_coef_of_iteration, uses_reference
from slurm_rl.scheduler.history import length_bucket
from slurm_rl.scheduler.live_state import start_placement
from slurm_rl.worker.compute import Compute, Decoder
from slurm_rl.worker.errors import CoordinatorFailed, DynamicSamplingExhausted, NoProgressTimeout, ProtocolError
from slurm_rl.worker.pool_gate import PhaseGate, PoolGate
from slurm_rl.worker.runtime import WorkerRuntime

ROLLOUTS_STAGE = "rollouts"
REWARDS_STAGE = "rewards"  # where the reward is placed apart from the rollout: the rollouts with their rewards
INFERENCE_STAGE = "inference"
ACTOR_STAGE = "actor_batch"
REQUESTS_STAGE = "requests"  # claim markers of the iteration's request chunks
PLAN_FILE = "plan.json"
#: Per-step token means of the losses' diagnostics (verl's metric names), averaged into the iteration's row
STEP_DIAGNOSTICS = ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "critic/vf_clipfrac")
BOUNDARY_WAIT_S = 2.0  # at most this long the cutter waits for the coordinator at a mini-batch boundary
STATUS_CHECK_EVERY_S = 0.5  # how often a working rank looks for a coordinator failure
IDLE_POLL_S = 0.1  # loop period of a rank with no rollout, inference or cutting work
REPORT_EVERY_S = 0.05  # progress files are rewritten at most this often (and on state changes)
CLAIM_EVERY_S = 0.05  # a rollout rank lists the pending directory at most this often
DONE_CHECK_EVERY_S = 0.1  # an idle rollout rank checks at most this often whether rollout finished
FLUSH_EVERY_S = 0.05  # finished samples wait at most this long before they are written as a shard
REVOKE_TAG = 1_000_000  # pending tickets of a revoked group slot: tag = this + grant number (epochs stay below)


class CollectiveError(WorkerError, RuntimeError):
    """A collective (reshard, weight sync, training step, checkpoint) failed or timed out on this
    rank; names the rank, host, epoch, iteration and what was awaited."""


@contextmanager
def collective(what: str, info: RankInfo, epoch: int | None, iteration: int) -> Iterator[None]:
    """Re-raise a failure inside ``what`` (a gloo/NCCL timeout names none of this) with context."""
    try:
        yield
    except CollectiveError:
        raise
    except Exception as exc:
        raise CollectiveError(f"rank {info.rank} (host {info.host}), epoch {epoch}, iteration {iteration}: {what} "
                              f"failed: {type(exc).__name__}: {exc}") from exc


def rollout_heads(ranks: list[int], ranks_per_instance: int) -> list[int]:
    """The first rank of each rollout instance (the one that decodes for the instance)."""
    ordered = sorted(ranks)
    return ordered[::ranks_per_instance] if len(ordered) % ranks_per_instance == 0 else ordered


def trained_marker(run_dir: Path, k: int, index: int) -> Path:
    """Written by the first rank of mini-batch ``index``'s actor group once it is trained."""
    return stage_dir(run_dir, k, ACTOR_STAGE) / f"trained-{index:06d}.json"


def critic_marker(run_dir: Path, k: int, index: int) -> Path:
    """Written by the first critic rank once it trained mini-batch ``index`` (the critic on ranks of its own)."""
    return stage_dir(run_dir, k, ACTOR_STAGE) / f"critic-trained-{index:06d}.json"


def mean_k3(old: list[list[float]], ref: list[list[float]]) -> float | None:
    """Mean over samples of the k3 estimate of KL(rollout policy || reference) per response."""
    values = []
    for sampled, reference in zip(old, ref):
        if sampled and reference:
            d = np.asarray(reference, np.float64) - np.asarray(sampled, np.float64)
            values.append(float(np.mean(k3(d))))
    return float(np.mean(values)) if values else None


def without_reference(rollouts: pa.Table, rank: int) -> pa.Table:
    """INFERENCE rows for a run without an inference component and without a KL term to weigh
    (:func:`~slurm_rl.rl.kl_ctrl.uses_reference` false): the reference log-probs are never read, so
    the sampled ones fill the column."""
    return inference_table(rollouts, rollouts.column("sampled_logprobs"), rank)


def generation_complete(run_dir: Path, k: int, samples: int, filtering: bool, batch_samples: int) -> bool:
    """Every request of iteration ``k`` is in some producer's rollouts manifest: its ``samples``, or
    under dynamic sampling those of every generation batch opened, once no more will open."""
    if not filtering:
        return rollout_complete(run_dir, k, samples)
    opened, closed = read_rounds(run_dir, k)
    return closed and rollout_complete(run_dir, k, opened * batch_samples)


def rollout_complete(run_dir: Path, k: int, samples: int) -> bool:
    """At least ``samples`` rows of iteration ``k`` are in the producers' rollouts manifests."""
    path = expected_path(run_dir, k, ROLLOUTS_STAGE)
    if not path.exists():
        return False
    total = 0
    for r in read_json(path).get("producer_ranks", []):
        mpath = manifest_path(run_dir, k, ROLLOUTS_STAGE, int(r))
        if mpath.exists():
            m = ProducerManifest.load(mpath, iteration=k, stage=ROLLOUTS_STAGE, producer_rank=int(r))
            total += sum(s.rows for s in m.shards)
    return total >= samples


class IterationProtocol:
    """The :class:`~slurm_rl.worker.runtime.Roles` of every device: the protocol over a compute."""

    def __init__(self, cfg: Config, info: RankInfo, paths: RunPaths, compute: Compute) -> None:
        self.cfg, self.info, self.paths, self.compute = cfg, info, paths, compute
        self.run_dir = paths.run_dir
        self.samples_per_iteration = cfg.train.rollout_batch_size * cfg.train.group_size
        # DAPO's dynamic sampling: generation batches of this many prompts until enough groups are kept
        self.filtering = bool(cfg.algorithm.filter_groups.enable)
        self.batch_prompts = prompts_per_batch(cfg)
        self.poll = cfg.runtime.poll_interval_s
        self.timeout = cfg.runtime.wait_timeout_s
        self.max_running = int(cfg.scheduler.max_running_requests)
        self.rollout_tp = int(cfg.scheduler.rollout_ranks_per_instance)
        self.dynamic = cfg.scheduler.policy != "static"
        self.index_order = cfg.train.minibatch_order == "index"
        self.initial_actor = sorted(start_placement(cfg).get("actor", ()))  # epoch 0's
        # Ranks that hold the actor's state: a function of the plans walked so far, the same on every rank.
        self.actor_ranks: list[int] = list(self.initial_actor)
        self.actor_tp = int(cfg.actor.tensor_parallel)  # the actor's TP size, as the epochs walked so far say
        # PPO's critic on ranks of its own (idle in every epoch; empty: it trains on the actor's ranks)
        self.critic_ranks: list[int] = sorted(cfg.placement.critic_ranks)
        # the reward placed apart from the rollout: the ranks that score every response (empty: beside the rollout)
        self.reward_ranks: list[int] = sorted(cfg.placement.reward_ranks)
        self.critic_tp = critic_tp(cfg)  # its TP size there (critic.tensor_parallel)
        self._iteration: _Iteration | None = None
        self._epochs: dict[int, Epoch] = {}
        # asynchronous RL: the rollout runs this many policy versions ahead of the actor (generated_in): at most
        # one where it waits at the gates, up to algorithm.max_staleness with partial rollout, where the weights of
        # version k + 1 reach the rollout in iteration k, while it decodes, and its requests carry over the gate
        self.max_staleness = int(cfg.algorithm.max_staleness)
        self.partial = bool(cfg.rollout.partial_rollout) and self.max_staleness >= 1
        self.lead = self.max_staleness if self.partial else min(self.max_staleness, 1)
        self._carried: _Rollout | None = None  # partial rollout: this head's rollout, carried into the next iteration
        self.num_iterations = int(cfg.train.num_iterations)
        # the iterations ahead whose samples exist when this incarnation starts (a resumed async run's replay
        # buffer): read before the first gate, while no rank generates
        point = read_resume_point(self.run_dir)
        first = point.iteration if point is not None else 0
        self.first_iteration = first
        self.generated_before = {j for j in range(first, min(first + self.lead, self.num_iterations))
                                 if rollout_complete(self.run_dir, j, self.samples_per_iteration)}
        # Inside a co-execution group the rank computes only while its job holds its pool slot.
        self.gate: PhaseGate = PoolGate(cfg, info, compute.park, compute.unpark) if cfg.mux.group_dir else PhaseGate()

    def generated_in(self, k: int) -> list[int]:
        """The iterations whose samples the rollout of iteration ``k`` starts to draw, in order: ``k`` itself in a
        synchronous run; with ``algorithm.max_staleness`` >= 1 the iteration ``k + lead`` (the weights of version
        ``k`` draw it while the actor trains ``k``), and in an incarnation's first iteration those from ``k`` on
        too where their samples are not there yet (a run's start, or a resume without them).

        Without partial rollout the rollout of iteration ``k`` ends inside iteration ``k`` (the next gate waits for
        it), so drawing further ahead would take the rollout's GPUs longer in some iteration and overlap no more
        training: a larger bound is honoured by running one version ahead (scheduler.async_pipeline models the
        same). With partial rollout the draws carry over the gates (:meth:`lands_ahead`), up to the bound ahead
        (scheduler.async_stream)."""
        s = self.lead
        if s == 0:
            return [k]
        first = range(k, k + s + 1) if k == self.first_iteration else range(k + s, k + s + 1)
        return [j for j in first if j < self.num_iterations and j not in self.generated_before]

    def lands_ahead(self, k: int) -> bool:
        """Whether the weights of version ``k + 1`` land in the rollout during iteration ``k`` (partial rollout, every
        iteration but the last): its heads decode on with them and carry their requests into iteration ``k + 1``,
        whose gate then syncs the scorers only."""
        return self.partial and k + 1 < self.num_iterations

    def epoch(self, n: int, rt: WorkerRuntime) -> Epoch:
        """Epoch ``n`` (cached; the one in force comes from the runtime)."""
        if rt.epoch is not None and rt.epoch.epoch == n:
            return rt.epoch
        if n not in self._epochs:
            self._epochs[n] = read_epoch_file(self.paths, n)
        return self._epochs[n]

    # -- epoch transitions ----------------------------------------------------------------------
    def transition(self, old: Epoch | None, new: Epoch, rt: WorkerRuntime) -> dict[str, Any]:
        """Role change at a safe point: engines are built, parked or woken for the new roles,
        released rollout ranks hand their requests back. The actor's state moves later, at the
        mini-batch boundary stamped with an epoch that changes the actor (or an iteration start)."""
        start = time.monotonic()
        figures = dict(self.compute.on_roles(old, new))
        if self._iteration is not None:
            figures.update(self._iteration.on_transition(old, new))
        figures.setdefault("bytes_moved", 0)
        figures["seconds"] = time.monotonic() - start
        return figures

    def move_actor(self, new: list[int], epoch: int, k: int, rt: WorkerRuntime, tp: int | None = None) -> None:
        """Reshard the actor's state to ranks ``new`` at TP ``tp`` (default: unchanged) when either
        differs (every rank calls; the union acts)."""
        old, old_tp = self.actor_ranks, self.actor_tp
        new_tp = int(tp or old_tp)
        if not new or (new == old and new_tp == old_tp):
            return
        if self.info.rank in set(old) | set(new):
            started = time.time()
            fault_point("reshard", rank=self.info.rank, epoch=epoch, iteration=k)
            with collective(f"reshard of the actor {old} (TP {old_tp}) -> {new} (TP {new_tp})", self.info, epoch, k):
                figures = self.compute.reshard(old, new, epoch, old_tp=old_tp, new_tp=new_tp)
            write_reshard(self.paths, epoch, self.info.rank, self.info.host, {
                **figures, "iteration": k, "old": old, "new": new, "old_tp": old_tp, "new_tp": new_tp,
                "started_at": started, "done_at": time.time()})
        self.actor_ranks, self.actor_tp = list(new), new_tp

    # -- one iteration --------------------------------------------------------------------------
    def run_iteration(self, iteration: int, rt: WorkerRuntime) -> None:
        """This rank's share of ``iteration`` for whatever roles it holds while it runs."""
        assert rt.epoch is not None
        start = self.epoch(rt.released_epoch if rt.released_epoch is not None else rt.epoch.epoch, rt)
        self.gate.before_iteration()
        before = list(self.actor_ranks)
        self.move_actor(sorted(start.ranks_of("actor")), start.epoch, iteration, rt, tp=start.tp_of("actor"))
        rollout = sorted(start.ranks_of("rollout"))
        # the inference ranks score with the iteration's actor weights (algorithm.old_logprobs: actor)
        # and the critic's (gae: its values)
        scorers = (sorted(start.ranks_of("inference"))
                   if self.cfg.algorithm.old_logprobs == "actor" or needs_critic(self.cfg.algorithm) else [])
        # Collocated at actor TP 1, every actor rank holds the full weights: its own engines take them in
        # place, and the broadcast goes from the source to the ranks outside the actor only.
        local = set(self.actor_ranks) if self.actor_tp == 1 else {self.actor_ranks[0]}
        # partial rollout: the rollout took these weights while it decoded, in the iteration before
        landed = set(rollout) if iteration > self.first_iteration and self.lands_ahead(iteration - 1) else set()
        receivers = ({*rollout, *scorers} - landed) if rollout else set()
        # TP vLLM engines over rollout ranks take their shards point to point instead of the broadcast
        sharded = (self._sharded_engines([r for r in rollout if r not in landed], local | {self.actor_ranks[0], *scorers})
                   if rollout else [])
        shard_ranks = {r for engine in sharded for r in engine}
        ranks = sorted({self.actor_ranks[0], *(receivers - local - shard_ranks)}) if rollout else []
        in_place = self.info.rank in receivers and self.info.rank not in ranks and self.info.rank not in shard_ranks
        gather = self.actor_ranks[:self.actor_tp] if rollout else []  # the source's TP group
        if self.info.rank in ranks or in_place or self.info.rank in shard_ranks:
            fault_point("weight_sync", rank=self.info.rank, iteration=iteration)
        sync = {}
        if self.info.rank in ranks or self.info.rank in gather or in_place or self.info.rank in shard_ranks:
            to = f"{ranks}" + (f" and the shards of engines {sharded}" if sharded else "")
            with collective(f"weight sync v{iteration} from rank {self.actor_ranks[0]} to {to}", self.info,
                            start.epoch, iteration):
                sync = self.compute.sync_weights(iteration, self.actor_ranks[0], ranks, gather, in_place=in_place,
                                                 sharded=sharded)
        if self.critic_ranks:
            sync = self._sync_critic(iteration, start, sync)
        if rollout and self.info.rank == rollout[0] and eval_due(self.cfg.eval.every, iteration):
            figures = self.compute.evaluate(iteration)  # the weights v{iteration} just received
            if figures is not None:
                write_eval(self.run_dir, iteration, figures)
        self._iteration = _Iteration(self, iteration, rt, start, sync, before)  # writes the expected producers
        samples = self.samples_per_iteration
        granted = self.gate.enter(iteration, rt.check, lambda: rollout_complete(self.run_dir, iteration, samples))
        if not granted and self._iteration.rollout is not None:  # the job's rollout ended on other slots
            self._iteration.rollout.skip()
        try:
            self._iteration.run()
        finally:
            self._iteration = None
        self.gate.after_iteration()

    def _sharded_engines(self, rollout: list[int], full: set[int]) -> list[list[int]]:
        """The TP vLLM engines over rollout ranks (``slurm_rl.engines.rollout.tp_host``) that receive only their
        shards: whole engines none of whose ranks needs the full weights (``full``: the source, actor ranks that
        hold them, scorers). None on the emulated device or with engines of one rank."""
        per = self.rollout_tp
        if per <= 1 or self.cfg.rollout.backend != "vllm" or self.cfg.runtime.device == "emulated":
            return []
        engines = [rollout[i:i + per] for i in range(0, len(rollout) - len(rollout) % per, per)]
        return [engine for engine in engines if not set(engine) & full]

    def _sync_critic(self, k: int, start: Epoch, sync: dict[str, Any]) -> dict[str, Any]:
        """The critic on ranks of its own: its weights of the iteration's start (it has trained every
        mini-batch of the iteration before) from its first rank to the ranks that score the values: the
        inference ranks, else the actor's leader. The figures add to this rank's weight-sync figures."""
        scorers = sorted(start.ranks_of("inference")) or [self.actor_ranks[0]]
        src = self.critic_ranks[0]
        ranks = sorted({src, *scorers})
        gather = self.critic_ranks[:self.critic_tp]  # the source's TP group gathers the full critic
        if self.info.rank not in ranks and self.info.rank not in gather:
            return sync
        with collective(f"critic sync v{k} from rank {src} to {scorers}", self.info, start.epoch, k):
            figures = self.compute.sync_critic(k, src, ranks, gather)
        return {**sync, **{key: float(sync.get(key) or 0) + float(figures.get(key) or 0) for key in ("seconds", "bytes")}}

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, directory: Path, iteration: int) -> None:
        """This rank's part of the run checkpoint at the gate of ``iteration`` (the actor's state
        by its DP rank 0, the critic's by its; the data plane is not saved: a resumed run re-runs the
        iteration), and on rank 0 the samples an asynchronous run drew ahead of the gate (the replay buffer)."""
        fault_point("rank_checkpoint", rank=self.info.rank, iteration=iteration)
        with collective(f"checkpoint of the actor into {directory}", self.info, None, iteration):
            self.compute.save_state(directory, iteration)
        if self.max_staleness and self.info.rank == 0:  # the samples drawn ahead of this gate: its replay buffer
            # (complete iterations only: with partial rollout some may still decode; a resumed run draws them anew)
            ahead = range(iteration, min(iteration + self.lead, self.num_iterations))
            save_replay(self.run_dir, directory,
                        [j for j in ahead if rollout_complete(self.run_dir, j, self.samples_per_iteration)])

    def restore(self, directory: Path) -> None:
        """Load the state of a run checkpoint (before the first epoch of a resumed incarnation)."""
        self.compute.load_state(directory)

    def close(self, finished: bool = True) -> None:
        self.compute.close(finished)


class _Requests:
    """The requests of one iteration, generation batch by generation batch, as every rank builds them alike
    (the data order is a function of the seed and the prompts drawn before)."""

    def __init__(self, it: "_Iteration", j: int | None = None) -> None:
        self.it, self.p = it, it.p
        self.j = it.k if j is None else j  # the iteration whose requests (it trains them)
        self._batches: list[pa.Table] = []  # the requests of each generation batch fetched so far
        self._position: int | None = None  # dynamic sampling: stream position of the iteration's first prompt

    def _stream_position(self) -> int:
        """Dynamic sampling: where iteration ``k``'s prompts start (the prompts the iterations before
        drew, from their metrics rows: written by their leaders before this iteration began)."""
        if self._position is None:
            k, run_dir, per = self.j, self.p.run_dir, self.p.cfg.train.rollout_batch_size
            if k > 0:
                self.it.rt.wait_for(lambda: any(r.get("iteration") == k - 1 for r in read_metrics(run_dir)),
                                    f"iteration {k - 1}'s row of {run_dir / 'metrics.jsonl'} (the prompts it drew)")
            self._position = prompts_before(read_metrics(run_dir), k, per)
        return self._position

    def of_batch(self, b: int) -> pa.Table:
        """The requests of generation batch ``b`` (PENDING rows)."""
        while len(self._batches) <= b:
            n = len(self._batches)
            position = self._stream_position() + n * self.p.batch_prompts if self.p.filtering else None
            self._batches.append(self.p.compute.requests(self.j, n, position))
        return self._batches[b]

    def of_samples(self, sample_ids: list[int]) -> pa.Table:
        """The requests of ``sample_ids`` (of any generation batch), in that order."""
        per_batch = self.p.batch_prompts * self.p.cfg.train.group_size
        wanted = {}
        for sid in sample_ids:
            b = (sid % ID_STRIDE) // per_batch
            table = self.of_batch(b)
            wanted[sid] = table.slice((sid % ID_STRIDE) - b * per_batch, 1)
        return pa.concat_tables([wanted[sid] for sid in sample_ids]) if sample_ids else self.of_batch(0).slice(0, 0)


class _Draw:
    """What one rank draws of the samples of one iteration ``j``: its claims, its writer, its rows in flight."""

    def __init__(self, it: "_Iteration", j: int) -> None:
        self.it, self.p, self.j = it, it.p, j
        self.claims_dir = stage_dir(self.p.run_dir, j, REQUESTS_STAGE)
        os.makedirs(self.claims_dir, mode=0o700, exist_ok=True)
        self.requests = _Requests(it, j)
        self.cursor = 0  # next chunk of the iteration's requests to try to claim
        self.opened, self.closed = 1, not self.p.filtering  # generation batches open; no more to come
        self.next_rounds_check = 0.0
        self.in_flight = 0  # rows claimed by this rank and not written (nor handed back) yet
        self.writer: StageWriter | None = None
        self.ended = False  # this rank's manifest of the iteration is complete

    def stage_writer(self) -> StageWriter:
        if self.writer is None:
            self.writer = StageWriter(self.p.run_dir, self.j, ROLLOUTS_STAGE, self.it.rank, ROLLOUTS)
        return self.writer

    def batch_open(self, b: int, now: float) -> bool:
        """Whether generation batch ``b`` is open (batch 0 always; later ones once the leader opens them)."""
        if b < self.opened:
            return True
        if self.closed or now < self.next_rounds_check:
            return False
        self.next_rounds_check = now + CLAIM_EVERY_S
        self.opened, self.closed = read_rounds(self.p.run_dir, self.j)
        return b < self.opened

    def end(self) -> None:
        self.stage_writer().close()
        self.ended = True


def _by_iteration(table: pa.Table) -> dict[int, pa.Table]:
    """``table``'s rows per iteration of their sample ids (in order)."""
    its = pc.divide(table.column("sample_id"), pa.scalar(ID_STRIDE, pa.int64()))
    return {int(j): table.filter(pc.equal(its, j)) for j in pc.unique(its).to_pylist()}


class _Rollout:
    """Rollout work of one rank in one iteration (only instance head ranks decode): the samples of the
    iterations ``js`` (:meth:`IterationProtocol.generated_in`: the running iteration ``k``, or in an asynchronous
    run those up to ``algorithm.max_staleness`` ahead), decoded by one engine with the weights of version ``k``.
    The rank claims the requests of each iteration in turn and takes the next one's as soon as the last chunk of
    the one before is claimed (continuous batching across iterations); a rank's manifest of iteration ``j`` is
    complete once every sample of ``j`` is written somewhere and it holds none of them."""

    def __init__(self, it: "_Iteration", js: list[int] | None = None) -> None:
        self.it = it
        self.p = it.p
        self.draws = [_Draw(it, j) for j in (js if js is not None else [it.k])]
        self.current = 0  # the draw whose requests this rank claims now
        self.decoder: Decoder | None = None
        self.queue: list[pa.Table] = []  # claimed, not admitted yet
        self.queued = 0
        self.out: list[pa.Table] = []  # finished, not written yet
        self.out_since = 0.0
        self.finished = 0
        self.migrated_out = 0
        self.length_hist: dict[int, int] = {}  # finished responses per length bucket (for the scheduler)
        self.longest = 0
        self.done = False
        self.left = False
        self.next_claim = 0.0
        self.next_done_check = 0.0
        self.ticket_rows = max(1, self.p.max_running // 8)
        self.batch_rows = self.p.batch_prompts * self.p.cfg.train.group_size
        self.chunks_per_batch = math.ceil(self.batch_rows / self.ticket_rows)

    @property
    def held(self) -> int:
        return (self.decoder.held() if self.decoder else 0) + self.queued

    def _land(self) -> None:
        """The decoder's landing hook (at a token boundary): the running iteration's landing, where it has one."""
        if self.it.landing is not None:
            self.it.landing.take()

    def carry_into(self, it: "_Iteration", js: list[int]) -> None:
        """Partial rollout: go on in iteration ``it`` (the draws not ended, their requests still held or decoding)
        and start drawing the iterations ``js`` there."""
        # the draw claimed now keeps its place (one ended by settle_before_carry may not have been passed yet)
        self.current = sum(1 for d in self.draws[:self.current] if not d.ended)
        self.it = it
        self.draws = [d for d in self.draws if not d.ended] + [_Draw(it, j) for j in js]
        for d in self.draws:
            d.it = d.requests.it = it
        self.done = False

    def settle_before_carry(self) -> None:
        """End the draws of the iterations up to the running one (trained whole: every sample is written)."""
        for d in self.draws:
            if not d.ended and d.j <= self.it.k:
                if d.in_flight:
                    raise ProtocolError(f"rank {self.it.rank}: iteration {self.it.k} trained with {d.in_flight} "
                                        f"requests of iteration {d.j} still held here")
                d.end()

    def _draw(self, j: int) -> _Draw:
        return next(d for d in self.draws if d.j == j)

    def _take(self, got: pa.Table) -> None:
        if got.num_rows:
            self.queue.append(got)
            self.queued += got.num_rows
            for j, rows in _by_iteration(got).items():
                self._draw(j).in_flight += rows.num_rows

    def _admit(self, now: float) -> None:
        assert self.decoder is not None
        n = min(self.decoder.free_slots(), self.queued)
        if n <= 0:
            return
        merged = pa.concat_tables([t.cast(PENDING) for t in self.queue]).combine_chunks()
        self.decoder.admit(merged.slice(0, n), now)
        rest = merged.slice(n)
        self.queue, self.queued = ([rest] if rest.num_rows else []), rest.num_rows

    def _claim_initial(self, want: int, now: float) -> int:
        """Claim chunks of the requests (one exclusive marker file per chunk: exactly one rank wins each chunk,
        and every rank tries each chunk in order, so none is skipped), generation batch by generation batch as
        they open, iteration by iteration; returns the rows claimed."""
        got = 0
        while got < want and self.current < len(self.draws):
            d = self.draws[self.current]
            c = d.cursor
            b, i = divmod(c, self.chunks_per_batch)
            if not d.batch_open(b, now):
                if d.closed and b >= d.opened:  # every chunk of this iteration is claimed: the next one's
                    self.current += 1
                    continue
                break
            d.cursor += 1
            try:
                fd = os.open(d.claims_dir / f"claim-{c:06d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                continue
            os.write(fd, str(self.it.rank).encode())
            os.close(fd)
            chunk = d.requests.of_batch(b).slice(i * self.ticket_rows, self.ticket_rows)
            self._take(chunk)
            got += chunk.num_rows
        return got

    def _claim(self, now: float) -> None:
        want = self.p.max_running + self.ticket_rows - self.held
        if self.held > self.p.max_running or want <= 0:
            return
        want -= self._claim_initial(want, now)
        if want <= 0 or now < self.next_claim:
            return
        got_any = False
        for d in self.draws[:self.current + 1]:  # migrated requests
            if d.ended or want <= 0:
                continue
            got = claim_pending(self.p.run_dir, d.j, self.it.rank, max_rows=want)
            self._take(got)
            want -= got.num_rows
            got_any = got_any or got.num_rows > 0
        self.next_claim = now + (0.0 if got_any else CLAIM_EVERY_S)

    def _flush(self) -> None:
        if not self.out:
            return
        table = pa.concat_tables([t.cast(ROLLOUTS) for t in self.out]).combine_chunks()
        for j, rows in _by_iteration(table).items():
            d = self._draw(j)
            d.stage_writer().write(rows)
            d.in_flight -= rows.num_rows
        self.finished += table.num_rows
        for n in pc.list_value_length(table.column("response_ids")).to_pylist():
            b = length_bucket(int(n or 0))
            self.length_hist[b] = self.length_hist.get(b, 0) + 1
            self.longest = max(self.longest, int(n or 0))
        self.out = []

    def _collect(self, finished: pa.Table | None, now: float) -> None:
        if finished is not None and finished.num_rows:
            if not self.out:
                self.out_since = now
            self.out.append(finished)

    def _end_finished(self, now: float) -> None:
        """Complete this rank's manifest of each iteration it has nothing left of, once every sample of that
        iteration is written (a rank released elsewhere may still hand requests back until then)."""
        if now < self.next_done_check:
            return
        self.next_done_check = now + DONE_CHECK_EVERY_S
        for i, d in enumerate(self.draws):
            if d.ended or i >= self.current or d.in_flight > 0:
                continue
            if generation_complete(self.p.run_dir, d.j, self.it.samples, self.p.filtering, self.batch_rows):
                d.end()

    def skip(self) -> None:
        """Nothing left to do here (the iteration's rollout ended elsewhere): empty manifests."""
        for d in self.draws:
            if not d.ended:
                d.end()
        self.done = True

    def step(self, now: float) -> float | None:
        """Decode up to ``now``, refill, publish; the wall time of the next event."""
        if self.done:
            return None
        for d in self.draws:
            d.stage_writer()
        if self.decoder is None:
            landing = self.it.landing
            self.decoder = self.p.compute.decoder(self.it.k, self._land if landing and landing.takes else None)
        self._collect(self.decoder.advance(now), now)
        now = time.time()  # a real engine spent time in advance()
        self._admit(now)
        self._claim(now)
        self._admit(now)
        out_rows = sum(t.num_rows for t in self.out)
        if self.out and (out_rows >= self.ticket_rows or now - self.out_since >= FLUSH_EVERY_S or not self.held):
            self._flush()
        if not self.out:
            self._end_finished(now)
        if all(d.ended for d in self.draws):
            self.done = True
            return None
        wakes = [t for t in (self.decoder.next_event_at(), self.out_since + FLUSH_EVERY_S if self.out else None) if t]
        if self.held <= self.p.max_running:
            wakes.append(max(now, self.next_claim))
        if not self.held and not self.out:
            wakes.append(self.next_done_check)
        return min(wakes) if wakes else None

    def hand_back(self, grant: int) -> int:
        """Leave rollout as group grant ``grant`` revoked this rank's slot; rows migrated."""
        return self.release(REVOKE_TAG + grant, time.time())

    def release(self, epoch: int, now: float) -> int:
        """Leave rollout: publish finished samples, hand unfinished requests back; rows migrated."""
        if self.done or self.left:
            return 0
        self.left = True
        unfinished: list[pa.Table] = []
        if self.decoder is not None:
            finished, evicted = self.decoder.evict(now, epoch)
            self._collect(finished, now)
            if evicted is not None and evicted.num_rows:
                unfinished.append(evicted)
        self._flush()
        unfinished.extend(self.queue)
        self.queue, self.queued = [], 0
        migrated = 0
        if unfinished:
            rest = pa.concat_tables([t.cast(PENDING) for t in unfinished]).combine_chunks()
            for j, rows in _by_iteration(rest).items():
                write_pending(self.p.run_dir, j, self.it.rank, rows, tag=epoch,
                              num_chunks=math.ceil(rows.num_rows / self.ticket_rows))
                self._draw(j).in_flight -= rows.num_rows
            migrated = rest.num_rows
        self.skip()
        self.migrated_out += migrated
        return migrated


class _Landing:
    """Partial rollout in iteration ``k``: the weights of version ``k + 1`` reach the rollout heads while they draw
    iteration ``k + 1``. The actor's first rank posts a marker once it has trained the iteration's last mini-batch,
    then broadcasts; each head joins once it sees the marker: inside a generation at a token boundary (its decoder's
    landing hook: the engine recomputes the KV cache and decodes on) or from its loop where it holds no request.
    Neither side ends the iteration before it has taken part."""

    def __init__(self, it: "_Iteration") -> None:
        p = it.p
        self.it, self.version = it, it.k + 1
        self.src, self.gather = p.actor_ranks[0], p.actor_ranks[:p.actor_tp]
        self.heads = rollout_heads(it.start_rollout, p.rollout_tp)
        self.ranks = sorted({self.src, *self.heads})
        self.marker = stage_dir(p.run_dir, it.k, ACTOR_STAGE) / f"weights-v{self.version}.json"
        self.sends, self.takes = it.rank in self.gather, it.rank in self.heads
        self.done = not (self.sends or self.takes)
        self.next_look = 0.0

    def send(self) -> None:
        """The actor's side, once this rank has trained the iteration's last mini-batch."""
        if self.done or not self.sends or not self.it.actor.done:
            return
        if self.it.rank == self.src:
            self.marker.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.marker, {"version": self.version, "src": self.src, "ranks": self.ranks,
                                            "posted_at": time.time()}, durable=False)
        self._sync()

    def take(self) -> None:
        """A rollout head's side: land the weights once the marker is there (looked for once per poll interval)."""
        if self.done or not self.takes or time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + self.it.p.poll
        if not self.marker.exists():
            return
        self._sync()
        rollout = self.it.rollout
        if rollout is not None and rollout.decoder is not None:
            rollout.decoder.land(self.version, time.time())

    def take_from_loop(self) -> None:
        """:meth:`take`, unless the head's decoder lands inside its generations and holds requests (they will)."""
        rollout = self.it.rollout
        decoder = rollout.decoder if rollout is not None else None
        if decoder is None or not decoder.lands_between_tokens or not rollout.held:
            self.take()

    def _sync(self) -> None:
        it = self.it
        with collective(f"weight sync v{self.version} from rank {self.src} to the decoding rollout ranks {self.heads}",
                        it.p.info, it.start.epoch, it.k):
            it.p.compute.land_weights(self.version, self.src, self.ranks, self.gather)
        self.done = True


class _Reward:
    """Reward work of one rank where the reward is placed apart from the rollout: its hash share of the
    rollouts shards, scored in its reward worker processes and written to the rewards stage."""

    def __init__(self, it: "_Iteration", ranks: list[int]) -> None:
        self.it, self.ranks = it, ranks
        self.follower = StageFollower(it.p.run_dir, it.k, ROLLOUTS_STAGE)
        self.writer = StageWriter(it.p.run_dir, it.k, REWARDS_STAGE, it.rank, ROLLOUTS)
        self.requests = _Requests(it)
        self.done_rows = 0
        self.done = False

    def step(self) -> None:
        """Reward the shards of this rank's share that arrived; done once the rollouts stage is complete."""
        index = self.ranks.index(self.it.rank)
        for producer, seq, table in self.follower.poll():
            if (producer * 1_000_003 + seq) % len(self.ranks) == index:
                ids = table.column("sample_id").to_pylist()
                requests = self.requests.of_samples(ids)
                if requests.column("sample_id").to_pylist() != ids:
                    raise ProtocolError(f"rank {self.it.rank}: the requests rebuilt for the rewards of iteration "
                                        f"{self.it.k} are not those of rollouts shard {seq} of rank {producer}")
                scored = self.it.p.compute.reward(self.it.k, table, requests)
                self.writer.write(scored)
                self.done_rows += scored.num_rows
        if self.follower.complete:
            self.writer.close()
            self.done = True


class _Inference:
    """Inference work of one rank: its hash share of the shards of the rollouts (or rewards) stage."""

    def __init__(self, it: "_Iteration", ranks: list[int]) -> None:
        self.it = it
        self.ranks = ranks
        self.follower = StageFollower(it.p.run_dir, it.k, it.upstream)
        self.queue: list[pa.Table] = []
        self.inflight: tuple[float, pa.Table] | None = None
        self.writer = StageWriter(it.p.run_dir, it.k, INFERENCE_STAGE, it.rank, INFERENCE)
        self.done_rows = 0
        self.busy_s = 0.0  # seconds this rank spent scoring (for the scheduler's forecast)
        self.done = False
        # the iteration's samples were drawn before it (an asynchronous run): its share is scored in sample order,
        # so every inference rank completes the lowest groups first and the first mini-batch is ready early
        self.in_order = it.k not in it.generates

    def _land(self, now: float) -> None:
        if self.inflight is not None and now >= self.inflight[0]:
            self.writer.write(self.inflight[1])
            self.done_rows += self.inflight[1].num_rows
            self.inflight = None

    def step(self, now: float) -> float | None:
        if self.done:
            return None
        rollout = self.it.rollout
        if rollout is not None and not rollout.done:
            return None  # collocated with this rank's rollout: its inference phase comes after it
        index = self.ranks.index(self.it.rank)
        for producer, seq, table in self.follower.poll():
            if (producer * 1_000_003 + seq) % len(self.ranks) == index:
                self.queue.append(table)
        self._land(now)
        if self.inflight is None and self.queue:
            # One batch of up to global_batch_size samples at a time, as the simulator does.
            gbs = self.it.p.cfg.train.global_batch_size
            if self.in_order:
                merged = pa.concat_tables(self.queue).combine_chunks()
                merged = merged.take(pc.sort_indices(merged, [("sample_id", "ascending")]))
                batch, rest = merged.slice(0, gbs), merged.slice(gbs)
                self.queue = [rest] if rest.num_rows else []
            else:
                tables, rows = [], 0
                while self.queue and (not tables or rows + self.queue[0].num_rows <= gbs):
                    tables.append(self.queue.pop(0))
                    rows += tables[-1].num_rows
                batch = pa.concat_tables(tables).combine_chunks()
            shared = self.it.interleaved and self.it.shared_rank  # one thing at a time: after the mini-batch stamped
            at = max(now, self.it.training_until()) if shared else now
            self.inflight = self.it.p.compute.score(self.it.k, batch, at, len(self.ranks))[::-1]
            self.busy_s += max(0.0, self.inflight[0] - at)
            if shared and self.inflight[0] > time.time():  # a predicted end (the cutter's next stamp starts after it)
                atomic_write_json(self.it.scoring_path(self.it.rank), {"until": self.inflight[0]}, durable=False)
            self._land(time.time())
        if self.inflight is None and not self.queue and self.follower.complete:
            self.writer.close()
            self.done = True
            return None
        return self.inflight[0] if self.inflight is not None else None


class _Cutter:
    """Cuts whole groups into stamped mini-batches once the previous mini-batch was trained."""

    def __init__(self, it: "_Iteration", source: str) -> None:
        self.it = it
        self.source = source
        self.follower = StageFollower(it.p.run_dir, it.k, source)
        # No inference component, yet a KL to weigh or a critic's values to take: this rank (the actor's
        # leader) scores them itself, as verl's and RLinf's actor workers do without a separate worker.
        self.scores_reference = source != INFERENCE_STAGE and (uses_reference(it.p.cfg.algorithm)
                                                              or needs_critic(it.p.cfg.algorithm))
        self.scoring: list[tuple[float, pa.Table]] = []  # scored here: (ready at, rows) in arrival order
        self.buffer: list[pa.Table] = []  # received, not cut yet
        self.group_rows: dict[int, int] = {}  # samples received per group not cut yet
        self.complete: list[int] = []  # complete groups in completion order
        self.ready_rows = 0
        self.received = 0  # samples received this iteration (they finished rollout and inference)
        self.cut = 0
        self.prev_end: float | None = 0.0  # predicted end of the last mini-batch (None: not known)
        self.plan: list[dict[str, Any]] = []
        self.rewards: list[float] = []
        self.response_lengths: list[int] = []  # tokens of each response (verl's response_length/mean)
        # per staleness s, the samples trained at iteration k whose rollout started from the weights of
        # iteration k - s (their rows' weight_version): 0 for every sample of a synchronous run
        self.staleness: collections.Counter[int] = collections.Counter()
        self.mixed_versions = 0  # samples drawn by more than one version (partial rollout: weights landed mid-way)
        self.prompts: dict[int, list[int]] = {}  # group id -> prompt ids: which prompts the iteration trained on
        self.kl: list[float] = []
        self.mismatch_kl: list[float] = []  # per response: KL(rollout || actor) (algorithm.old_logprobs: actor)
        self.mismatch_max = 0.0
        self.kl_coef = self._kl_coef()  # of the KL in the reward (algorithm.use_kl_in_reward), else None
        self.current_kl: list[float] = []  # per response: its mean KL per token (an adaptive kl_ctrl's input)
        self.started = time.monotonic()
        self.writer = StageWriter(it.p.run_dir, it.k, ACTOR_STAGE, it.rank, ACTOR_BATCH)
        self.group_size = it.p.cfg.train.group_size
        self.gbs = it.p.cfg.train.global_batch_size
        self.whole_groups = self.gbs % self.group_size == 0
        # DAPO's dynamic sampling (rl.filter_groups): groups classified as they complete
        self.filtering = it.p.filtering
        self.group_values: dict[int, list[float]] = {}  # the metric of each response received, per group
        self.kept_groups = 0  # complete groups whose responses differ (cut or not, beyond the need too)
        self.dropped: set[int] = set()  # complete groups whose responses all had the same metric
        self.groups_done = 0  # complete groups, kept or dropped
        self.opened, self.closed = 1, not self.filtering  # generation batches opened; generation closed
        self.scan = 0  # index order under filtering: the next prompt index to look at
        self.per_pass = it.samples // self.gbs  # mini-batches of one pass; it.minibatches counts every pass
        self.passes: list[pa.Table] = []  # the first pass's actor batches, kept for the later ones
        self.boundary_at: float | None = None
        # Actor ranks of the last stamped mini-batch; a move at the iteration start is charged to
        # the first mini-batch (where the cost model knows the time in advance).
        self.last_actor = list(it.actor_before)

    def _kl_coef(self) -> float | None:
        """This iteration's ``kl_ctrl`` coefficient; an adaptive one waits for the previous iteration's
        metrics row (written by that iteration's leader, perhaps another rank)."""
        al, k, run_dir = self.it.p.cfg.algorithm, self.it.k, self.it.p.run_dir
        if not al.use_kl_in_reward:
            return None
        if al.kl_ctrl.type == "adaptive" and k > 0:
            self.it.rt.wait_for(lambda: any(r.get("iteration") == k - 1 for r in read_metrics(run_dir)),
                                f"iteration {k - 1}'s row of {run_dir / 'metrics.jsonl'} (the adaptive kl_ctrl's input)")
        return kl_coef_of_iteration(read_metrics(run_dir), k, al.kl_ctrl)

    def _receive(self, table: pa.Table, now: float) -> None:
        """A shard of the followed stage: straight to the buffer, or first scored by the reference."""
        if self.scores_reference:
            self.scoring.append(self.it.p.compute.score(self.it.k, table, now, 1)[::-1])
        else:
            self._take(without_reference(table, self.it.rank) if self.source != INFERENCE_STAGE else table)

    def _land(self, now: float) -> float | None:
        """Buffer the shards scored by ``now`` (in order); when the next one is due, else None."""
        while self.scoring and self.scoring[0][0] <= now:
            self._take(self.scoring.pop(0)[1])
        return self.scoring[0][0] if self.scoring else None

    def _take(self, table: pa.Table) -> None:
        """Buffer a shard; count the samples of each group (a group is ready once complete)."""
        self.buffer.append(table)
        self.received += table.num_rows
        if not self.whole_groups:
            self.ready_rows += table.num_rows
            return
        values = self._metric(table) if self.filtering else None
        for i, g in enumerate(table.column("group_id").to_pylist()):
            n = self.group_rows.get(g, 0) + 1
            self.group_rows[g] = n
            if values is not None:
                self.group_values.setdefault(g, []).append(values[i])
            if n == self.group_size:
                if values is not None and not keeps(self.group_values.pop(g)):
                    self.dropped.add(g)
                    del self.group_rows[g]
                else:
                    self.kept_groups += 1
                    self.complete.append(g)
                    self.ready_rows += n
                self.groups_done += 1
        if self.filtering:
            self._decide_generation()

    def _metric(self, table: pa.Table) -> list[float]:
        cfg = self.it.p.cfg
        lengths = pc.list_value_length(table.column("response_ids")).to_pylist()
        return group_metric(table.column("reward").to_pylist(), lengths, cfg.algorithm.filter_groups.metric,
                            cfg.reward.overlong_buffer, cfg.rollout.max_new_tokens)

    def _decide_generation(self) -> None:
        """Dynamic sampling: close generation once enough groups are kept; else, once every group of
        the open generation batches is complete, open the next one (or fail at the configured limit)."""
        if self.closed:
            return
        p, k = self.it.p, self.it.k
        wanted = p.cfg.train.rollout_batch_size
        if self.kept_groups >= wanted:
            self.closed = True
        elif self.groups_done >= self.opened * p.batch_prompts:
            fg = p.cfg.algorithm.filter_groups
            if fg.max_num_gen_batches and self.opened >= fg.max_num_gen_batches:
                raise DynamicSamplingExhausted(
                    f"iteration {k}: dynamic sampling kept {self.kept_groups} of the {wanted} groups it needs after "
                    f"{self.opened} generation batches of {p.batch_prompts} prompts (algorithm.filter_groups."
                    f"max_num_gen_batches = {fg.max_num_gen_batches}); the other groups' responses all had the same "
                    f"{fg.metric}: raise the limit (0: none), or check that the reward tells the responses apart")
            self.opened += 1
        else:
            return
        write_rounds(p.run_dir, k, self.opened, self.closed)

    @property
    def grouped(self) -> int:
        """Samples received in complete groups (cut or not): the data mini-batches are cut from."""
        return self.ready_rows + min(self.cut, self.per_pass) * self.gbs

    def _next_groups(self) -> list[int] | None:
        """The groups of the next mini-batch, or None while they are not all complete."""
        n = self.gbs // self.group_size
        if not self.it.p.index_order:
            return self.complete[:n] if len(self.complete) >= n else None
        if self.filtering:  # the next n kept groups in index order, once every group before them is complete
            done, take, i = set(self.complete), [], self.scan
            while len(take) < n:
                g = self.it.k * ID_STRIDE + i
                if g in done:
                    take.append(g)
                elif g not in self.dropped:
                    return None
                i += 1
            self.scan = i  # the caller cuts these groups now
            return take
        base = self.it.k * ID_STRIDE + self.cut * n
        want = [base + i for i in range(n)]
        done = set(self.complete)
        return want if all(g in done for g in want) else None

    def _cut_batch(self) -> pa.Table | None:
        """The next ``gbs`` samples: whole groups (completion or index order), else arrival order."""
        if not self.whole_groups:
            if self.ready_rows < self.gbs:
                return None
            merged = pa.concat_tables(self.buffer).combine_chunks()
            batch, rest = merged.slice(0, self.gbs), merged.slice(self.gbs)
        else:
            take = self._next_groups()
            if take is None:
                return None
            taken = set(take)
            self.complete = [g for g in self.complete if g not in taken]
            for g in take:
                del self.group_rows[g]
            merged = pa.concat_tables(self.buffer).combine_chunks()
            mask = pc.is_in(merged.column("group_id"), value_set=pa.array(take, pa.int64()))
            batch, rest = merged.filter(mask), merged.filter(pc.invert(mask))
            batch = batch.take(pc.sort_indices(batch.column("sample_id")))
            if self.dropped:  # dynamic sampling: the dropped groups' rows leave the buffer too
                rest = rest.filter(pc.invert(pc.is_in(rest.column("group_id"),
                                                      value_set=pa.array(sorted(self.dropped), pa.int64()))))
        self.buffer = [rest] if rest.num_rows else []
        self.ready_rows -= batch.num_rows
        return batch

    def previous_done(self, now: float) -> bool:
        """The last stamped mini-batch was trained (predicted end passed, or its marker exists)."""
        if self.cut == 0:
            return True
        if self.prev_end is not None:
            return now >= self.prev_end
        return self.it.actor.trained_index >= self.cut - 1 or trained_marker(self.it.p.run_dir, self.it.k, self.cut - 1).exists()

    def _coordinator_saw_boundary(self, now: float) -> bool:
        """Mini-batch boundary handshake: the actor is idle and the next mini-batch is ready;
        let the coordinator consult the policy on that state (as the simulator does at the end
        of a mini-batch) before stamping the next one. Bounded by ``BOUNDARY_WAIT_S``."""
        if self.boundary_at is None:
            self.boundary_at = now
            self.it.report_now(now)
            return False
        if now - self.boundary_at > BOUNDARY_WAIT_S:
            return True
        status = read_coordinator_status(self.it.p.paths)
        return status is not None and (status.checked_at or 0.0) >= self.boundary_at

    @property
    def received_all(self) -> bool:
        """Every shard of the followed stage is received (and scored, where this rank scores)."""
        return self.follower.complete and not self.scoring

    @property
    def drained(self) -> bool:
        """Done receiving: under dynamic sampling the generation batch that filled the need may end
        after the last mini-batch was cut, and its groups still count."""
        return not self.filtering or self.received_all

    def step(self, now: float, rt: WorkerRuntime) -> float | None:
        if self.cut >= self.it.minibatches:
            if not self.drained:  # classified for the metrics row, never trained
                for _, _, table in self.follower.poll():
                    self._take(table)
                self._land(math.inf)
            return None
        for _, _, table in self.follower.poll():
            self._receive(table, now)
        scored_at = self._land(time.time())
        replay = self.cut >= self.per_pass  # a later pass (actor.ppo_epochs) over the first pass's mini-batches
        if not replay and self.ready_rows < self.gbs:
            return scored_at
        if self.it.collocated and not self.it.interleaved and not self.received_all:
            return scored_at  # collocated: training starts once the rollout (and inference) phase has ended
        if not self.previous_done(now):
            return self.prev_end if self.prev_end is not None else now + self.it.p.poll
        assert rt.epoch is not None
        if self.it.p.dynamic and not self._coordinator_saw_boundary(now):
            return now + self.it.p.poll
        actor = sorted(rt.epoch.ranks_of("actor"))
        if not actor:
            return None  # the actor holds no ranks yet (pre-process): the mini-batch waits
        if replay:  # the same samples, advantages and old log-probs, in the first pass's order
            batch = self.passes[self.cut % self.per_pass]
        else:
            cut = self._cut_batch()
            if cut is None:
                return None  # index order: the groups of the next mini-batch are not complete yet
            batch = self._first_pass_batch(cut)
        self.boundary_at = None
        tokens = count_tokens(batch, "response_ids") + count_tokens(batch, "prompt_ids")
        seconds = self.it.p.compute.predict_train_seconds(tokens, self.last_actor, actor)
        if seconds is not None and self.it.collocated and self.cut == 0:  # the shared ranks switch to training first
            seconds += self.it.p.compute.predict_switch_seconds() or 0.0
        start = max(now, self.it.scoring_until()) if self.it.interleaved else now  # after the shared ranks' scoring
        self.plan.append({"index": self.cut, "epoch": rt.epoch.epoch, "start_at": start, "seconds": seconds,
                          "ready_at": None if seconds is None else start + seconds, "rows": batch.num_rows,
                          "tokens": tokens, "dp": len(actor), "tp": rt.epoch.tp_of("actor"),  # dp: actor ranks
                          "resharded": actor != self.last_actor, "ppo_epoch": self.cut // self.per_pass})
        atomic_write_json(stage_dir(self.it.p.run_dir, self.it.k, ACTOR_STAGE) / PLAN_FILE,
                          {"iteration": self.it.k, "minibatches": self.plan}, durable=False)
        self.writer.write(batch)
        self.last_actor = actor
        self.cut += 1
        self.prev_end = None if seconds is None else start + seconds
        if self.cut == self.per_pass and not self.filtering:  # dynamic sampling leaves kept groups untrained
            left = sum(t.num_rows for t in self.buffer)
            if left:
                raise ProtocolError(
                    f"iteration {self.it.k}: {left} samples left over after "
                    f"cutting {self.cut} mini-batches of {self.gbs} (train.rollout_batch_size x train.group_size must be "
                    "a multiple of train.global_batch_size)")
        if self.cut >= self.it.minibatches:
            self.writer.close()
        return self.prev_end

    def _first_pass_batch(self, cut: pa.Table) -> pa.Table:
        """The actor batch of a newly cut mini-batch; its samples count in the iteration's figures
        (rewards, prompts, KL, mismatch) once, whatever the number of passes."""
        batch = make_actor_batch(cut, self.it.p.cfg.algorithm, self.kl_coef)
        if self.kl_coef is not None:  # verl's current_kl: the mean over responses of their mean KL per token
            sums = kl_in_reward(batch.column("old_logprobs").to_pylist(), batch.column("ref_logprobs").to_pylist(),
                                self.it.p.cfg.algorithm.kl_penalty)
            lengths = pc.list_value_length(batch.column("response_ids")).to_numpy(zero_copy_only=False)
            self.current_kl.extend(float(x) / n for x, n in zip(sums, lengths) if n > 0)
        self.rewards.extend(batch.column("reward").to_pylist())
        self.response_lengths.extend(pc.list_value_length(batch.column("response_ids")).to_pylist())
        self.staleness.update(self.it.k - v for v in batch.column("weight_version").to_pylist())
        self.mixed_versions += int(pc.sum(pc.not_equal(batch.column("weight_version"),
                                                       batch.column("weight_version_last"))).as_py() or 0)
        self.prompts.update(zip(batch.column("group_id").to_pylist(), batch.column("prompt_ids").to_pylist()))
        kl = mean_k3(batch.column("old_logprobs").to_pylist(), batch.column("ref_logprobs").to_pylist())
        if kl is not None:
            self.kl.append(kl)
        if cut.column("old_logprobs").null_count == 0:  # the actor's log-probs: how far the rollout's are
            kls, worst = mismatch(batch.column("old_logprobs").to_pylist(), cut.column("sampled_logprobs").to_pylist())
            self.mismatch_kl.extend(kls)
            self.mismatch_max = max(self.mismatch_max, worst)
        if self.it.minibatches > self.per_pass:
            self.passes.append(batch)
        return batch

    def in_flight(self, now: float) -> bool:
        """A stamped mini-batch is being trained."""
        return self.cut > 0 and not self.previous_done(now)


class _ActorFollower:
    """Every rank: walk the stamped mini-batches; reshard where the stamp moves the actor; train
    those whose stamp places this rank in the actor."""

    def __init__(self, it: "_Iteration", leader: int) -> None:
        self.it = it
        self.leader = leader
        self.manifest = manifest_path(it.p.run_dir, it.k, ACTOR_STAGE, leader)
        self.plan_path = stage_dir(it.p.run_dir, it.k, ACTOR_STAGE) / PLAN_FILE
        self.key: tuple[int, int] | None = None
        self.shards: list[Any] = []
        self.plan: list[dict[str, Any]] = []
        self.next = 0
        self.busy: tuple[float, int, dict[str, Any] | None] | None = None  # (ready at, index, marker doc)
        self.trained = 0
        self.trained_index = -1  # last mini-batch this rank trained

    @property
    def done(self) -> bool:
        return self.next >= self.it.minibatches

    def _refresh(self) -> None:
        key = stat_key(self.manifest)
        if key is None or key == self.key:
            return
        m = ProducerManifest.load(self.manifest, iteration=self.it.k, stage=ACTOR_STAGE, producer_rank=self.leader,
                                  known=self.shards)
        self.shards, self.key = m.shards, key
        if len(self.plan) < len(self.shards):
            self.plan = read_json(self.plan_path)["minibatches"]

    marker_path = staticmethod(trained_marker)

    def _finish(self) -> None:
        assert self.busy is not None
        _, index, marker = self.busy
        if marker is not None:
            atomic_write_json(self.marker_path(self.it.p.run_dir, self.it.k, index), marker, durable=False)
        self.busy = None
        self.trained += 1
        self.trained_index = index
        self.next += 1

    def _free(self, now: float) -> tuple[bool, float | None]:
        """Finish the step in flight once it is due; (True, None) when mini-batch ``self.next`` is stamped
        and this rank is free for it, else (False, when to look again: None for the next poll)."""
        while self.busy is not None:
            if now < self.busy[0]:
                return False, self.busy[0]
            self._finish()
            self.it.report_now(now)
        if not self.done and self.next >= len(self.shards):
            self._refresh()
        return not self.done and self.next < len(self.shards), None

    def step(self, now: float, rt: WorkerRuntime) -> float | None:
        p, rank = self.it.p, self.it.rank
        while not self.done:
            free, wake = self._free(now)
            if not free:
                return wake
            entry = self.plan[self.next]
            assert rt.epoch is not None
            if rt.epoch.epoch < entry["epoch"]:
                return now + p.poll  # the stamped epoch is not applied here yet
            stamped = p.epoch(int(entry["epoch"]), rt)
            actor = sorted(stamped.ranks_of("actor"))
            self.it.enter_training()  # a shared rank's actor state is back before any reshard or step
            p.move_actor(actor, int(entry["epoch"]), self.it.k, rt, tp=stamped.tp_of("actor"))
            if rank not in actor:
                self.next += 1
                continue
            info = self.shards[self.next]
            batch = open_shard(stage_dir(p.run_dir, self.it.k, ACTOR_STAGE) / info.name,
                               nbytes=info.bytes, digest=info.xxh3_64)
            self.it.report_now(now)
            with collective(f"training step {self.next} on actor ranks {actor}", p.info, rt.epoch.epoch, self.it.k):
                ready_at, stats = p.compute.train(self.it.k, self.next, batch, actor, entry.get("ready_at"))
            marker = {"index": self.next, "epoch": entry["epoch"], "dp": len(actor), "tp": p.actor_tp, "ranks": actor,
                      "done_at": ready_at, **stats} if rank == actor[0] else None
            self.busy = (ready_at, self.next, marker)
            now = time.time()
        return None


class _CriticFollower(_ActorFollower):
    """A rank of the critic's own: walk the stamped mini-batches and train the critic on each, over
    the critic's ranks (its DP group; no epoch moves it), as verl's critic trains on the actor's."""

    marker_path = staticmethod(critic_marker)

    def step(self, now: float, rt: WorkerRuntime) -> float | None:
        p, ranks = self.it.p, self.it.p.critic_ranks
        while not self.done:
            free, wake = self._free(now)
            if not free:
                return wake
            info = self.shards[self.next]
            batch = open_shard(stage_dir(p.run_dir, self.it.k, ACTOR_STAGE) / info.name,
                               nbytes=info.bytes, digest=info.xxh3_64)
            with collective(f"critic step {self.next} on critic ranks {ranks}", p.info,
                            rt.epoch.epoch if rt.epoch else None, self.it.k):
                ready_at, stats = p.compute.train_critic(self.it.k, self.next, batch, ranks)
            marker = ({"index": self.next, "ranks": ranks, "done_at": ready_at, **stats}
                      if self.it.rank == ranks[0] else None)
            self.busy = (ready_at, self.next, marker)
            now = time.time()
        return None


class _Iteration:
    """One rank's cooperative loop over one iteration."""

    def __init__(self, p: IterationProtocol, k: int, rt: WorkerRuntime, start: Epoch, sync: dict[str, Any],
                 actor_before: list[int]) -> None:
        self.p, self.k, self.rt, self.start = p, k, rt, start
        self.actor_before = actor_before  # actor ranks before the iteration start moved them
        self.rank = p.info.rank
        self.sync = sync
        self.samples = p.samples_per_iteration
        self.minibatches = self.samples // p.cfg.train.global_batch_size * p.cfg.actor.ppo_epochs
        self.start_rollout = sorted(start.ranks_of("rollout"))
        self.start_inference = sorted(start.ranks_of("inference"))
        start_actor = sorted(start.ranks_of("actor"))
        self.leader = start_actor[0] if start_actor else p.actor_ranks[0]
        # Collocated: an actor rank that also serves rollout or inference time-slices them, phase by
        # phase (rollout, then inference, then training), as verl's and RLinf's collocated modes do.
        self.collocated = bool(set(start_actor) & (set(self.start_rollout) | set(self.start_inference)))
        # this rank's own share: it generates or scores, then trains (engines switched between the phases)
        self.shared_rank = self.rank in start_actor and self.rank in (set(self.start_rollout) | set(self.start_inference))
        # Partial rollout with the actor on ranks it shares with the inference only, its state never parked (verl's
        # fully async Trainer): the shared ranks interleave scoring and training, one thing at a time, instead of
        # scoring the iteration whole first (``async_stream`` models the same).
        self.interleaved = (self.collocated and p.partial and not set(start_actor) & set(self.start_rollout)
                            and not actor_offloads(p.cfg))
        self.training_phase = False
        rt.counters.update({"rollout_finished": 0, "rollout_running": 0, "migrated_out": 0, "inference_done": 0,
                            "actor_minibatches_done": 0, "actor_busy": False, "boundary_at": None})
        # the iterations whose samples this iteration's rollout draws (in order): k itself, or, with
        # algorithm.max_staleness, the ones ahead that the weights of version k may start
        self.generates = p.generated_in(k)
        # Parts of the iteration-start roles exist from the start, so a rank released before its
        # first pass still completes its (empty) manifests.
        carried, p._carried = p._carried, None  # partial rollout: the requests this head decodes on
        if carried is not None:
            carried.carry_into(self, self.generates)
        self.rollout: _Rollout | None = carried or (_Rollout(self, self.generates) if self._is_rollout_head(start)
                                                    and self.generates else None)
        # the rollouts reach inference and the actor with their rewards: scored beside the rollout, or by the
        # reward's own ranks into the rewards stage (placement.reward_ranks)
        self.upstream = REWARDS_STAGE if p.reward_ranks else ROLLOUTS_STAGE
        self.reward: _Reward | None = _Reward(self, p.reward_ranks) if self.rank in p.reward_ranks else None
        self.inference: _Inference | None = (
            _Inference(self, self.start_inference) if self.rank in self.start_inference else None)
        self.cutter = _Cutter(self, INFERENCE_STAGE if self.start_inference else self.upstream) if self.rank == self.leader else None
        self.actor = _ActorFollower(self, self.leader)
        self.critic = _CriticFollower(self, self.leader) if self.rank in p.critic_ranks else None
        self.landing: _Landing | None = _Landing(self) if p.lands_ahead(k) else None
        self.last_report = 0.0
        self.last_doc: dict[str, Any] = {}
        self.report_due: float | None = None  # a throttled change is written at this time
        if self.start_rollout and self.rank == self.start_rollout[0]:
            for j in self.generates:
                write_expected(p.run_dir, j, ROLLOUTS_STAGE, rollout_heads(self.start_rollout, p.rollout_tp))
        if self.start_inference and self.rank == self.start_inference[0]:
            write_expected(p.run_dir, k, INFERENCE_STAGE, self.start_inference)
        if p.reward_ranks and self.rank == p.reward_ranks[0]:
            write_expected(p.run_dir, k, REWARDS_STAGE, p.reward_ranks)

    def _is_rollout_head(self, epoch: Epoch) -> bool:
        return self.rank in rollout_heads(epoch.ranks_of("rollout"), self.p.rollout_tp)

    def on_transition(self, old: Epoch | None, new: Epoch) -> dict[str, Any]:
        """Mid-iteration role changes of this rank (called by ``transition`` at a safe point)."""
        out: dict[str, Any] = {}
        was = old is not None and self._is_rollout_head(old)
        if was and not self._is_rollout_head(new) and self.rollout is not None:
            out["migrated_requests"] = self.rollout.release(new.epoch, time.time())
        return out

    def _progress(self, now: float) -> dict[str, Any]:
        r, i, a, c = self.rollout, self.inference, self.actor, self.cutter
        done = a.trained
        if c is not None:
            done = max(done, c.cut - (1 if c.in_flight(now) else 0))
        return {
            "rollout_finished": r.finished if r else 0,
            "rollout_running": r.held if r and not r.done else 0,
            "migrated_out": r.migrated_out if r else 0,
            "inference_done": i.done_rows if i else 0,
            "actor_minibatches_done": done,
            # the cutter alone says whether a stamped mini-batch is in flight: a follower's own view
            # lags (it notices the end of its share a poll later) and would hide a boundary
            "actor_busy": bool(c is not None and c.in_flight(now)),
            "boundary_at": c.boundary_at if c else None,
            # what the actor leader has received: a floor for rollout/inference progress that
            # never lags the data (other ranks' reports may be a report period behind)
            "actor_received": c.received if c else 0,
            # ... of them in complete groups: the data the actor's mini-batches are cut from
            "actor_ready": c.grouped if c else 0,
            # what the plan policy's forecast learns from (scheduler.history)
            "rollout_len_hist": {str(b): n for b, n in sorted(r.length_hist.items())} if r else {},
            "rollout_longest": r.longest if r else 0,
            "rollout_step_s": r.decoder.step_seconds() if r and r.decoder and not r.done else None,
            "rollout_decoding": r.decoder.held() if r and r.decoder and not r.done else 0,
            "inference_busy_s": i.busy_s if i else 0.0,
            "actor_last_minibatch": ({k: c.plan[-1][k] for k in ("index", "dp", "seconds", "tokens", "resharded")}
                                     if c and c.plan else None),
        }

    def report_now(self, now: float) -> None:
        """Write this rank's progress now (e.g. at a mini-batch boundary)."""
        self._report(now, force=True)

    def _report(self, now: float, force: bool = False) -> None:
        doc = self._progress(now)
        changed = doc["actor_busy"] != self.last_doc.get("actor_busy") or doc["actor_minibatches_done"] != self.last_doc.get("actor_minibatches_done")
        if force or changed or (doc != self.last_doc and now - self.last_report >= REPORT_EVERY_S):
            self.rt.counters.update(doc)  # every report of this rank (also at epoch acks) carries them
            self.rt.report("working")
            self.last_doc, self.last_report = doc, now
            self.report_due = None
        elif doc != self.last_doc:
            self.report_due = self.last_report + REPORT_EVERY_S  # do not sleep past a change

    def scoring_path(self, rank: int) -> Path:
        """Where an interleaved shared rank says until when it scores (a predicted end: emulated)."""
        return stage_dir(self.p.run_dir, self.k, INFERENCE_STAGE) / f"scoring-until-{rank:05d}.json"

    def scoring_until(self) -> float:
        """When the shared ranks' scoring in flight ends (0: none predicted)."""
        ends = [read_json(path)["until"] for path in stage_dir(self.p.run_dir, self.k, INFERENCE_STAGE)
                .glob("scoring-until-*.json")]
        return max(ends, default=0.0)

    def training_until(self) -> float:
        """When the last stamped mini-batch of this iteration ends (0: none stamped, or its end not predicted)."""
        path = stage_dir(self.p.run_dir, self.k, ACTOR_STAGE) / PLAN_FILE
        plan = read_json(path)["minibatches"] if path.exists() else []
        return max((e["ready_at"] for e in plan if e.get("ready_at") is not None), default=0.0)

    @property
    def carries(self) -> bool:
        """Partial rollout: this head's requests carry over into the next iteration (the next weights landed)."""
        return (self.rollout is not None and not self.rollout.done and self.landing is not None
                and self.landing.takes and self.landing.done)

    def _finished(self) -> bool:
        rollout = None if self.carries else self.rollout
        return (self.actor.done and (self.cutter is None or (self.cutter.cut >= self.minibatches and self.cutter.drained))
                and all(part is None or part.done
                        for part in (rollout, self.reward, self.inference, self.critic, self.landing)))

    def enter_training(self) -> None:
        """A shared rank's switch to training (once per iteration, before its first step)."""
        if self.shared_rank and not self.training_phase:
            self.training_phase = True
            self.p.compute.switch_phase("train")

    def run(self) -> None:
        rt = self.rt
        if self.shared_rank:  # the weights are synced: the rollout engine wakes, the actor's state may park
            self.p.compute.switch_phase("generate")
        quantum = max(2 * self.p.poll, 0.02)
        deadline = time.monotonic() + self.p.timeout
        last_progress = (-1, -1, -1, -1, -1, -1)
        next_status_check = 0.0
        while True:
            rt.safe_point()
            now = time.time()
            active = (self.cutter is not None or "actor" in rt.roles or any(
                part is not None and not part.done
                for part in (self.rollout, self.reward, self.inference, self.critic, self.landing)))
            if self.landing is not None:
                self.landing.take_from_loop()
            # A rank outside the actor that only follows the mini-batch plan needs no fast polling.
            wakes: list[float] = [now + (quantum if active else IDLE_POLL_S)]
            if self.rollout is not None and not self.rollout.done and not self.rollout.left:
                wakes.append(self.rollout.step(now) or wakes[0])
            if self.reward is not None and not self.reward.done:
                self.reward.step()  # synchronous: its next shard is polled at the loop's pace
            if self.inference is not None and not self.inference.done:
                wakes.append(self.inference.step(time.time()) or wakes[0])
            if self.cutter is not None:
                wakes.append(self.cutter.step(time.time(), rt) or wakes[0])
            wakes.append(self.actor.step(time.time(), rt) or wakes[0])
            if self.landing is not None:
                self.landing.send()
            if self.critic is not None:
                wakes.append(self.critic.step(time.time(), rt) or wakes[0])
            self._pool_turn()
            now = time.time()
            self._report(now)
            if self.report_due is not None:
                wakes.append(self.report_due)
            if self._finished():
                break
            marker = (self.rollout.finished if self.rollout else 0, self.reward.done_rows if self.reward else 0,
                      self.inference.done_rows if self.inference else 0,
                      self.actor.next, self.cutter.cut if self.cutter else 0, self.critic.next if self.critic else 0)
            if marker != last_progress:
                last_progress, deadline = marker, time.monotonic() + self.p.timeout
            elif time.monotonic() > deadline:
                assert rt.epoch is not None
                raise NoProgressTimeout(
                    f"rank {self.rank} (host {self.p.info.host}) made no progress in iteration {self.k} for "
                    f"{self.p.timeout:.0f}s (epoch {rt.epoch.epoch}, roles {list(rt.roles)}, mini-batches "
                    f"{self.actor.next}/{self.minibatches} seen; waiting for {self._waiting_for()})")
            if rt.watchdog is not None:
                rt.watchdog()
            if time.monotonic() >= next_status_check:  # a failed coordinator stops every rank
                next_status_check = time.monotonic() + STATUS_CHECK_EVERY_S
                CoordinatorFailed.check(read_coordinator_status(rt.paths), f"rank {self.rank} (host {self.p.info.host})",
                                        f" in iteration {self.k}")
            # Wake for the next event, but not more often than every poll interval: events due in
            # between (e.g. several decode finishes) are handled together, in virtual time.
            time.sleep(max(self.p.poll, min(wakes) - time.time()))
        self._finish()

    def _pool_turn(self) -> None:
        """Inside a group: the gate frees the rollout slot once this rank's rollout is done, or
        hands the unfinished requests to the job's tail when the grant revokes the slot."""
        if self.p.gate.rollout_turn(self.rollout) and self.rollout is not None:
            self.rt.counters["migrated_out"] = self.rollout.migrated_out

    def _waiting_for(self) -> str:
        if self.rollout is not None and not self.rollout.done:
            js = [d.j for d in self.rollout.draws if not d.ended]
            return (f"rollout requests of iteration {', '.join(map(str, js))} ({self.rollout.held} held, "
                    f"{self.rollout.finished} finished)")
        if self.reward is not None and not self.reward.done:
            return f"rollouts shards of iteration {self.k} to reward ({self.reward.done_rows} rewarded)"
        if self.inference is not None and not self.inference.done:
            return f"{self.upstream} shards of iteration {self.k} ({self.inference.done_rows} scored)"
        if self.critic is not None and not self.critic.done:
            return f"mini-batch {self.critic.next} for the critic from the cutter rank {self.leader} ({self.critic.manifest})"
        if self.landing is not None and not self.landing.done and self.landing.takes:
            return f"the weights v{self.landing.version} to land mid-generation ({self.landing.marker})"
        return f"mini-batch {self.actor.next} from the cutter rank {self.leader} ({self.actor.manifest})"

    def _finish(self) -> None:
        if self.carries:
            assert self.rollout is not None
            self.rollout.settle_before_carry()
            self.p._carried = self.rollout
        for part in (None if self.carries else self.rollout, self.reward, self.inference):
            if part is not None and not part.done:
                raise ProtocolError(f"rank {self.rank}: iteration {self.k} ended with its "
                                    f"{type(part).__name__.strip('_').lower()} work unfinished")
        self.enter_training()  # a shared rank ends the iteration with its actor state in place (checkpoints)
        self._report(time.time(), force=True)
        if self.cutter is not None:
            self._record_metrics()
            collect_garbage(self.p.run_dir, consumed_through_iteration=self.k,
                            keep_last=self.p.cfg.runtime.keep_iterations)

    def _markers(self) -> list[dict[str, Any]]:
        """The trained markers of every mini-batch (written by each one's first actor rank), with the
        critic's figures of the same step where the critic has ranks of its own."""
        kinds = [trained_marker] + ([critic_marker] if self.p.critic_ranks else [])
        paths = [[kind(self.p.run_dir, self.k, i) for kind in kinds] for i in range(self.minibatches)]
        self.rt.wait_for(lambda: all(p.exists() for step in paths for p in step),
                         f"the trained markers of iteration {self.k} ({paths[0][0].parent})")
        steps = []
        for step in paths:
            actor, *critic = (read_json(p) for p in step)
            steps.append({**actor, **{key: v for c in critic for key, v in c.items() if key.startswith("critic/")}})
        return steps

    def _record_metrics(self) -> None:
        assert self.cutter is not None
        c = self.cutter
        steps = self._markers()
        losses = [m["loss"] for m in steps if m.get("loss") is not None]
        entropies = [m["entropy"] for m in steps if m.get("entropy") is not None]
        row: dict[str, Any] = {
            "iteration": self.k,
            "reward_mean": float(np.mean(c.rewards)) if c.rewards else None,
            "kl": float(np.mean(c.kl)) if c.kl else None,
            "loss": float(np.mean(losses)) if losses else None,
            "losses": losses,
            "lr": steps[-1].get("lr"),
            "consumed_samples": steps[-1].get("consumed_samples"),
            "samples": len(c.rewards),
            # the iteration's prompts in group order: equal in a resumed or re-placed run (data order kept)
            "prompts_digest": xxhash.xxh3_64_hexdigest(json.dumps(sorted(c.prompts.items())).encode()),
            "minibatches": c.cut,
            "response_length_mean": float(np.mean(c.response_lengths)) if c.response_lengths else None,
            # prompt and response tokens of the iteration's samples (each counted once, whatever actor.ppo_epochs)
            "tokens": sum(int(e.get("tokens", 0)) for e in c.plan if not e.get("ppo_epoch")),
            "grad_norm": steps[-1].get("grad_norm"),
            # the policy versions the iteration trained on: staleness = iteration - the rows' weight_version
            "staleness/max": max(c.staleness, default=None),
            "staleness/mean": (sum(s * n for s, n in c.staleness.items()) / sum(c.staleness.values())
                               if c.staleness else None),
            "staleness/counts": {str(s): n for s, n in sorted(c.staleness.items())},
            "seconds": time.monotonic() - c.started,
            "sync_s": self.sync.get("seconds"), "sync_bytes": self.sync.get("bytes"),
            "actor_dp": max(int(e["dp"]) // int(e.get("tp", 1)) for e in c.plan),
            "actor_tp": sorted({int(e.get("tp", 1)) for e in c.plan}),
            "time": time.time(),
            "plan": [{key: v for key, v in e.items() if key in ("epoch", "dp", "tp", "seconds", "resharded")} for e in c.plan],
        }
        if self.p.partial:  # weights landing mid-generation: the samples whose tokens two versions drew
            row["staleness/mixed_versions"] = c.mixed_versions
        if self.p.filtering:  # DAPO's dynamic sampling: the prompts drawn set the next iteration's data position
            row.update({DRAWN_KEY: c.opened * self.p.batch_prompts, "num_gen_batches": c.opened,
                        "filter_groups/kept_groups": c.kept_groups, "filter_groups/dropped_groups": len(c.dropped)})
        if c.kl_coef is not None:  # the KL in the reward: its coefficient and what an adaptive kl_ctrl steers
            row[COEF_KEY] = c.kl_coef
            row[KL_KEY] = float(np.mean(c.current_kl)) if c.current_kl else 0.0
        if c.mismatch_kl:  # the rollout engine's log-probs against the actor's of the same weights
            row["mismatch/kl"], row["mismatch/max_abs"] = float(np.mean(c.mismatch_kl)), c.mismatch_max
        vf_losses = [m["critic/loss"] for m in steps if m.get("critic/loss") is not None]
        if vf_losses:  # PPO's critic (gae): its value loss per step, as the actor's losses
            row.update({"critic/vf_loss": float(np.mean(vf_losses)), "critic/vf_losses": vf_losses,
                        "critic/lr": steps[-1].get("critic/lr"), "critic/grad_norm": steps[-1].get("critic/grad_norm")})
        if entropies:  # algorithm.entropy_coeff set: the policy's mean token entropy over the iteration's steps
            row["entropy"] = float(np.mean(entropies))
        for key in STEP_DIAGNOSTICS:  # verl's clip fractions and ppo_kl: the mean over the iteration's steps
            values = [m[key] for m in steps if m.get(key) is not None]
            if values:
                row[key] = float(np.mean(values))
        if self.p.cfg.runtime.device != "emulated":  # every rollout rank's generate ended before training did
            row.update(reward_faults(self.p.run_dir, self.k))
        if self.p.cfg.runtime.device != "emulated" and eval_due(self.p.cfg.eval.every, self.k):
            path = eval_path(self.p.run_dir, self.k)  # written by the iteration's first rollout rank
            self.rt.wait_for(path.exists, f"the evaluation of iteration {self.k} ({path})")
            row.update({key: v for key, v in read_json(path).items() if key.startswith("val/")})
        append_metrics(self.p.run_dir, row)
