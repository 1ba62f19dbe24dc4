"""Placement epochs: the immutable, densely numbered JSON documents that say who does what.

``EpochStore`` is the coordinator's side (publish, read, list at startup); ``EpochWatcher`` is a
rank's side: one ``open`` of the next epoch's path per poll, with back-off while idle. Both sit
on ``control.numbered.NumberedFiles`` (exclusive create, generation fencing, dense numbering).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from slurm_rl.control.errors import EpochOrderError, TornFileError, WaitTimeout
from slurm_rl.control.numbered import NumberedFiles, lease_generation
from slurm_rl.control.paths import RunPaths
from slurm_rl.faults import fault_point

SCHEMA_VERSION = 1
DEFAULT_POLL_INTERVAL_S = 0.01
DEFAULT_IDLE_POLL_INTERVAL_S = 0.1
DEFAULT_BACKOFF = 1.3

_FIELDS = ("schema", "epoch", "generation", "created_at", "reason", "iteration", "boundary",
           "placement", "previous", "extra")
_LAYOUT_KEYS = ("dp", "tp", "pp")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate_placement(placement: Any, where: str) -> dict[str, dict[str, Any]]:
    if not isinstance(placement, dict):
        raise TornFileError(f"{where}: 'placement' must be an object, got {type(placement).__name__}")
    for component, spec in placement.items():
        at = f"{where}: placement.{component}"
        if not isinstance(spec, dict):
            raise TornFileError(f"{at} must be an object")
        ranks = spec.get("ranks")
        if not isinstance(ranks, list) or not all(_is_int(r) and r >= 0 for r in ranks):
            raise TornFileError(f"{at}.ranks must be a list of non-negative ints, got {ranks!r}")
        if len(set(ranks)) != len(ranks):
            raise TornFileError(f"{at}.ranks has duplicates: {ranks!r}")
        for key in _LAYOUT_KEYS:
            if not _is_int(spec.get(key)) or spec[key] < 1:
                raise TornFileError(f"{at}.{key} must be an int >= 1, got {spec.get(key)!r}")
    return placement


@dataclass(frozen=True)
class Epoch:
    """One placement epoch. ``placement`` maps component -> {"ranks", "dp", "tp", "pp", ...extra}."""

    epoch: int
    generation: int
    created_at: float
    reason: str
    iteration: int
    boundary: str
    placement: dict[str, dict[str, Any]]
    previous: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON document written to ``epochs/NNNNNN.json``."""
        doc = {name: getattr(self, name) for name in _FIELDS if name != "schema"}
        doc["schema"] = SCHEMA_VERSION
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any], where: str = "epoch") -> "Epoch":
        """Validate and build an epoch; errors are :class:`TornFileError` naming ``where``."""
        if doc.get("schema") != SCHEMA_VERSION:
            raise TornFileError(f"{where}: unsupported epoch schema {doc.get('schema')!r} (expected {SCHEMA_VERSION})")
        unknown = sorted(set(doc) - set(_FIELDS))
        missing = [name for name in _FIELDS if name not in doc and name not in ("previous", "extra")]
        if unknown or missing:
            raise TornFileError(f"{where}: unknown keys {unknown}, missing keys {missing}")
        for name in ("epoch", "generation", "iteration"):
            if not _is_int(doc[name]) or doc[name] < 0:
                raise TornFileError(f"{where}: '{name}' must be a non-negative int, got {doc[name]!r}")
        if not isinstance(doc["created_at"], (int, float)) or isinstance(doc["created_at"], bool):
            raise TornFileError(f"{where}: 'created_at' must be a number, got {doc['created_at']!r}")
        for name in ("reason", "boundary"):
            if not isinstance(doc[name], str):
                raise TornFileError(f"{where}: '{name}' must be a string, got {doc[name]!r}")
        previous = doc.get("previous")
        if previous is not None and (not _is_int(previous) or previous >= doc["epoch"]):
            raise TornFileError(f"{where}: 'previous' must be null or an int below {doc['epoch']}, got {previous!r}")
        extra = doc.get("extra", {})
        if not isinstance(extra, dict):
            raise TornFileError(f"{where}: 'extra' must be an object")
        return cls(epoch=doc["epoch"], generation=doc["generation"], created_at=float(doc["created_at"]),
                   reason=doc["reason"], iteration=doc["iteration"], boundary=doc["boundary"],
                   placement=_validate_placement(doc["placement"], where), previous=previous, extra=extra)

    def ranks_of(self, component: str) -> list[int]:
        """Ranks assigned to ``component`` (empty if the component is absent)."""
        return list(self.placement.get(component, {}).get("ranks", []))

    def tp_of(self, component: str) -> int:
        """Tensor-parallel size of ``component`` (its placement's ``"tp"``; 1 when absent)."""
        return int(self.placement.get(component, {}).get("tp", 1))

    def role_of(self, rank: int) -> list[str]:
        """Components that ``rank`` serves in this epoch (several when components share GPUs)."""
        return [name for name, spec in self.placement.items() if rank in spec["ranks"]]


def epoch_files(paths: RunPaths) -> NumberedFiles[Epoch]:
    """The epoch log of a run: ``epochs/NNNNNN.json``, decoded as :class:`Epoch`."""
    return NumberedFiles(paths, paths.epochs_dir, kind="epoch", number_key="epoch", decode=Epoch.from_json)


def read_epoch_file(paths: RunPaths, n: int) -> Epoch:
    """Read and validate epoch ``n``; ``FileNotFoundError`` if it is not published."""
    return epoch_files(paths).read(n)


class EpochStore:
    """Coordinator-side access to the epoch log. Listing methods are for startup and inspection."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths
        self.files = epoch_files(paths)

    def publish(self, epoch: Epoch, generation: int) -> None:
        """Publish ``epoch`` exclusively, as the holder of lease ``generation``.

        Refuses (``FencedEpochError``) if ``epoch.generation`` differs from ``generation``, if the
        lease file shows a newer generation, or if the previous epoch has a newer generation;
        refuses (``EpochOrderError``) a non-dense number or an existing epoch. Creates the
        epoch's ack directory first so ranks can ack without a ``mkdir``.
        """
        if epoch.previous is not None and epoch.previous != epoch.epoch - 1:
            raise EpochOrderError(f"epoch {epoch.epoch}: 'previous' is {epoch.previous}, expected {epoch.epoch - 1}")

        def before_write() -> None:
            self.paths.acks_dir(epoch.epoch).mkdir(parents=True, exist_ok=True)
            fault_point("epoch_write", epoch=epoch.epoch, generation=generation)

        self.files.publish(epoch.epoch, epoch.to_json(), generation, before_write)

    def read(self, n: int) -> Epoch:
        """Read epoch ``n`` (``FileNotFoundError`` if absent)."""
        return self.files.read(n)

    def numbers(self) -> list[int]:
        """Published epoch numbers, sorted (lists the directory; temp files are ignored)."""
        return self.files.numbers()

    def latest(self) -> Epoch | None:
        """The highest published epoch, or None (lists the directory)."""
        return self.files.latest()

    def all(self) -> list[Epoch]:
        """Every published epoch in order; raises ``EpochOrderError`` if numbering has a gap."""
        numbers = self.numbers()
        if numbers != list(range(len(numbers))):
            missing = sorted(set(range(numbers[-1] + 1)) - set(numbers)) if numbers else []
            raise EpochOrderError(f"{self.paths.epochs_dir}: epochs are not dense, missing {missing}")
        return [self.read(n) for n in numbers]


class EpochWatcher:
    """A rank's view of the epoch log: polls exactly ``epochs/{current+1:06d}.json``.

    ``poll`` does one ``open`` per call and never lists a directory. The suggested interval
    (``interval``) starts at ``poll_interval_s`` after an epoch or :meth:`activity`, and grows by
    ``backoff`` per empty poll up to ``idle_poll_interval_s``, so an idle rank costs about
    ``1 / idle_poll_interval_s`` lookups per second while a fresh change is still seen quickly.
    Epochs whose generation is below the highest generation seen are refused (fencing).

    On NFS, mount the run directory so that negative lookups are not cached for long (e.g.
    ``lookupcache=positive``); otherwise a new epoch may stay invisible for up to ``acdirmax``.
    """

    def __init__(self, paths: RunPaths, start_after: int = -1, poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
                 idle_poll_interval_s: float = DEFAULT_IDLE_POLL_INTERVAL_S, backoff: float = DEFAULT_BACKOFF,
                 min_generation: int = 0, rank: int | None = None) -> None:
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        if backoff < 1.0:
            raise ValueError(f"backoff must be >= 1, got {backoff}")
        self.paths = paths
        self.files = epoch_files(paths)
        self.current = start_after
        self.highest_generation = min_generation
        self.poll_interval_s = poll_interval_s
        self.idle_poll_interval_s = max(idle_poll_interval_s, poll_interval_s)  # never poll faster when idle
        self.backoff = backoff
        self.rank = rank
        self.interval = poll_interval_s
        self._misses = 0
        self._last_poll = -float("inf")
        self.polls = 0  # path lookups done by poll(): one per call

    def _who(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else "watcher"

    def activity(self) -> None:
        """Return to fast polling (e.g. the rank expects an epoch soon)."""
        self._misses = 0
        self.interval = self.poll_interval_s

    def poll(self) -> Epoch | None:
        """Return the next epoch and advance, or None if it is not published yet (one ``open``)."""
        n = self.current + 1
        self.polls += 1
        self._last_poll = time.monotonic()
        try:
            epoch = self.files.read(n)
        except FileNotFoundError:
            self.interval = min(self.poll_interval_s * self.backoff ** self._misses, self.idle_poll_interval_s)
            self._misses = min(self._misses + 1, 64)
            return None
        self.files.check_order(n, epoch.generation, self.highest_generation, self._who())
        self.highest_generation = epoch.generation
        self.current = n
        self.activity()
        return epoch

    def poll_if_due(self) -> Epoch | None:
        """Poll only if ``interval`` has passed since the last poll; for frequent safe points.

        A rank that reaches safe points every millisecond still costs at most one lookup per
        ``interval`` (between ``poll_interval_s`` and ``idle_poll_interval_s``).
        """
        if time.monotonic() - self._last_poll < self.interval:
            return None
        return self.poll()

    def wait_next(self, timeout_s: float, what: str = "next epoch") -> Epoch:
        """Poll until the next epoch appears; ``WaitTimeout`` naming ``what``, the rank and path."""
        deadline = time.monotonic() + timeout_s
        while True:
            epoch = self.poll()
            if epoch is not None:
                return epoch
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(f"{self._who()}: timed out after {timeout_s:.1f}s waiting for {what} "
                                  f"(epoch {self.current + 1} at {self.paths.epoch(self.current + 1)})")
            time.sleep(min(self.interval, remaining))


__all__ = ["DEFAULT_BACKOFF", "DEFAULT_IDLE_POLL_INTERVAL_S", "DEFAULT_POLL_INTERVAL_S", "SCHEMA_VERSION", "Epoch",
           "EpochStore", "EpochWatcher", "epoch_files", "lease_generation", "read_epoch_file"]
