"""``transformers`` rollout backend (the CPU default): Llama, Qwen2 or Qwen3.

The model is loaded from the run's HF checkpoint directory, or built from ``ModelConfig`` with
random init (no hub) when the run has none. ``generate`` uses HF
``generate`` with left padding; the returned logprobs are recomputed from the *raw* logits
(``output_logits``), so they are the temperature-1 model logprobs of the sampled tokens (see
``base``), independent of the temperature / top-p used for sampling.

With per-request ``SamplingParams.seeds``, ``generate`` runs its own KV-cached decode loop
instead: each row draws from its own ``torch.Generator`` (one uniform per generated token, on the
CPU so the stream does not depend on the device), so a completion does not depend on the other
requests of the call, up to the model's batched-vs-single floating-point differences.

Weights staged while that loop runs (:meth:`HFRolloutEngine.stage_weights`, from the ``between_tokens``
hook or another thread) land at the next token boundary when the engine does partial rollout (AReaL's
interruptible generation): the loop loads them, recomputes the KV cache of every row's prompt and tokens so
far with the new weights, and goes on; each token records the version that drew it. Without partial
rollout (``partial_rollout=False``, verl's ``partial_rollout: false``) the running requests finish on the
old weights and the new ones land when ``generate`` returns.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor

from slurm_rl.engines.convert import hf_config
from slurm_rl.engines.model_config import ModelConfig
from slurm_rl.engines.parking import HostParking, ParkedError
from slurm_rl.engines.rollout.base import Generation, RolloutEngine, SamplingParams
from slurm_rl.rl.tokenizer import pad_batch


def build_hf_model(cfg: ModelConfig, seed: int = 0, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa",
                   checkpoint: str | Path | None = None) -> torch.nn.Module:
    """The ``transformers`` causal LM of ``cfg``'s architecture (Llama, Qwen2, Qwen3), in eval
    mode: loaded from the HF ``checkpoint`` directory when given, else random-init by ``seed``."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    if checkpoint is not None:
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=dtype,
                                                     attn_implementation=attn_implementation)
    else:
        # No default eos: generation stops only on SamplingParams.stop_token_ids.
        hf_cfg = hf_config(cfg, pad_token_id=0, bos_token_id=None, eos_token_id=None)
        hf_cfg._attn_implementation = attn_implementation
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(hf_cfg)
    model.generation_config = GenerationConfig(pad_token_id=0)
    model = model.to(device=device, dtype=dtype).eval()
    if checkpoint is not None and torch.device(device).type == "cpu":
        with torch.no_grad():  # own storage, not the file's memory map: parking resizes it
            for t in [*model.parameters(), *model.buffers()]:
                if t.untyped_storage().data_ptr() and not t.untyped_storage().resizable():
                    t.data = t.data.clone()
    return model


@torch.no_grad()
def packed_inputs(sequences: Sequence[Sequence[int]], device: torch.device) -> dict[str, Tensor]:
    """``sequences`` as one row for an HF model: ``input_ids`` and ``position_ids`` ``[1, N]``, positions
    restarting at each sequence (transformers then keeps attention inside each; no cache)."""
    ids = torch.tensor([t for s in sequences for t in s], device=device).unsqueeze(0)
    pos = torch.cat([torch.arange(len(s), device=device) for s in sequences]).unsqueeze(0)
    return {"input_ids": ids, "position_ids": pos, "use_cache": False}


def unpack_rows(out: Tensor, sequences: Sequence[Sequence[int]]) -> list[Tensor]:
    """Per-sequence slices ``[len - 1]`` of a packed row's next-token values ``out [1, N - 1]``."""
    rows, start = [], 0
    for s in sequences:
        rows.append(out[0, start:start + len(s) - 1].clone())
        start += len(s)
    return rows


def score_sequences(model: torch.nn.Module, sequences: Sequence[Sequence[int]],
                    device: torch.device, pad_id: int = 0, packed: bool = False) -> list[Tensor]:
    """Per-token fp32 logprobs of ``sequences`` under an HF causal LM: right-padded rows, or with ``packed``
    one row without padding (:func:`packed_inputs`)."""
    if not sequences:
        return []
    if packed:
        inputs = packed_inputs(sequences, device)
        input_ids = inputs["input_ids"]
    else:
        ids, mask = pad_batch(sequences, pad_id, left=False)
        input_ids = torch.tensor(ids, device=device)
        inputs = {"input_ids": input_ids, "attention_mask": torch.tensor(mask, device=device)}
    logits = model(**inputs).logits[:, :-1].float()
    tok = (torch.gather(logits, 2, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
           - torch.logsumexp(logits, dim=-1)).cpu()
    if packed:
        return unpack_rows(tok, sequences)
    return [tok[i, : len(s) - 1].clone() for i, s in enumerate(sequences)]


def draw_tokens(logits: Tensor, temperature: float, top_p: float, uniforms: Tensor,
                top_k: int = 0) -> Tensor:
    """Sample one token per row of ``logits`` [B, V] by inverse CDF with ``uniforms`` [B].

    Greedy (argmax) when ``temperature == 0``. Otherwise the tokens are sorted by descending
    probability (stable), cut to the ``top_k`` most likely (0: all), then to the smallest prefix
    whose mass reaches ``top_p`` and the token
    is the first whose cumulative mass exceeds ``u`` times the kept mass. Every op is row-wise.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    kept: Tensor | float = 1.0  # the mass top-k keeps
    if 0 < top_k < sorted_p.shape[-1]:
        sorted_p = sorted_p.clone()
        sorted_p[:, top_k:] = 0
        kept = sorted_p.sum(dim=-1, keepdim=True)
    cum = sorted_p.cumsum(dim=-1)
    if top_p < 1:
        sorted_p = torch.where(cum - sorted_p < top_p * kept, sorted_p, torch.zeros_like(sorted_p))
        cum = sorted_p.cumsum(dim=-1)
    target = (uniforms.to(cum.device, cum.dtype) * cum[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cum, target, right=True).clamp(max=cum.shape[-1] - 1)
    return torch.gather(order, 1, idx).squeeze(-1)


class HFRolloutEngine(RolloutEngine):
    """Rollout with HF ``generate``; weights are replaced in place by ``update_weights``."""

    def __init__(self, model_cfg: ModelConfig, device: str = "cpu", seed: int = 0,
                 pad_id: int = 0, attn_implementation: str = "sdpa",
                 checkpoint: str | Path | None = None, partial_rollout: bool = True) -> None:
        self.model_cfg = model_cfg
        self.partial_rollout = partial_rollout
        self._staged: tuple[list[tuple[str, Tensor]], int] | None = None  # weights waiting for a boundary
        self._staging = threading.Lock()
        self._generating = False
        self.device = torch.device(device)
        self.pad_id = pad_id
        self.model = build_hf_model(model_cfg, seed, self.device,
                                    attn_implementation=attn_implementation, checkpoint=checkpoint)
        self.weight_version = 0
        self._parking = HostParking("HFRolloutEngine")

    @property
    def released(self) -> bool:
        """Whether the weights are parked in host memory (see :meth:`release`)."""
        return self._parking.parked

    def _check_live(self, what: str) -> None:
        if self.released:
            raise ParkedError(f"HFRolloutEngine.{what}: engine is released (weights parked in "
                              "host memory); call resume() first")

    def _generation_config(self, sampling: SamplingParams):
        from transformers import GenerationConfig

        greedy = sampling.temperature == 0
        stop = list(sampling.stop_token_ids) or None
        return GenerationConfig(
            max_new_tokens=sampling.max_new_tokens, min_new_tokens=0, do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p, top_k=sampling.top_k or None,
            eos_token_id=stop, pad_token_id=self.pad_id, bos_token_id=None,
            return_dict_in_generate=True, output_logits=True, use_cache=True)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
                 between_tokens: Callable[[int], None] | None = None) -> list[Generation]:
        """Sample one completion per prompt (stop token included in ``token_ids``).

        ``between_tokens(step)`` is called at each token boundary of the per-request decode loop (after
        ``step`` tokens of every running row), where it may :meth:`stage_weights`; it needs per-request
        ``seeds``. Weights staged during the call and not landed in it land when it returns."""
        self._check_live("generate")
        seeds = sampling.request_seeds(len(prompts))
        if between_tokens is not None and seeds is None:
            raise ValueError("HFRolloutEngine.generate: between_tokens needs sampling.seeds (the per-request "
                             "decode loop is the one that pauses at token boundaries)")
        self._generating = True
        try:
            return self._generate(prompts, sampling, seeds, between_tokens)
        finally:
            self._generating = False
            self._land_staged()

    @torch.no_grad()
    def _generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
                  seeds: Sequence[int] | None, between_tokens: Callable[[int], None] | None) -> list[Generation]:
        if not prompts:
            return []
        if seeds is not None:
            return self._generate_per_request(prompts, sampling, seeds, between_tokens)
        ids, mask = pad_batch(prompts, self.pad_id, left=True)
        input_ids = torch.tensor(ids, device=self.device)
        attn = torch.tensor(mask, device=self.device)
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            out = self.model.generate(input_ids=input_ids, attention_mask=attn,
                                      generation_config=self._generation_config(sampling))
        new = out.sequences[:, input_ids.shape[1]:].cpu()
        logits = torch.stack(out.logits, dim=1).float()  # [B, T, V] raw model logits
        logp = torch.gather(torch.log_softmax(logits, dim=-1), 2,
                            new.to(logits.device).unsqueeze(-1)).squeeze(-1).cpu()
        stops = set(sampling.stop_token_ids)
        result = []
        for i, prompt in enumerate(prompts):
            row = new[i].tolist()
            end = next((j + 1 for j, t in enumerate(row) if t in stops), None)
            n = end if end is not None else len(row)
            result.append(Generation(token_ids=row[:n], logprobs=logp[i, :n].tolist(),
                                     finish_reason="stop" if end is not None else "length",
                                     weight_version=self.weight_version,
                                     prompt_ids=list(prompt)))
        return result

    def _recomputed_cache(self, prompt_ids: Tensor, tokens: list[Tensor], mask: Tensor):
        """The KV cache of the prompts and every token drawn so far but the last, under the weights now loaded
        (the last token is the decode loop's next input)."""
        from transformers import DynamicCache

        seen = torch.cat([prompt_ids, *[t.unsqueeze(-1) for t in tokens[:-1]]], dim=-1)
        seen_mask = mask[:, :seen.shape[1]]
        cache = DynamicCache(config=self.model.config)
        self.model(input_ids=seen, attention_mask=seen_mask, position_ids=(seen_mask.cumsum(-1) - 1).clamp(min=0),
                   past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache

    @torch.no_grad()
    def _generate_per_request(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
                              seeds: Sequence[int], between_tokens: Callable[[int], None] | None = None
                              ) -> list[Generation]:
        """Batch-invariant sampling: a KV-cached decode loop with one generator per row."""
        from transformers import DynamicCache

        gens = [torch.Generator().manual_seed(s) for s in seeds]
        ids, mask_rows = pad_batch(prompts, self.pad_id, left=True)
        prompt_ids = torch.tensor(ids, device=self.device)
        step_ids = prompt_ids
        mask = torch.tensor(mask_rows, device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        first_version = self.weight_version
        versions: list[int] = []  # the version that drew each step's tokens
        stops = torch.tensor(sorted(set(sampling.stop_token_ids)), dtype=torch.long,
                             device=self.device)
        done = torch.zeros(len(prompts), dtype=torch.bool, device=self.device)
        stopped = done.clone()
        tokens: list[Tensor] = []
        logps: list[Tensor] = []
        for _ in range(sampling.max_new_tokens):
            out = self.model(input_ids=step_ids, attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1].float()  # raw model logits of the next token
            uniforms = torch.stack([torch.rand((), generator=g) for g in gens])
            tok = draw_tokens(logits, sampling.temperature, sampling.top_p, uniforms, sampling.top_k)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            tokens.append(tok)
            versions.append(self.weight_version)
            logps.append(torch.gather(torch.log_softmax(logits, dim=-1), 1,
                                      tok.unsqueeze(-1)).squeeze(-1))
            hit = ~done & torch.isin(tok, stops)
            stopped |= hit
            positions = mask.sum(-1, keepdim=True)
            mask = torch.cat([mask, (~done).long().unsqueeze(-1)], dim=-1)
            done = done | hit
            if bool(done.all()):
                break
            step_ids = tok.unsqueeze(-1)
            if between_tokens is not None:
                between_tokens(len(tokens))
            if self.partial_rollout and self._land_staged():
                cache = self._recomputed_cache(prompt_ids, tokens, mask)
        new = torch.stack(tokens, dim=1).cpu()
        logp = torch.stack(logps, dim=1).cpu()
        n_new = mask[:, len(ids[0]):].sum(-1).cpu()  # tokens each row generated, stop included
        stopped_rows = stopped.cpu().tolist()
        return [Generation(token_ids=new[i, :n].tolist(), logprobs=logp[i, :n].tolist(),
                           finish_reason="stop" if stopped_rows[i] else "length",
                           weight_version=first_version, prompt_ids=list(prompt), token_versions=versions[:n])
                for i, (prompt, n) in enumerate(zip(prompts, n_new.tolist()))]

    def stage_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """New weights that land at the next token boundary of a running :meth:`generate` (with partial rollout;
        else when it returns), at once where none runs. The tensors are checked and copied now (the caller
        may reuse its buffers); a later staging replaces an earlier one not yet landed."""
        params = dict(self.model.named_parameters())
        copied = []
        for name, tensor in named_tensors:
            self._check_tensor(params, name, tensor)
            copied.append((name, tensor.detach().clone()))
        with self._staging:
            self._staged = (copied, version)
        if not self._generating:
            self._land_staged()

    def _land_staged(self) -> bool:
        """Load the staged weights, if any; whether some landed."""
        with self._staging:
            staged, self._staged = self._staged, None
        if staged is None:
            return False
        self.update_weights(*staged)
        return True

    @staticmethod
    def _check_tensor(params: dict[str, Tensor], name: str, tensor: Tensor) -> None:
        if name not in params:
            raise KeyError(f"HFRolloutEngine.update_weights: unknown parameter {name!r}")
        if tuple(params[name].shape) != tuple(tensor.shape):
            raise ValueError(f"HFRolloutEngine.update_weights: {name} has shape "
                             f"{tuple(tensor.shape)}, model expects {tuple(params[name].shape)}")

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Copy HF-named tensors into the model; unknown names or shapes raise naming them.

        While released the tensors are written into the host copies of the weights, which
        :meth:`resume` puts back on the device: a parked engine receives the next weights.
        """
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            self._check_tensor(params, name, tensor)
            p = params[name]
            target = self._parking.host_view(p) if self.released else p
            target.copy_(tensor.to(device=target.device, dtype=p.dtype))
        self.weight_version = version

    def score(self, sequences: Sequence[Sequence[int]]) -> list[Tensor]:
        """fp32 logprob of every token after the first, per sequence."""
        self._check_live("score")
        return score_sequences(self.model, sequences, self.device, self.pad_id)

    def release(self) -> dict[str, float]:  # type: ignore[override]
        """Park the weights (parameters and buffers) in host memory, pinned on CUDA, and free
        their device storage in place: the same parameter objects stay in the model.

        While released ``generate``/``score`` (and a forward of ``model``) raise ``ParkedError``
        and ``update_weights`` writes into the host copies. Returns ``bytes`` (copied to host),
        ``device_bytes`` (freed) and ``seconds``; zeros when already released.
        """
        return self._parking.park([*self.model.parameters(), *self.model.buffers()],
                                  guard=[self.model])

    def resume(self) -> dict[str, float]:  # type: ignore[override]
        """Put the parked weights back into the same tensors (the last ``update_weights``
        included). Returns ``bytes``, ``device_bytes`` and ``seconds``; zeros when not released.
        """
        return self._parking.unpark()
