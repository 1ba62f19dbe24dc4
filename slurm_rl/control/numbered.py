"""Immutable, densely numbered JSON documents published by a lease holder, fenced by generation.

The shared mechanics of the epoch log (``epochs/NNNNNN.json``) and a group's grants
(``grants/NNNNNN.json``): a document is published once, under an exclusive create (of two
racing publishers exactly one wins), only by the holder of the current lease generation
(``control/lease``), only as the next number, never as an older generation than the one before
it. Readers refuse a document of an older generation than one they already saw (``check_order``).

Every document is a JSON object holding its own number (under ``number_key``) and, in a fenced
log (the default), its publisher's ``"generation"``; an unfenced log (``fenced=False``: a record
written by whoever holds some other lock) keeps the exclusive create and the dense numbering only.
``decode`` turns a document into the caller's type (and validates it); the default keeps the
plain dict.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Generic, Mapping, TypeVar

from slurm_rl.control.atomic import read_json, write_json_exclusive
from slurm_rl.control.errors import EpochOrderError, FencedEpochError, TornFileError
from slurm_rl.control.paths import RunPaths

T = TypeVar("T")
Decode = Callable[[dict[str, Any], str], T]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def lease_generation(paths: RunPaths) -> int:
    """The current lease generation from ``control/lease`` (0 if no lease holder ever ran)."""
    try:
        doc = read_json(paths.lease, fs=paths.fs)
    except FileNotFoundError:
        return 0
    generation = doc.get("generation")
    if not _is_count(generation):
        raise TornFileError(f"{paths.lease}: field 'generation' must be a non-negative int, got {generation!r}")
    return generation


def _plain(doc: dict[str, Any], where: str) -> dict[str, Any]:
    return doc


class NumberedFiles(Generic[T]):
    """The numbered documents of one directory (``{prefix}{n:0{width}d}{suffix}``).

    ``paths`` supplies the lease that fences publishers and the file system everything goes
    through; ``kind`` names a document in errors ("epoch", "grant"), ``holder`` the lease holder
    ("coordinator", "group scheduler").
    """

    def __init__(self, paths: RunPaths, directory: Path, *, kind: str, number_key: str,
                 decode: Decode[T] = _plain, holder: str = "coordinator", prefix: str = "", width: int = 6,
                 suffix: str = ".json", fenced: bool = True) -> None:
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.paths, self.directory = paths, Path(directory)
        self.kind, self.number_key, self.decode, self.holder = kind, number_key, decode, holder
        self.prefix, self.width, self.suffix, self.fenced = prefix, width, suffix, fenced

    def path(self, n: int) -> Path:
        """Where document ``n`` is (or will be) published."""
        return self.directory / f"{self.prefix}{n:0{self.width}d}{self.suffix}"

    def numbers(self) -> list[int]:
        """Published numbers, sorted (lists the directory; temp files are ignored)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        lo, hi = len(self.prefix), len(self.prefix) + self.width
        return sorted(int(name[lo:hi]) for name in names
                      if len(name) == hi + len(self.suffix) and name.startswith(self.prefix)
                      and name.endswith(self.suffix) and name[lo:hi].isdigit())

    def read_doc(self, n: int) -> tuple[dict[str, Any], T]:
        """Document ``n`` as read and as decoded (one ``open``; ``FileNotFoundError`` if absent).

        ``TornFileError`` naming the file if it does not decode, holds another number, or has no
        valid generation (fenced logs)."""
        path = self.path(n)
        doc = read_json(path, fs=self.paths.fs)
        value = self.decode(doc, str(path))
        if doc.get(self.number_key) != n:
            raise TornFileError(f"{path}: file holds {self.kind} {doc.get(self.number_key)!r}, expected {n}")
        if self.fenced and not _is_count(doc.get("generation")):
            raise TornFileError(f"{path}: 'generation' must be a non-negative int, got {doc.get('generation')!r}")
        return doc, value

    def read(self, n: int) -> T:
        """Document ``n``, decoded (``FileNotFoundError`` if it is not published)."""
        return self.read_doc(n)[1]

    def latest(self) -> T | None:
        """The highest published document, or None (lists the directory)."""
        numbers = self.numbers()
        return self.read(numbers[-1]) if numbers else None

    def publish(self, n: int, doc: Mapping[str, Any], generation: int | None,
                before_write: Callable[[], None] | None = None) -> None:
        """Publish ``doc`` as number ``n``, exclusively, as the holder of lease ``generation``.

        Refuses (``FencedEpochError``) a document of another generation than ``generation``, a
        ``generation`` older than the lease's, or one older than the previous document's;
        refuses (``EpochOrderError``) a number that is not the next one (``n - 1`` missing) or
        that is already published (the loser of a race). ``before_write`` runs once every check
        passed, just before the exclusive create. An unfenced log takes ``generation=None`` and
        checks only the numbering.
        """
        path = self.path(n)
        if doc.get(self.number_key) != n:
            raise ValueError(f"{self.kind} {n} ({path}): document holds {self.number_key} {doc.get(self.number_key)!r}")
        if (generation is None) == self.fenced:
            raise ValueError(f"{self.kind} {n}: a {'fenced' if self.fenced else 'unfenced'} log takes "
                             f"{'a generation' if self.fenced else 'generation=None'}, got {generation!r}")
        self._check_fence(n, path, doc, generation)
        if before_write is not None:
            before_write()
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            write_json_exclusive(path, dict(doc), fs=self.paths.fs)
        except FileExistsError:
            raise EpochOrderError(f"{self.kind} {n} is already published at {path}") from None

    def _check_fence(self, n: int, path: Path, doc: Mapping[str, Any], generation: int | None) -> None:
        """Refuse stale generations (fenced logs) and a number whose predecessor is missing."""
        if generation is None:
            if n > 0 and not self.path(n - 1).exists():
                raise EpochOrderError(f"cannot publish {self.kind} {n} ({path}): {self.kind} {n - 1} "
                                      f"is not published; numbering must be dense")
            return
        if doc.get("generation") != generation:
            raise FencedEpochError(f"{self.kind} {n} ({path}) carries generation {doc.get('generation')} "
                                   f"but the publisher holds lease generation {generation}")
        current = lease_generation(self.paths)
        if generation < current:
            raise FencedEpochError(f"cannot publish {self.kind} {n} ({path}) as generation {generation}: "
                                   f"{self.paths.lease} is at generation {current} (a newer {self.holder} took over)")
        if n > 0:
            try:
                prev, _ = self.read_doc(n - 1)
            except FileNotFoundError:
                raise EpochOrderError(f"cannot publish {self.kind} {n} ({path}): {self.kind} {n - 1} "
                                      f"is not published; numbering must be dense") from None
            if prev["generation"] > generation:
                raise FencedEpochError(f"cannot publish {self.kind} {n} as generation {generation}: "
                                       f"{self.kind} {n - 1} already has generation {prev['generation']}")

    def check_order(self, n: int, generation: int, highest_seen: int, who: str) -> None:
        """A reader's fence: refuse document ``n`` of ``generation`` when a newer one was seen."""
        if generation < highest_seen:
            raise FencedEpochError(f"{who}: {self.kind} {n} ({self.path(n)}) has generation {generation}, older "
                                   f"than generation {highest_seen} already seen; refusing it")


__all__ = ["NumberedFiles", "lease_generation"]
