"""Reference-policy logprobs (frozen initial weights) for GRPO's KL term.

The scorer runs the HF Llama twin of the actor's model rather than megatron-core: it needs no
torch.distributed world or megatron globals, builds in well under a second, runs SDPA attention
and gives the same logprobs as the actor within 1e-3 in fp32 (see tests/test_rollout_consistency).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Sequence

import torch
from torch import Tensor

from slurm_rl.engines.convert import megatron_to_hf
from slurm_rl.engines.model_config import ModelConfig
from slurm_rl.engines.parking import HostParking
from slurm_rl.engines.rollout.hf import build_hf_model, score_sequences

_MEGATRON = re.compile(r"^(?:module\.)*(?:embedding|decoder|output_layer)\.")


def to_hf_names(named: Iterable[tuple[str, Tensor]], cfg: ModelConfig
                ) -> list[tuple[str, Tensor]]:
    """Accept HF- or megatron-named tensors; return HF-named ones."""
    items = list(named)
    if items and _MEGATRON.match(items[0][0]):
        return list(megatron_to_hf(items, cfg))
    return items


class ReferenceScorer:
    """A copy of a policy that scores sequences: the frozen initial policy (the run's HF checkpoint,
    or the given initial state: a random model's init), or the actor's weights of an iteration,
    given by :meth:`load_weights` (the old log-probs of ``algorithm.old_logprobs: actor``)."""

    def __init__(self, model_cfg: ModelConfig, initial_state: Iterable[tuple[str, Tensor]] | None,
                 device: str = "cpu", max_tokens_per_batch: int = 16384,
                 checkpoint: str | Path | None = None, dtype: torch.dtype = torch.float32,
                 packed: bool = False) -> None:
        self.model_cfg = model_cfg
        self.device = torch.device(device)
        self.max_tokens_per_batch = max_tokens_per_batch
        self.packed = packed  # score packed rows (train.use_remove_padding): no padding computed
        self.model = self._build(model_cfg, checkpoint, dtype)
        self.model.requires_grad_(False)
        self._parking = HostParking("ReferenceScorer")
        if checkpoint is not None:
            return  # the checkpoint's weights, as loaded
        if initial_state is None:
            if self.needs_initial_state:
                raise ValueError("ReferenceScorer: give initial_state or checkpoint")
            return
        self.load_weights(initial_state)

    needs_initial_state = True
    """A copy of a policy holds real weights from the start; a :class:`ValueScorer` gets them at each sync."""

    def _build(self, model_cfg: ModelConfig, checkpoint: str | Path | None, dtype: torch.dtype) -> torch.nn.Module:
        return build_hf_model(model_cfg, seed=0, device=self.device, checkpoint=checkpoint, dtype=dtype)

    def _hf_names(self, named: Iterable[tuple[str, Tensor]]) -> list[tuple[str, Tensor]]:
        return to_hf_names(named, self.model_cfg)

    def load_weights(self, named: Iterable[tuple[str, Tensor]]) -> None:
        """Copy every parameter in (HF or megatron names); raises KeyError on an unknown or a missing one.
        While parked the tensors go into the host copies, which :meth:`unpark` puts back."""
        params = dict(self.model.named_parameters())
        loaded = set()
        with torch.no_grad():
            for name, t in self._hf_names(named):
                if name not in params:
                    raise KeyError(f"ReferenceScorer: unknown parameter {name!r}")
                target = self._parking.host_view(params[name]) if self.parked else params[name]
                target.copy_(t.to(device=target.device, dtype=target.dtype))
                loaded.add(name)
        missing = sorted(set(params) - loaded)
        if missing:
            raise KeyError(f"ReferenceScorer: the weights lack {missing[:5]}")

    @property
    def parked(self) -> bool:
        """Whether the reference weights are parked in host memory (see :meth:`park`)."""
        return self._parking.parked

    def park(self) -> dict[str, float]:
        """Copy the frozen weights (parameters and buffers) to host memory, pinned on CUDA, and
        free their device storage in place; :meth:`score` raises ``ParkedError`` until
        :meth:`unpark`. Returns ``bytes``, ``device_bytes`` and ``seconds`` (zeros when already
        parked)."""
        return self._parking.park([*self.model.parameters(), *self.model.buffers()],
                                  guard=[self.model])

    def unpark(self) -> dict[str, float]:
        """Put the parked weights back into the same tensors. Zeros when not parked."""
        return self._parking.unpark()

    def score(self, sequences: Sequence[Sequence[int]]) -> list[Tensor]:
        """fp32 reference logprob of every token after the first, per sequence, in batches of at most
        ``max_tokens_per_batch`` computed tokens (padded rows x longest, or a packed row's sum)."""
        self._parking.check_live("score")
        out: list[Tensor] = []
        batch: list[Sequence[int]] = []
        longest = total = 0
        for seq in sequences:
            longest, total = max(longest, len(seq)), total + len(seq)
            size = total if self.packed else longest * (len(batch) + 1)
            if batch and size > self.max_tokens_per_batch:
                out += self._score_batch(batch)
                batch, longest, total = [], len(seq), len(seq)
            batch.append(seq)
        if batch:
            out += self._score_batch(batch)
        return out

    def _score_batch(self, batch: Sequence[Sequence[int]]) -> list[Tensor]:
        return score_sequences(self.model, batch, self.device, packed=self.packed)


class ValueScorer(ReferenceScorer):
    """The critic's copy on an inference rank (or on the actor's leader without inference ranks):
    transformers' ``*ForTokenClassification`` of one label, given the critic's weights of each
    iteration by :meth:`load_weights` (megatron names: :func:`~slurm_rl.engines.convert.critic_to_hf`).
    :meth:`score` gives the value of every position but the last (the next-token layout). Built
    without ``initial_state`` it holds a seeded random init until the first sync loads the critic."""

    needs_initial_state = False

    def _build(self, model_cfg: ModelConfig, checkpoint: str | Path | None, dtype: torch.dtype) -> torch.nn.Module:
        from transformers import AutoModelForTokenClassification

        from slurm_rl.engines.convert import hf_config

        cfg = hf_config(model_cfg, num_labels=1, pad_token_id=0)
        cfg._attn_implementation = "sdpa"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = AutoModelForTokenClassification.from_config(cfg)
        return model.to(device=self.device, dtype=dtype).eval()

    def _hf_names(self, named: Iterable[tuple[str, Tensor]]) -> list[tuple[str, Tensor]]:
        from slurm_rl.engines.convert import critic_to_hf

        items = list(named)
        return list(critic_to_hf(items, self.model_cfg)) if items and _MEGATRON.match(items[0][0]) else items

    @torch.no_grad()
    def _score_batch(self, batch: Sequence[Sequence[int]]) -> list[Tensor]:
        from slurm_rl.engines.rollout.hf import packed_inputs, unpack_rows
        from slurm_rl.rl.tokenizer import pad_batch

        if self.packed:
            out = self.model(**packed_inputs(batch, self.device)).logits[:, :-1, 0].float().cpu()
            return unpack_rows(out, batch)
        ids, mask = pad_batch(batch, 0, left=False)
        out = self.model(input_ids=torch.tensor(ids, device=self.device),
                         attention_mask=torch.tensor(mask, device=self.device)).logits[..., 0].float().cpu()
        return [out[i, : len(s) - 1].clone() for i, s in enumerate(batch)]
