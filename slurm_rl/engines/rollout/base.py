"""Rollout engine interface shared by the hf and vllm backends.

"Sampled logprobs" everywhere in this package means ``log p_theta(token | prefix)`` of the
*unmodified* model (temperature 1, no top-p / top-k), in fp32 — the quantity GRPO's policy ratio
compares against the actor — regardless of the temperature / top-p used to draw the token.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Iterable, Literal, Sequence

from torch import Tensor

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature=0`` means greedy.

    ``seeds`` (one per prompt) makes each completion depend only on its prompt, the weights and
    its own seed: not on the other requests of the ``generate`` call (batch-invariant sampling).
    Without ``seeds``, ``seed`` seeds the whole call (the result may depend on the batch).
    """

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # sample among the k most likely tokens; 0: all
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens: got {self.max_new_tokens}, expected >= 1")
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature: got {self.temperature}, expected >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p: got {self.top_p}, expected in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k: got {self.top_k}, expected >= 0 (0: off)")
        if self.seeds is not None:
            object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))

    def request_seeds(self, n_prompts: int) -> tuple[int, ...] | None:
        """``seeds`` checked against the number of prompts of a ``generate`` call."""
        if self.seeds is not None and len(self.seeds) != n_prompts:
            raise ValueError(f"sampling.seeds: got {len(self.seeds)} seeds for {n_prompts} "
                             "prompts, expected one per prompt")
        return self.seeds


@dataclass
class Generation:
    """One completion: sampled ids (stop token included), their fp32 logprobs, provenance.

    ``weight_version`` is the policy version the request started with; ``token_versions`` the version
    that drew each token (empty: every token was drawn by ``weight_version``). They differ where new weights
    landed while the request was decoding (a partial rollout, :meth:`RolloutEngine.stage_weights`)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    weight_version: int
    prompt_ids: list[int] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)

    @property
    def last_version(self) -> int:
        """The policy version that drew the last token (the first one where nothing was drawn)."""
        return self.token_versions[-1] if self.token_versions else self.weight_version


class RolloutEngine(abc.ABC):
    """Generates completions with a model whose weights the actor replaces in place."""

    weight_version: int

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
                 ) -> list[Generation]:
        """One completion per prompt, in prompt order."""

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Copy HF-named tensors into the model (all of them in one call) and set the version."""

    def stage_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """New weights that may land while requests decode: an engine that can pause at a token boundary
        (partial rollout) loads them there and goes on; this default loads them at once, which is right only
        between ``generate`` calls."""
        self.update_weights(named_tensors, version)

    @abc.abstractmethod
    def score(self, sequences: Sequence[Sequence[int]]) -> list[Tensor]:
        """fp32 logprob of each token given its prefix: ``len(seq) - 1`` values per sequence."""

    @abc.abstractmethod
    def release(self) -> None:
        """Free the engine's accelerator memory (the epoch takes the device away)."""

    @abc.abstractmethod
    def resume(self) -> None:
        """Restore what ``release`` freed; weights are those of the last ``update_weights``."""

    def close(self) -> None:
        """Shut the engine down for good (default: nothing to do)."""
