"""Resolving ``reward.name`` (a built-in reward) or ``reward.fn`` (``package.module:function``, a
user's reward importable from the working directory or ``sys.path``) to a callable.

:func:`reward_problems` reports what is wrong as (config key, value, what is allowed) tuples (the
form of :class:`~slurm_rl.placement.ConfigIssue`); :func:`resolve_reward` raises them as a
:class:`~slurm_rl.placement.ConfigError` (an :class:`~slurm_rl.errors.InputError`).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from slurm_rl.placement import ConfigError, ConfigIssue
from slurm_rl.rewards.builtin import BUILTIN, RewardFn

__all__ = ["FN_FORM", "FN_RE", "cwd_on_sys_path", "import_reward", "resolve_reward", "reward_label", "reward_problems"]

FN_FORM = "'package.module:function', importable from the working directory or sys.path"
"""What ``reward.fn`` must look like."""

FN_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def _builtin_names() -> str:
    return ", ".join(sorted(BUILTIN))


def reward_label(name: str | None, fn: str | None) -> str:
    """How errors name the reward: the built-in name or ``module:function``."""
    return name if name is not None else str(fn)


def cwd_on_sys_path() -> None:
    """Put the working directory first on ``sys.path`` unless it is there (``python -m`` does)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def import_reward(fn: str) -> Callable[..., Any]:
    """Import ``module:function`` with the current ``sys.path`` as is; raises ImportError,
    AttributeError or TypeError (not callable). The worker processes use this directly."""
    module_name, _, attr = fn.partition(":")
    module = importlib.import_module(module_name)
    func = getattr(module, attr)
    if not callable(func):
        raise TypeError(f"{fn} is a {type(func).__name__}, not a function")
    return func  # type: ignore[no-any-return]


def _resolve(name: str | None, fn: str | None) -> tuple[RewardFn | None, list[tuple[str, Any, str]]]:
    """(the reward or None, the problems)."""
    if (name is None) == (fn is None):
        return None, [("reward.name", name, (
            f"exactly one of reward.name (a built-in: {_builtin_names()}) and reward.fn "
            f"({FN_FORM}); got reward.fn={fn!r}"))]
    if name is not None:
        if not isinstance(name, str) or name not in BUILTIN:
            return None, [("reward.name", name, f"one of {_builtin_names()}")]
        return BUILTIN[name], []
    if not isinstance(fn, str) or not FN_RE.match(fn):
        return None, [("reward.fn", fn, FN_FORM)]
    module_name, _, attr = fn.partition(":")
    cwd_on_sys_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return None, [("reward.fn", fn, f"{FN_FORM}; module {module_name!r} does not import: {exc}")]
    except Exception as exc:  # noqa: BLE001 - the module's own code failed while importing
        return None, [("reward.fn", fn, (f"{FN_FORM}; module {module_name!r} failed while importing: "
                                         f"{type(exc).__name__}: {exc}"))]
    if not hasattr(module, attr):
        return None, [("reward.fn", fn, f"a function of module {module_name!r}: it has no attribute {attr!r}")]
    func = getattr(module, attr)
    if not callable(func):
        return None, [("reward.fn", fn, (f"a function of module {module_name!r}: {attr!r} is a "
                                         f"{type(func).__name__}, not callable"))]
    return func, []


def reward_problems(name: str | None, fn: str | None) -> list[tuple[str, Any, str]]:
    """What is wrong with ``reward.name`` / ``reward.fn``, as (config key, value, what is allowed);
    empty when they resolve. Imports the ``reward.fn`` module (with the working directory on
    ``sys.path``)."""
    return _resolve(name, fn)[1]


def resolve_reward(name: str | None, fn: str | None) -> RewardFn:
    """The reward function named by ``reward.name`` (built-in) or ``reward.fn``
    (``package.module:function``); exactly one must be given. Raises
    :class:`~slurm_rl.placement.ConfigError` listing the problems."""
    func, problems = _resolve(name, fn)
    if problems or func is None:
        raise ConfigError([ConfigIssue(*p) for p in problems])
    return func
