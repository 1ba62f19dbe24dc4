"""Process sub-groups cached by rank set, created by their members only.

Groups are created with ``use_local_synchronization=True``: only the ranks *in* a group call
``new_group`` for it, and the group name is derived from the rank set. Constraint: ranks that
create several overlapping groups must create them in the same relative order (gloo connects
the members of a group before returning); the reshard protocol does this by always creating
the union group of a transition first, then the new DP group. A cache lives for the life of the
process (the world is fixed for the allocation), so each rank set is created at most once.

Before creating a group its members announce themselves in the default store; a member that
does not arrive within the timeout turns into a ``GroupTimeoutError`` naming the missing ranks
instead of an opaque gloo connect timeout.
"""

from __future__ import annotations

import datetime
import socket
from typing import Iterable

import torch.distributed as dist


class GroupTimeoutError(TimeoutError):
    """Members of a process group did not arrive within the timeout."""


def _store() -> dist.Store:
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


class GroupCache:
    """Sub-groups of the world keyed by their (sorted) rank set."""

    def __init__(self, timeout: datetime.timedelta | float = 60.0,
                 backend: str | None = None) -> None:
        if not isinstance(timeout, datetime.timedelta):
            timeout = datetime.timedelta(seconds=float(timeout))
        self.timeout = timeout
        self.backend = backend
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}

    def __contains__(self, ranks: Iterable[int]) -> bool:
        return tuple(sorted(set(ranks))) in self._groups

    def get(self, ranks: Iterable[int], what: str = "group") -> dist.ProcessGroup:
        """The group over ``ranks``; this rank must be a member. Creates it on first use.

        ``what`` describes the purpose (e.g. ``"epoch 7 actor reshard"``) for error messages.
        """
        key = tuple(sorted(set(ranks)))
        me = dist.get_rank()
        if me not in key:
            raise ValueError(f"rank {me} asked for {what} over ranks {list(key)} "
                             "it is not a member of")
        group = self._groups.get(key)
        if group is None:
            self._await_members(key, what)
            group = dist.new_group(list(key), timeout=self.timeout, backend=self.backend,
                                   use_local_synchronization=True)
            self._groups[key] = group
        return group

    def _await_members(self, key: tuple[int, ...], what: str) -> None:
        if len(key) == 1:
            return
        store = _store()
        prefix = "slurm_rl/groups/" + "-".join(map(str, key))
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
