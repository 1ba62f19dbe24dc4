"""Roles with emulated compute: real processes, files, epochs and Arrow batches; GPU work is timed.

One iteration ``k`` on one rank is a cooperative loop (:class:`_Iteration`): apply epochs at a safe
point, advance each part the rank currently holds, sleep until the next event. ``rt.roles`` is
re-read on every pass, so a rank whose roles change mid-iteration starts its new role's work in
the same iteration.

- rollout: the iteration's requests are deterministic (seeded), so the head rank of every rollout
  instance builds them and claims chunks by creating ``requests/claim-NNNNNN`` exclusively (one
  winner per chunk, no directory listing). It decodes up to ``scheduler.max_running_requests``
  at once (:class:`~slurm_rl.engines.emulated.DecodeBatch`: per-request decode steps, the
  simulator's law) and streams finished samples as ``rollouts`` shards. A rank released from
  rollout stops at its next pass and writes its unfinished requests, with their partial
  responses, back as pending tickets (``write_pending``); the remaining ranks claim them
  (``claim_pending``) once the initial chunks are gone. Rollout ends when every sample of the
  iteration is listed in some ``rollouts`` manifest.
- inference: the inference ranks of the iteration start share the ``rollouts`` shards by a hash
  of (producer, seq) and write ``inference`` shards; a rank released after its share finished
  simply closes its writer.
- actor: the mini-batch cutter (lowest actor rank of the iteration start, else of the configured
  placement) cuts whole GRPO groups into mini-batches of ``train.global_batch_size`` once the
  previous one ended and (dynamic policies) the coordinator answered the boundary (the
  ``boundary_at`` progress field and the ``checked_at`` status field), and stamps each with the
  epoch in force (``plan.json`` next to the
  ``actor_batch`` shards, written before the shard). Every rank follows the plan: it applies
  epochs up to the stamp, trains the mini-batch if the stamped epoch places it in the actor (the
  DP group of that mini-batch) and skips it otherwise, so actor growth takes effect at a
  mini-batch boundary all ranks agree on, and a rank joining mid-iteration starts at the next one.
  A reshard (actor ranks changed since the last mini-batch) is paid at the start of the next one.

Response lengths follow ``slurm_rl.scheduler.lengths.LengthModel`` with the simulator's seed and
sampling order, so an emulated run and ``slurm-rl simulate`` see the same workload.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slurm_rl.config import Config
from slurm_rl.control.atomic import atomic_write_json, read_json
from slurm_rl.control.epochs import Epoch, read_epoch_file
from slurm_rl.control.paths import RunPaths
from slurm_rl.control.status import read_coordinator_status
from slurm_rl.data import emulated as fake
from slurm_rl.data.gc import collect_garbage
from slurm_rl.data.layout import expected_path, manifest_path, stage_dir
from slurm_rl.data.manifest import ProducerManifest
from slurm_rl.data.migration import claim_pending, write_pending
from slurm_rl.data.schemas import ACTOR_BATCH, ID_STRIDE, INFERENCE, ROLLOUTS
from slurm_rl.data.shardio import open_shard
from slurm_rl.data.writer import StageWriter, write_expected
from slurm_rl.engines.emulated import CostModel, DecodeBatch
from slurm_rl.launch.rank_env import RankInfo
from slurm_rl.metrics import append_metrics
from slurm_rl.scheduler.lengths import LengthModel
from slurm_rl.worker.runtime import WorkerRuntime

ROLLOUTS_STAGE = "rollouts"
INFERENCE_STAGE = "inference"
ACTOR_STAGE = "actor_batch"
REQUESTS_STAGE = "requests"  # claim markers of the iteration's request chunks
BOUNDARY_WAIT_S = 2.0  # at most this long the cutter waits for the coordinator at a mini-batch boundary
STATUS_CHECK_EVERY_S = 0.5  # how often a working rank looks for a coordinator failure
IDLE_POLL_S = 0.1  # loop period of a rank with no rollout, inference or cutting work
PLAN_FILE = "plan.json"
REPORT_EVERY_S = 0.05  # progress files are rewritten at most this often (and on state changes)
CLAIM_EVERY_S = 0.05  # a rollout rank lists the pending directory at most this often
DONE_CHECK_EVERY_S = 0.1  # an idle rollout rank checks at most this often whether rollout finished
FLUSH_EVERY_S = 0.05  # finished samples wait at most this long before they are written as a shard


def _tokens(table: pa.Table, column: str = "response_ids") -> int:
    if table.num_rows == 0:
        return 0
    return int(pc.sum(pc.list_value_length(table.column(column))).as_py() or 0)


def iteration_lengths(model: LengthModel, seed: int, iteration: int, n: int) -> np.ndarray:
    """Response lengths of the ``n`` requests of ``iteration`` (the simulator's draw order)."""
    rng = random.Random(seed)
    lengths: list[int] = []
    for _ in range(iteration + 1):
        lengths = model.sample(rng, n)
    return np.asarray(lengths, dtype=np.int64)


def rollout_heads(ranks: list[int], ranks_per_instance: int) -> list[int]:
    """The first rank of each rollout instance (the one that decodes for the instance)."""
    ordered = sorted(ranks)
    return ordered[::ranks_per_instance] if len(ordered) % ranks_per_instance == 0 else ordered


class _Follower:
    """Non-blocking reader of one stage: new verified shards on each :meth:`poll`.

    Producers come from the stage's ``expected.json`` (re-read when it changes); one ``stat`` per
    unfinished producer per poll, no directory listing.
    """

    def __init__(self, run_dir: Path, iteration: int, stage: str, producers: list[int] | None = None) -> None:
        self.run_dir, self.iteration, self.stage = run_dir, iteration, stage
        self.dir = stage_dir(run_dir, iteration, stage)
        self._expected = expected_path(run_dir, iteration, stage)
        self._expected_key: tuple[int, int] | None = None
        self._final = producers is not None
        self._producers: dict[int, dict[str, Any]] = {}
        for r in producers or ():
            self._add(r)

    def _add(self, rank: int) -> None:
        self._producers.setdefault(rank, {"key": None, "shards": [], "next": 0, "complete": False})

    def _stat_key(self, path: Path) -> tuple[int, int] | None:
        try:
            s = os.stat(path)
        except FileNotFoundError:
            return None
        return (s.st_mtime_ns, s.st_size + s.st_ino)

    def poll(self) -> list[tuple[int, int, pa.Table]]:
        """Shards published since the last poll as (producer, seq, table)."""
        if self._expected_key is None or not self._final:
            key = self._stat_key(self._expected)
            if key is not None and key != self._expected_key:
                doc = read_json(self._expected)
                for r in doc.get("producer_ranks", []):
                    self._add(int(r))
                self._final = bool(doc.get("final", True))
                self._expected_key = key
        out = []
        for rank, st in sorted(self._producers.items()):
            if st["complete"] and st["next"] >= len(st["shards"]):
                continue
            path = manifest_path(self.run_dir, self.iteration, self.stage, rank)
            key = self._stat_key(path)
            if key is not None and key != st["key"]:
                m = ProducerManifest.load(path, iteration=self.iteration, stage=self.stage, producer_rank=rank)
                st["shards"], st["complete"], st["key"] = m.shards, m.complete, key
            while st["next"] < len(st["shards"]):
                info = st["shards"][st["next"]]
                table = open_shard(self.dir / info.name, nbytes=info.bytes, digest=info.xxh3_64)
                out.append((rank, st["next"], table))
                st["next"] += 1
        return out

    @property
    def complete(self) -> bool:
        """Every expected producer completed and every shard was returned."""
        return self._final and bool(self._producers) and all(
            st["complete"] and st["next"] >= len(st["shards"]) for st in self._producers.values()
        )


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
        e = cfg.emulated
        self.lengths = LengthModel(mean=float(e.response_len_mean), max_len=int(e.response_len_max),
                                   dist=e.response_len_dist, sigma=float(e.response_len_sigma),
                                   alpha=float(e.response_len_alpha))
        self.max_running = int(cfg.scheduler.max_running_requests)
        self.rollout_tp = int(cfg.scheduler.rollout_ranks_per_instance)
        self.actor_tp = int(cfg.scheduler.actor_ranks_per_instance)
        self.dynamic = cfg.scheduler.policy != "static"
        self.initial_actor = sorted(cfg.placement.components["actor"].ranks) if "actor" in cfg.placement.components else []
        self._iteration: _Iteration | None = None
        self._epochs: dict[int, Epoch] = {}
        self.reshard_due_s = 0.0  # paid by the next mini-batch (charged by the cutter)

    def epoch(self, n: int, rt: WorkerRuntime) -> Epoch:
        """Epoch ``n`` (cached; the one in force comes from the runtime)."""
        if rt.epoch is not None and rt.epoch.epoch == n:
            return rt.epoch
        if n not in self._epochs:
            self._epochs[n] = read_epoch_file(self.paths, n)
        return self._epochs[n]

    # -- epoch transitions ----------------------------------------------------------------------
    def transition(self, old: Epoch | None, new: Epoch, rt: WorkerRuntime) -> dict[str, Any]:
        """Role change at a safe point: rollout releases migrate their requests; actor growth
        is bookkept (bytes to move; the reshard time is paid at the next mini-batch)."""
        start = time.monotonic()
        rank = self.info.rank
        old_actor = sorted(old.ranks_of("actor")) if old else []
        new_actor = sorted(new.ranks_of("actor"))
        received = 0
        if old is not None and new_actor != old_actor:
            nbytes = self.cost.reshard_bytes(len(old_actor) // self.actor_tp, len(new_actor) // self.actor_tp)
            self.reshard_due_s += self.cost.reshard_seconds(nbytes)  # the simulator's law, per change
            if rank in new_actor and rank not in old_actor:
                received = nbytes // max(1, len(set(new_actor) - set(old_actor)))
        figures: dict[str, Any] = {"bytes_moved": received}
        if self._iteration is not None:
            figures.update(self._iteration.on_transition(old, new))
        released = bool(old is not None and rank in old_actor and rank not in new_actor)
        figures.update(seconds=time.monotonic() - start, released_actor_state=released)
        return figures

    # -- one iteration --------------------------------------------------------------------------
    def run_iteration(self, iteration: int, rt: WorkerRuntime) -> None:
        """This rank's share of ``iteration`` for whatever roles it holds while it runs."""
        self._iteration = _Iteration(self, iteration, rt)
        try:
            self._iteration.run()
        finally:
            self._iteration = None

    def close(self) -> None:
        pass


class _Rollout:
    """Rollout work of one rank in one iteration (only instance head ranks decode)."""

    def __init__(self, it: "_Iteration") -> None:
        self.it = it
        self.roles = it.roles
        self.batch = DecodeBatch(self.roles.cost, self.roles.rollout_tp, self.roles.max_running)
        self.tables: dict[int, pa.Table] = {}  # sample id -> its request row
        self.queue: deque[int] = deque()
        self.out: list[int] = []
        self.out_since = 0.0
        self.writer: StageWriter | None = None
        self.finished = 0
        self.migrated_out = 0
        self.done = False
        self.left = False
        self.next_claim = 0.0
        self.next_done_check = 0.0
        self.ticket_rows = max(1, self.roles.max_running // 8)
        self.cursor = 0  # next chunk of the iteration's requests to try to claim
        self._requests: pa.Table | None = None

    @property
    def held(self) -> int:
        return len(self.batch.running) + len(self.queue)

    def _writer(self) -> StageWriter:
        if self.writer is None:
            self.writer = StageWriter(self.roles.run_dir, self.it.k, ROLLOUTS_STAGE, self.it.rank, ROLLOUTS)
        return self.writer

    def _length(self, sid: int) -> int:
        return int(self.it.lengths[sid - self.it.k * ID_STRIDE])

    def _admit(self, now: float) -> None:
        while self.queue and self.batch.free_slots:
            sid = self.queue.popleft()
            step = int(self.tables[sid].column("step")[0].as_py())
            self.batch.admit(sid, step, self._length(sid), now)

    def _take(self, got: pa.Table) -> None:
        for i, sid in enumerate(got.column("sample_id").to_pylist()):
            self.tables[sid] = got.slice(i, 1)
            self.queue.append(sid)

    def _claim_initial(self, want: int) -> int:
        """Claim chunks of the iteration's requests (one exclusive marker file per chunk:
        exactly one rank wins each chunk, and every rank tries each chunk in order, so none is
        skipped); returns the rows claimed."""
        if self._requests is None:
            self._requests = self.it.requests()
        n_chunks = math.ceil(self._requests.num_rows / self.ticket_rows)
        got = 0
        while got < want and self.cursor < n_chunks:
            c = self.cursor
            self.cursor += 1
            try:
                fd = os.open(self.it.claims_dir / f"claim-{c:06d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                continue
            os.write(fd, str(self.it.rank).encode())
            os.close(fd)
            chunk = self._requests.slice(c * self.ticket_rows, self.ticket_rows)
            self._take(chunk)
            got += chunk.num_rows
        return got

    def _claim(self, now: float) -> None:
        want = self.roles.max_running + self.ticket_rows - self.held
        if self.held > self.roles.max_running or want <= 0:
            return
        want -= self._claim_initial(want)
        if want <= 0 or now < self.next_claim:
            return
        got = claim_pending(self.roles.run_dir, self.it.k, self.it.rank, max_rows=want)  # migrated requests
        self.next_claim = now + (CLAIM_EVERY_S if got.num_rows == 0 else 0.0)
        self._take(got)

    def _rows(self, sids: list[int]) -> pa.Table:
        return pa.concat_tables([self.tables.pop(s) for s in sids]).combine_chunks()

    def _flush(self) -> None:
        if not self.out:
            return
        requests = self._rows(self.out)
        targets = np.asarray([self._length(s) for s in self.out], dtype=np.int64)
        rollouts = fake.finish_requests(requests, targets, seed=self.roles.cfg.runtime.seed + self.it.k,
                                        weight_version=self.it.k, rollout_rank=self.it.rank)
        self._writer().write(rollouts)
        self.finished += len(self.out)
        self.out = []

    def _all_finished(self) -> bool:
        """Every request of the iteration is in some producer's rollouts manifest."""
        path = expected_path(self.roles.run_dir, self.it.k, ROLLOUTS_STAGE)
        if not path.exists():
            return False  # the rollout leader has not published the iteration's requests yet
        total = 0
        for r in read_json(path).get("producer_ranks", []):
            mpath = manifest_path(self.roles.run_dir, self.it.k, ROLLOUTS_STAGE, int(r))
            if mpath.exists():
                m = ProducerManifest.load(mpath, iteration=self.it.k, stage=ROLLOUTS_STAGE, producer_rank=int(r))
                total += sum(s.rows for s in m.shards)
        return total >= self.it.samples

    def step(self, now: float) -> float | None:
        """Decode up to ``now``, refill, publish; the wall time of the next event."""
        if self.done:
            return None
        self._writer()
        finished = self.batch.advance(now)
        if finished:
            if not self.out:
                self.out_since = now
            self.out.extend(finished)
        self._admit(now)
        self._claim(now)
        self._admit(now)
        if self.out and (len(self.out) >= self.ticket_rows or now - self.out_since >= FLUSH_EVERY_S or not self.held):
            self._flush()
        if not self.held and not self.out and now >= self.next_done_check:
            self.next_done_check = now + DONE_CHECK_EVERY_S
            if self._all_finished():
                self._writer().close()
                self.done = True
                return None
        wakes = [t for t in (self.batch.next_finish_at(), self.out_since + FLUSH_EVERY_S if self.out else None) if t]
        if self.held <= self.roles.max_running:
            wakes.append(max(now, self.next_claim))
        return min(wakes) if wakes else None

    def release(self, epoch: int, now: float) -> int:
        """Leave rollout: publish finished samples, hand unfinished requests back; rows migrated."""
        if self.done or self.left:
            return 0
        self.left = True
        self.out.extend(self.batch.advance(now))
        generated = self.batch.evict_all()
        self._flush()
        sids = list(generated) + list(self.queue)
        self.queue.clear()
        migrated = 0
        if sids:
            requests = self._rows(sids)
            have = requests.column("step").to_numpy().astype(np.int64)
            new = np.asarray([max(0, generated.get(s, 0) - int(h)) for s, h in zip(sids, have)], dtype=np.int64)
            partial = fake.advance_requests(requests, new, seed=self.roles.cfg.runtime.seed + epoch)
            chunks = math.ceil(len(sids) / self.ticket_rows)
            write_pending(self.roles.run_dir, self.it.k, self.it.rank, partial, tag=epoch, num_chunks=chunks)
            migrated = len(sids)
        self._writer().close()
        self.done = True
        self.migrated_out += migrated
        return migrated


class _Inference:
    """Inference work of one rank: its hash share of the rollouts shards."""

    def __init__(self, it: "_Iteration", ranks: list[int]) -> None:
        self.it = it
        self.ranks = ranks
        self.follower = _Follower(it.roles.run_dir, it.k, ROLLOUTS_STAGE)
        self.queue: deque[pa.Table] = deque()
        self.inflight: tuple[float, pa.Table] | None = None
        self.busy_until = 0.0
        self.writer = StageWriter(it.roles.run_dir, it.k, INFERENCE_STAGE, it.rank, INFERENCE)
        self.done_rows = 0
        self.done = False

    def step(self, now: float) -> float | None:
        if self.done:
            return None
        index = self.ranks.index(self.it.rank)
        for producer, seq, table in self.follower.poll():
            if (producer * 1_000_003 + seq) % len(self.ranks) == index:
                self.queue.append(table)
        if self.inflight is not None and now >= self.inflight[0]:
            self.writer.write(self.inflight[1])
            self.done_rows += self.inflight[1].num_rows
            self.inflight = None
        if self.inflight is None and self.queue:
            # One batch of up to global_batch_size samples at a time, as the simulator does.
            tables, rows = [], 0
            while self.queue and (not tables or rows + self.queue[0].num_rows <= self.it.roles.cfg.train.global_batch_size):
                tables.append(self.queue.popleft())
                rows += tables[-1].num_rows
            batch = pa.concat_tables(tables).combine_chunks()
            out = fake.make_fake_inference(batch, seed=self.it.roles.cfg.runtime.seed + self.it.k, inference_rank=self.it.rank)
            seconds = self.it.roles.cost.share_seconds("inference", _tokens(out) + _tokens(out, "prompt_ids"), len(self.ranks))
            self.busy_until = max(now, self.busy_until) + seconds
            self.inflight = (self.busy_until, out)
        if self.inflight is None and not self.queue and self.follower.complete:
            self.writer.close()
            self.done = True
            return None
        return self.inflight[0] if self.inflight is not None else None


class _Cutter:
    """Cuts whole groups into stamped mini-batches once the previous mini-batch ended."""

    def __init__(self, it: "_Iteration", source: str) -> None:
        self.it = it
        self.source = source
        self.follower = _Follower(it.roles.run_dir, it.k, source)
        self.buffer: list[pa.Table] = []  # received, not cut yet
        self.group_rows: dict[int, int] = {}  # samples received per group not cut yet
        self.complete: list[int] = []  # complete groups in completion order
        self.ready_rows = 0
        self.received = 0  # samples received this iteration (they finished rollout and inference)
        self.cut = 0
        self.prev_end = 0.0
        self.plan: list[dict[str, Any]] = []
        self.rewards: list[float] = []
        self.started = time.monotonic()
        self.writer = StageWriter(it.roles.run_dir, it.k, ACTOR_STAGE, it.rank, ACTOR_BATCH)
        self.group_size = it.roles.cfg.train.group_size
        self.gbs = it.roles.cfg.train.global_batch_size
        self.whole_groups = self.gbs % self.group_size == 0
        self.boundary_at: float | None = None

    def _take(self, table: pa.Table) -> None:
        """Buffer a shard; count the samples of each group (a group is ready once complete)."""
        if self.source == ROLLOUTS_STAGE:
            table = fake.make_fake_inference(table, seed=self.it.k, inference_rank=self.it.rank)
        self.buffer.append(table)
        self.received += table.num_rows
        if not self.whole_groups:
            self.ready_rows += table.num_rows
            return
        for g in table.column("group_id").to_pylist():
            n = self.group_rows.get(g, 0) + 1
            self.group_rows[g] = n
            if n == self.group_size:
                self.complete.append(g)
                self.ready_rows += n

    def _cut_batch(self) -> pa.Table:
        """The next ``gbs`` samples: whole groups in completion order (else arrival order)."""
        merged = pa.concat_tables(self.buffer).combine_chunks()
        if not self.whole_groups:
            batch, rest = merged.slice(0, self.gbs), merged.slice(self.gbs)
        else:
            take = self.complete[: self.gbs // self.group_size]
            del self.complete[: len(take)]
            for g in take:
                del self.group_rows[g]
            mask = pc.is_in(merged.column("group_id"), value_set=pa.array(take, pa.int64()))
            batch, rest = merged.filter(mask), merged.filter(pc.invert(mask))
        self.buffer = [rest] if rest.num_rows else []
        self.ready_rows -= batch.num_rows
        return batch

    def _coordinator_saw_boundary(self, now: float, rt: WorkerRuntime) -> bool:
        """Mini-batch boundary handshake: the actor is idle and the next mini-batch is ready;
        let the coordinator consult the policy on that state (as the simulator does at the end
        of a mini-batch) before stamping the next one. Bounded by ``BOUNDARY_WAIT_S``."""
        if self.boundary_at is None:
            self.boundary_at = now
            self.it.report_now(now)
            return False
        if now - self.boundary_at > BOUNDARY_WAIT_S:
            return True
        status = read_coordinator_status(self.it.roles.paths) or {}
        return float(status.get("checked_at", 0.0)) >= self.boundary_at

    def step(self, now: float, rt: WorkerRuntime) -> float | None:
        if self.cut >= self.it.minibatches:
            return None
        for _, _, table in self.follower.poll():
            self._take(table)
        if self.ready_rows < self.gbs or now < self.prev_end:
            return self.prev_end if self.ready_rows >= self.gbs else None
        assert rt.epoch is not None
        if self.it.roles.dynamic and not self._coordinator_saw_boundary(now, rt):
            return now + self.it.roles.poll
        actor = sorted(rt.epoch.ranks_of("actor"))
        if not actor:
            return None  # the actor holds no ranks yet (pre-process): the mini-batch waits
        self.boundary_at = None
        batch = fake.make_actor_batch(self._cut_batch())
        tokens = _tokens(batch) + _tokens(batch, "prompt_ids")
        reshard = self.it.roles.reshard_due_s
        self.it.roles.reshard_due_s = 0.0
        seconds = reshard + self.it.roles.cost.seconds("actor", tokens, len(actor) // self.it.roles.actor_tp)
        self.plan.append({"index": self.cut, "epoch": rt.epoch.epoch, "start_at": now, "seconds": seconds,
                          "reshard_s": reshard, "rows": batch.num_rows, "tokens": tokens, "dp": len(actor)})
        atomic_write_json(stage_dir(self.it.roles.run_dir, self.it.k, ACTOR_STAGE) / PLAN_FILE,
                          {"iteration": self.it.k, "minibatches": self.plan}, durable=False)
        self.writer.write(batch)
        self.rewards.extend(batch.column("reward").to_pylist())
        self.cut += 1
        self.prev_end = now + seconds
        if self.cut >= self.it.minibatches:
            left = sum(t.num_rows for t in self.buffer)
            if left:
                raise RuntimeError(
                    f"iteration {self.it.k}: {left} samples left over after "
                    f"cutting {self.cut} mini-batches of {self.gbs} (train.rollout_batch_size x train.group_size must be "
                    "a multiple of train.global_batch_size)")
            self.writer.close()
        return self.prev_end


class _ActorFollower:
    """Every rank: walk the stamped mini-batches, train those whose epoch places this rank in the actor."""

    def __init__(self, it: "_Iteration", leader: int) -> None:
        self.it = it
        self.leader = leader
        self.manifest = manifest_path(it.roles.run_dir, it.k, ACTOR_STAGE, leader)
        self.plan_path = stage_dir(it.roles.run_dir, it.k, ACTOR_STAGE) / PLAN_FILE
        self.key: tuple[int, int] | None = None
        self.shards: list[Any] = []
        self.plan: list[dict[str, Any]] = []
        self.next = 0
        self.busy_until: float | None = None
        self.trained = 0

    @property
    def done(self) -> bool:
        return self.next >= self.it.minibatches

    def busy(self, now: float) -> bool:
        return self.busy_until is not None and now < self.busy_until

    def _refresh(self) -> None:
        try:
            s = os.stat(self.manifest)
        except FileNotFoundError:
            return
        key = (s.st_mtime_ns, s.st_size + s.st_ino)
        if key == self.key:
            return
        m = ProducerManifest.load(self.manifest, iteration=self.it.k, stage=ACTOR_STAGE, producer_rank=self.leader)
        self.shards, self.key = m.shards, key
        if len(self.plan) < len(self.shards):
            self.plan = read_json(self.plan_path)["minibatches"]

    def step(self, now: float, rt: WorkerRuntime) -> float | None:
        while not self.done:
            if self.busy_until is not None:
                if now < self.busy_until:
                    return self.busy_until
                self.busy_until = None
                self.trained += 1
                self.next += 1
                continue
            if self.next >= len(self.shards):
                self._refresh()
                if self.next >= len(self.shards):
                    return None
            entry = self.plan[self.next]
            assert rt.epoch is not None
            if rt.epoch.epoch < entry["epoch"]:
                return now + self.it.roles.poll  # the stamped epoch is not applied here yet
            actor = sorted(self.it.roles.epoch(int(entry["epoch"]), rt).ranks_of("actor"))
            if self.it.rank not in actor:
                self.next += 1
                continue
            info = self.shards[self.next]
            # Read (and verify) the mini-batch as a trainer would; its DP share is timed, not computed.
            open_shard(stage_dir(self.it.roles.run_dir, self.it.k, ACTOR_STAGE) / info.name,
                       nbytes=info.bytes, digest=info.xxh3_64)
            self.busy_until = float(entry["start_at"]) + float(entry["seconds"])
        return None


class _Iteration:
    """One rank's cooperative loop over one iteration."""

    def __init__(self, roles: EmulatedRoles, k: int, rt: WorkerRuntime) -> None:
        assert rt.epoch is not None
        self.roles, self.k, self.rt = roles, k, rt
        self.rank = roles.info.rank
        self.samples = roles.samples_per_iteration
        self.minibatches = self.samples // roles.cfg.train.global_batch_size
        self.lengths = iteration_lengths(roles.lengths, int(roles.cfg.scheduler.seed), k, self.samples)
        start = rt.epoch
        self.start_rollout = sorted(start.ranks_of("rollout"))
        self.start_inference = sorted(start.ranks_of("inference"))
        start_actor = sorted(start.ranks_of("actor"))
        self.leader = start_actor[0] if start_actor else (roles.initial_actor or [0])[0]
        rt.counters.update({"rollout_finished": 0, "rollout_running": 0, "migrated_out": 0, "inference_done": 0,
                            "actor_minibatches_done": 0, "actor_busy": False, "boundary_at": None})
        # Parts of the iteration-start roles exist from the start, so a rank released before its
        # first pass still completes its (empty) manifests.
        self.rollout: _Rollout | None = _Rollout(self) if self._is_rollout_head(start) else None
        self.inference: _Inference | None = (
            _Inference(self, self.start_inference) if self.rank in self.start_inference else None)
        self.cutter = _Cutter(self, INFERENCE_STAGE if self.start_inference else ROLLOUTS_STAGE) if self.rank == self.leader else None
        self.actor = _ActorFollower(self, self.leader)
        self.last_report = 0.0
        self.last_doc: dict[str, Any] = {}
        self.report_due: float | None = None  # a throttled change is written at this time
        self.claims_dir = stage_dir(roles.run_dir, k, REQUESTS_STAGE)
        if self.start_rollout and self.rank == self.start_rollout[0]:
            write_expected(roles.run_dir, k, ROLLOUTS_STAGE, rollout_heads(self.start_rollout, roles.rollout_tp))
        os.makedirs(self.claims_dir, mode=0o700, exist_ok=True)
        if self.start_inference and self.rank == self.start_inference[0]:
            write_expected(roles.run_dir, k, INFERENCE_STAGE, self.start_inference)

    def requests(self) -> pa.Table:
        """The iteration's requests (deterministic from the seed: every rollout rank builds the
        same table and claims chunks of it, see ``_Rollout._claim_initial``)."""
        cfg = self.roles.cfg
        prompts = fake.make_fake_prompts(self.k, cfg.train.rollout_batch_size, cfg.emulated.prompt_len, cfg.runtime.seed)
        return fake.make_fake_requests(prompts, cfg.train.group_size, seed=cfg.runtime.seed, weight_version=self.k)

    def _is_rollout_head(self, epoch: Epoch) -> bool:
        return self.rank in rollout_heads(epoch.ranks_of("rollout"), self.roles.rollout_tp)

    def on_transition(self, old: Epoch | None, new: Epoch) -> dict[str, Any]:
        """Mid-iteration role changes of this rank (called by ``transition`` at a safe point)."""
        out: dict[str, Any] = {}
        was = old is not None and self._is_rollout_head(old)
        now_head = self._is_rollout_head(new)
        if was and not now_head and self.rollout is not None:
            out["migrated_requests"] = self.rollout.release(new.epoch, time.time())
        if now_head and not was and self.rollout is not None and self.rollout.left:
            raise RuntimeError(f"rank {self.rank}: epoch {new.epoch} puts it back into rollout in iteration {self.k} "
                               "after it left; rollout may only shrink within an iteration")
        if now_head and not was and self.rank not in self.start_rollout:
            heads = sorted(set(rollout_heads(new.ranks_of("rollout"), self.roles.rollout_tp)) |
                           set(rollout_heads(self.start_rollout, self.roles.rollout_tp)))
            joiners = [r for r in heads if r not in self.start_rollout]
            if joiners and self.rank == joiners[0]:
                write_expected(self.roles.run_dir, self.k, ROLLOUTS_STAGE, heads)
        return out

    def _progress(self, now: float) -> dict[str, Any]:
        r, i, a = self.rollout, self.inference, self.actor
        return {
            "rollout_finished": r.finished if r else 0,
            "rollout_running": r.held if r and not r.done else 0,
            "migrated_out": r.migrated_out if r else 0,
            "inference_done": i.done_rows if i else 0,
            "actor_minibatches_done": max(a.trained, self.cutter.cut - (1 if self.cutter.prev_end > now else 0)) if self.cutter else a.trained,
            # the cutter times every mini-batch, so it alone says whether the actor is inside one
            "actor_busy": bool(self.cutter and self.cutter.prev_end > now),
            "boundary_at": self.cutter.boundary_at if self.cutter else None,
            # what the actor leader has received: a floor for rollout/inference progress that
            # never lags the data (other ranks' reports may be a report period behind)
            "actor_received": self.cutter.received if self.cutter else 0,
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

    def run(self) -> None:
        rt = self.rt
        quantum = max(2 * self.roles.poll, 0.02)
        deadline = time.monotonic() + self.roles.timeout
        last_progress = (-1, -1, -1, -1)
        next_status_check = 0.0
        while True:
            rt.safe_point()
            now = time.time()
            roles = rt.roles
            active = self.cutter is not None or any(p is not None and not p.done for p in (self.rollout, self.inference))
            # A rank that only follows the mini-batch plan needs no fast polling: its training
            # ends at the stamped time whenever it notices the mini-batch.
            wakes: list[float] = [now + (quantum if active else IDLE_POLL_S)]
            assert rt.epoch is not None
            if self.rollout is None and self._is_rollout_head(rt.epoch) and "rollout" in roles:
                self.rollout = _Rollout(self)
            if self.rollout is not None and not self.rollout.done and not self.rollout.left:
                wakes.append(self.rollout.step(now) or wakes[0])
            if self.inference is not None and not self.inference.done:
                wakes.append(self.inference.step(now) or wakes[0])
            if self.cutter is not None:
                wakes.append(self.cutter.step(now, rt) or wakes[0])
            wakes.append(self.actor.step(now, rt) or wakes[0])
            self._report(now)
            if self.report_due is not None:
                wakes.append(self.report_due)
            if (self.actor.done and (self.cutter is None or self.cutter.cut >= self.minibatches)
                    and all(p is None or p.done for p in (self.rollout, self.inference))):
                break
            marker = (self.rollout.finished if self.rollout else 0, self.inference.done_rows if self.inference else 0,
                      self.actor.next, self.cutter.cut if self.cutter else 0)
            if marker != last_progress:
                last_progress, deadline = marker, time.monotonic() + self.roles.timeout
            elif time.monotonic() > deadline:
                raise TimeoutError(
                    f"rank {self.rank} (host {self.roles.info.host}) made no progress in iteration {self.k} for "
                    f"{self.roles.timeout:.0f}s (epoch {rt.epoch.epoch}, roles {list(roles)}, mini-batches "
                    f"{self.actor.next}/{self.minibatches} seen; waiting for {self._waiting_for()})")
            if rt.watchdog is not None:
                rt.watchdog()
            if time.monotonic() >= next_status_check:  # a failed coordinator stops every rank
                next_status_check = time.monotonic() + STATUS_CHECK_EVERY_S
                status = read_coordinator_status(rt.paths) or {}
                if status.get("state") == "failed":
                    raise RuntimeError(f"coordinator failed: {status.get('error')}; rank {self.rank} "
                                       f"(host {self.roles.info.host}) stops in iteration {self.k}")
            # Wake for the next event, but not more often than every poll interval: events due in
            # between (e.g. several decode finishes) are handled together, in virtual time.
            time.sleep(max(self.roles.poll, min(wakes) - time.time()))
        self._finish()

    def _waiting_for(self) -> str:
        if self.rollout is not None and not self.rollout.done:
            return f"rollout requests of iteration {self.k} ({self.rollout.held} held, {self.rollout.finished} finished)"
        if self.inference is not None and not self.inference.done:
            return f"rollouts shards of iteration {self.k} ({self.inference.done_rows} scored)"
        return f"mini-batch {self.actor.next} from the cutter rank {self.leader} ({self.actor.manifest})"

    def _finish(self) -> None:
        for part in (self.rollout, self.inference):
            if part is not None and not part.done:
                raise RuntimeError(f"rank {self.rank}: iteration {self.k} ended with its "
                                   f"{type(part).__name__.strip('_').lower()} work unfinished")
        self._report(time.time(), force=True)
        if self.cutter is not None:
            self._record_metrics()
            collect_garbage(self.roles.run_dir, consumed_through_iteration=self.k,
                            keep_last=self.roles.cfg.runtime.keep_iterations)

    def _record_metrics(self) -> None:
        assert self.cutter is not None
        rewards = self.cutter.rewards
        row = {
            "iteration": self.k,
            "reward_mean": float(np.mean(rewards)) if rewards else None,
            "samples": len(rewards),
            "minibatches": self.cutter.cut,
            "seconds": time.monotonic() - self.cutter.started,
            "time": time.time(),
            "emulated": True,
            "plan": [{k: v for k, v in e.items() if k in ("epoch", "dp", "seconds", "reshard_s")} for e in self.cutter.plan],
        }
        append_metrics(self.roles.run_dir, row)
