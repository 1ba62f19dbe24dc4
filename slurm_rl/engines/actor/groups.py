"""Process sub-groups of the fixed world, created by their members only, cached by rank set.

Why members only: placement changes mid-iteration (an actor growing at a mini-batch boundary)
involve only the ranks of the transition, while the other ranks are busy generating or scoring.
``torch.distributed.new_group`` cannot serve that: by default it is collective over the whole
world, and with ``use_local_synchronization=True`` it names the group by a hash of the ranks *and
the number of groups this process created before*, so two members with different histories
(ranks 0,1 created ``[0, 1]`` before ``[0, 1, 2]``, rank 2 did not) derive different names and
wait for each other forever (seen with torch 2.13 on gloo). Here a group's name is a function of
its rank set alone (``slurm_rl/<r0>_<r1>_...``), so the members of a set agree on it whatever
else each created, and a non-member never takes part. The group is built the way ``new_group``
builds one (``_new_process_group_helper``: the backend over a ``PrefixStore`` of the world's
store, registered with its global-to-group rank map), so every ``torch.distributed`` call
accepts it. The group of a rank set belongs to the world: a second cache in the same process
returns the one already made. NCCL creates its communicator lazily on the first collective, so the same holds
there. A rank set's group is created at most once per process; the cache keeps it for the run.

Before connecting, members announce themselves in the world's store; a member that does not
arrive within the timeout turns into a ``GroupTimeoutError`` naming the missing ranks instead of
an opaque connect timeout.
"""

from __future__ import annotations

import datetime
import socket
from typing import Iterable, Sequence

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from slurm_rl.errors import EngineError, WaitTimeout

RankSet = tuple[int, ...]


class GroupTimeoutError(EngineError, WaitTimeout):
    """Members of a process group did not arrive within the timeout."""


def rank_set(ranks: Iterable[int]) -> RankSet:
    """Canonical key of a rank set: sorted, without duplicates."""
    return tuple(sorted(set(int(r) for r in ranks)))


def group_name(key: RankSet) -> str:
    """The name (and store prefix) of the group over ``key``: a function of the set alone."""
    return "slurm_rl/" + "_".join(map(str, key))


def transition_rank_sets(old_ranks: Sequence[int], new_ranks: Sequence[int]) -> list[RankSet]:
    """Groups an actor reshard from ``old_ranks`` to ``new_ranks`` uses: the union (barrier,
    metadata, sharded moves), the new DP group and, when ranks join, the replicated-state
    broadcast group (source holder plus joiners)."""
    from .reshard import broadcast_ranks

    sets = [rank_set([*old_ranks, *new_ranks]), rank_set(new_ranks)]
    bcast = broadcast_ranks(old_ranks, new_ranks)
    if bcast:
        sets.append(rank_set(bcast))
    return list(dict.fromkeys(sets))


class GroupCache:
    """Sub-groups of the world keyed by their (sorted) rank set, created by members on demand."""

    def __init__(self, timeout: datetime.timedelta | float = 60.0,
                 backend: str | None = None) -> None:
        if not isinstance(timeout, datetime.timedelta):
            timeout = datetime.timedelta(seconds=float(timeout))
        self.timeout = timeout
        self.backend = backend
        self._groups: dict[RankSet, dist.ProcessGroup] = {}

    def __contains__(self, ranks: Iterable[int]) -> bool:
        return rank_set(ranks) in self._groups

    def ensure(self, rank_sets: Iterable[Iterable[int]], what: str = "group") -> None:
        """Create now the groups of ``rank_sets`` that include this rank (others are skipped).

        Only members need to call; every member of a set must (the creation connects them).
        """
        me = dist.get_rank()
        for ranks in rank_sets:
            if me in rank_set(ranks):
                self.get(ranks, what)

    def get(self, ranks: Iterable[int], what: str = "group") -> dist.ProcessGroup:
        """The group over ``ranks`` (this rank must be a member); created on first use, which
        waits until every member asked for it."""
        key = rank_set(ranks)
        me = dist.get_rank()
        if me not in key:
            raise ValueError(f"rank {me}: {what} over ranks {list(key)} does not include it")
        group = self._groups.get(key)
        if group is None:
            group = self._create(key, what)
            self._groups[key] = group
        return group

    def _create(self, key: RankSet, what: str) -> dist.ProcessGroup:
        name = group_name(key)
        for pg, existing in c10d._world.pg_names.items():  # made earlier in this world (another cache)
            if existing == name:
                return pg
        self._await_members(key, what)
        backend = self.backend or dist.get_backend()
        pg, _ = c10d._new_process_group_helper(
            len(key), key.index(dist.get_rank()), list(key), backend, c10d._get_default_store(),
            c10d.GroupName(name) if hasattr(c10d, "GroupName") else name,
            timeout=self.timeout)
        c10d._world.pg_group_ranks[pg] = {g: i for i, g in enumerate(key)}
        return pg

    def _await_members(self, key: RankSet, what: str) -> None:
        if len(key) == 1:
            return
        store = c10d._get_default_store()
        prefix = f"slurm_rl/arrivals/{group_name(key)}"
        me = dist.get_rank()
        store.set(f"{prefix}/{me}", socket.gethostname())
        keys = [f"{prefix}/{r}" for r in key]
        try:
            store.wait(keys, self.timeout)
        except Exception as exc:  # the store raises a generic error on timeout
            missing = [r for r, k in zip(key, keys) if not store.check([k])]
            raise GroupTimeoutError(
                f"rank {me} on {socket.gethostname()}: ranks {missing} did not arrive within "
                f"{self.timeout.total_seconds():.0f}s to create {what} over ranks {list(key)}"
            ) from exc
