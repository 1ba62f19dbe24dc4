"""verl's and RLinf's configs, read as they are: one table per dialect, one translation.

``slurm-rl validate|run|submit CONFIG [overrides]`` take a verl config (``actor_rollout_ref:`` / ``trainer:``
sections, or the word ``verl`` for verl's default config) or an RLinf config (a ``runner:`` section), with
Hydra-style overrides in that dialect (``key=value``, ``+key=value``, ``++key=value``, ``~key``) and in ours
beside them (``runtime.device=emulated``). :func:`translate` maps every foreign key through its dialect's table
(:mod:`slurm_rl.dialects.verl`, :mod:`slurm_rl.dialects.rlinf`): each key is mapped onto ours with its meaning,
ignored with the reason it has no effect here (a warning where its value asks for something), or refused
(a :class:`ConfigIssue`: exit 2) where it asks for something this project does not do. Keys a table does not
know are refused too. docs/coming-from-verl.md and docs/coming-from-rlinf.md are generated from the tables.
"""

from __future__ import annotations

from slurm_rl.dialects.core import Key, Row, Translation, detect_dialect, split_overrides, translate

__all__ = ["Key", "Row", "Translation", "detect_dialect", "split_overrides", "translate"]
