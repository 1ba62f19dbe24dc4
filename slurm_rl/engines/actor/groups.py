"""Process sub-groups of the fixed world, cached by rank set.

Constraint (torch.distributed): a group's identity is derived from how many groups the
process created before it, so **every rank of the world must create the same groups in the same
order**, members or not. ``GroupCache.ensure(rank_sets)`` is therefore called by *all* ranks
with the *same* list, typically at an epoch transition from the rank sets the epoch names
(``transition_rank_sets`` gives the ones an actor reshard needs). For a non-member the call
returns at once; members connect to each other (gloo) before it returns. ``get`` only returns
groups created that way and never creates one, so a rank cannot silently diverge.

Before connecting, members announce themselves in the default store; a member that does not
arrive within the timeout turns into a ``GroupTimeoutError`` naming the missing ranks instead of
an opaque gloo connect timeout. Arrival keys are not removed on failure: a group timeout is
meant to end the run, and a retry of the same ``ensure`` by every rank still succeeds.
"""

from __future__ import annotations

import datetime
import socket
from typing import Iterable, Sequence

import torch.distributed as dist

RankSet = tuple[int, ...]


class GroupTimeoutError(TimeoutError):
    """Members of a process group did not arrive within the timeout."""


class GroupNotCreatedError(KeyError):
    """A group was requested that was not created by ``GroupCache.ensure`` on all ranks."""


def rank_set(ranks: Iterable[int]) -> RankSet:
    """Canonical key of a rank set: sorted, without duplicates."""
    return tuple(sorted(set(int(r) for r in ranks)))


def transition_rank_sets(old_ranks: Sequence[int], new_ranks: Sequence[int]) -> list[RankSet]:
    """Groups an actor reshard from ``old_ranks`` to ``new_ranks`` uses, in creation order:
    the union (barrier, metadata, sharded moves), the new DP group and, when ranks join, the
    replicated-state broadcast group (source holder plus joiners)."""
    from .reshard import broadcast_ranks

    sets = [rank_set([*old_ranks, *new_ranks]), rank_set(new_ranks)]
    bcast = broadcast_ranks(old_ranks, new_ranks)
    if bcast:
        sets.append(rank_set(bcast))
    return list(dict.fromkeys(sets))


class GroupCache:
    """Sub-groups of the world keyed by their (sorted) rank set."""

    def __init__(self, timeout: datetime.timedelta | float = 60.0,
                 backend: str | None = None) -> None:
        if not isinstance(timeout, datetime.timedelta):
            timeout = datetime.timedelta(seconds=float(timeout))
        self.timeout = timeout
        self.backend = backend
        self._groups: dict[RankSet, dist.ProcessGroup | None] = {}
        self._created = 0

    def __contains__(self, ranks: Iterable[int]) -> bool:
        return rank_set(ranks) in self._groups

    def ensure(self, rank_sets: Iterable[Iterable[int]], what: str = "group") -> None:
        """Create the groups not created yet, in the given order. Call on ALL world ranks.

        ``what`` describes the purpose (e.g. ``"epoch 7 actor reshard"``) for error messages.
        """
        me = dist.get_rank()
        for ranks in rank_sets:
            key = rank_set(ranks)
            if key in self._groups:
                continue
            if me in key:
                self._await_members(key, what)
            group = dist.new_group(list(key), timeout=self.timeout, backend=self.backend)
            self._groups[key] = group if me in key else None
            self._created += 1

    def get(self, ranks: Iterable[int], what: str = "group") -> dist.ProcessGroup:
        """The group over ``ranks`` (this rank must be a member; created by ``ensure``)."""
        key = rank_set(ranks)
        me = dist.get_rank()
        if me not in key:
            raise ValueError(f"rank {me}: {what} over ranks {list(key)} does not include it")
        if key not in self._groups:
            raise GroupNotCreatedError(
                f"rank {me}: {what} needs the group over ranks {list(key)}, which was not "
                "created; call GroupCache.ensure(...) with the same rank sets on all ranks first")
        group = self._groups[key]
        assert group is not None
        return group

    def _await_members(self, key: RankSet, what: str) -> None:
        if len(key) == 1:
            return
        from torch.distributed.distributed_c10d import _get_default_store

        store = _get_default_store()
        prefix = f"slurm_rl/groups/{self._created}/" + "-".join(map(str, key))
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
