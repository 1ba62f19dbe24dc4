"""Placement epochs: the immutable, densely numbered JSON documents that say who does what.

``EpochStore`` is the coordinator's side (publish, read, list at startup); ``EpochWatcher`` is a
rank's side: one ``open`` of the next epoch's path per poll, with back-off while idle.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from slurm_rl.control.atomic import parse_json, read_bytes_once, read_json, write_json_exclusive
from slurm_rl.faults import fault_point
from slurm_rl.control.errors import EpochOrderError, FencedEpochError, TornFileError, WaitTimeout
from slurm_rl.control.paths import RunPaths

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


def read_epoch_file(paths: RunPaths, n: int) -> Epoch:
    """Read and validate epoch ``n``; ``FileNotFoundError`` if it is not published."""
    path = paths.epoch(n)
    epoch = Epoch.from_json(read_json(path, fs=paths.fs), str(path))
    if epoch.epoch != n:
        raise TornFileError(f"{path}: file holds epoch {epoch.epoch}, expected {n}")
    return epoch


def lease_generation(paths: RunPaths) -> int:
    """The current coordinator generation from ``control/lease`` (0 if no coordinator ever ran)."""
    try:
        doc = read_json(paths.lease, fs=paths.fs)
    except FileNotFoundError:
        return 0
    generation = doc.get("generation")
    if not _is_int(generation) or generation < 0:
        raise TornFileError(f"{paths.lease}: field 'generation' must be a non-negative int, got {generation!r}")
    return generation


class EpochStore:
    """Coordinator-side access to the epoch log. Listing methods are for startup and inspection."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths

    def publish(self, epoch: Epoch, generation: int) -> None:
        """Publish ``epoch`` exclusively, as the holder of lease ``generation``.

        Refuses (``FencedEpochError``) if ``epoch.generation`` differs from ``generation``, if the
        lease file shows a newer generation, or if the previous epoch has a newer generation;
        refuses (``EpochOrderError``) a non-dense number or an existing epoch. Creates the
        epoch's ack directory first so ranks can ack without a ``mkdir``.
        """
        path = self.paths.epoch(epoch.epoch)
        if epoch.generation != generation:
            raise FencedEpochError(f"epoch {epoch.epoch} ({path}) carries generation {epoch.generation} "
                                   f"but the publisher holds lease generation {generation}")
        current = lease_generation(self.paths)
        if generation < current:
            raise FencedEpochError(f"cannot publish epoch {epoch.epoch} ({path}) as generation {generation}: "
                                   f"{self.paths.lease} is at generation {current} (a newer coordinator took over)")
        if epoch.previous is not None and epoch.previous != epoch.epoch - 1:
            raise EpochOrderError(f"epoch {epoch.epoch}: 'previous' is {epoch.previous}, expected {epoch.epoch - 1}")
        if epoch.epoch > 0:
            try:
                prev = read_epoch_file(self.paths, epoch.epoch - 1)
            except FileNotFoundError:
                raise EpochOrderError(f"cannot publish epoch {epoch.epoch} ({path}): epoch {epoch.epoch - 1} "
                                      f"is not published; numbering must be dense") from None
            if prev.generation > generation:
                raise FencedEpochError(f"cannot publish epoch {epoch.epoch} as generation {generation}: "
                                       f"epoch {prev.epoch} already has generation {prev.generation}")
        self.paths.acks_dir(epoch.epoch).mkdir(parents=True, exist_ok=True)
        fault_point("epoch_write", epoch=epoch.epoch, generation=generation)
        try:
            write_json_exclusive(path, epoch.to_json(), fs=self.paths.fs)
        except FileExistsError:
            raise EpochOrderError(f"epoch {epoch.epoch} is already published at {path}") from None

    def read(self, n: int) -> Epoch:
        """Read epoch ``n`` (``FileNotFoundError`` if absent)."""
        return read_epoch_file(self.paths, n)

    def numbers(self) -> list[int]:
        """Published epoch numbers, sorted (lists the directory; temp files are ignored)."""
        try:
            names = os.listdir(self.paths.epochs_dir)
        except FileNotFoundError:
            return []
        return sorted(int(name[:-5]) for name in names
                      if len(name) == 11 and name.endswith(".json") and name[:6].isdigit())

    def latest(self) -> Epoch | None:
        """The highest published epoch, or None (lists the directory)."""
        numbers = self.numbers()
        return self.read(numbers[-1]) if numbers else None

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
        path = self.paths.epoch(n)
        self.polls += 1
        self._last_poll = time.monotonic()
        try:
            data = read_bytes_once(path, fs=self.paths.fs)
        except FileNotFoundError:
            self.interval = min(self.poll_interval_s * self.backoff ** self._misses, self.idle_poll_interval_s)
            self._misses = min(self._misses + 1, 64)
            return None
        epoch = Epoch.from_json(parse_json(data, path), str(path))
        if epoch.epoch != n:
            raise TornFileError(f"{path}: file holds epoch {epoch.epoch}, expected {n}")
        if epoch.generation < self.highest_generation:
            raise FencedEpochError(f"{self._who()}: epoch {n} ({path}) has generation {epoch.generation}, older "
                                   f"than generation {self.highest_generation} already seen; refusing it")
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
