"""One rank of a TP vLLM engine (``external_launcher``, one process per rank; gloo on cpu, NCCL on cuda):
``python tools/vllm_tp_check.py RANK WORLD STORE_FILE OUT_DIR [DEVICE]`` writes ``OUT_DIR/rank-RANK.json``.

Every rank builds the same engine on its shard and an hf engine (the TP-1 reference) of the same
random init; greedy tokens and scores are recorded before and after a weight sync in which rank 0,
holding the new full weights, sends every rank only its shard (``tp_shards``). Run by
tests/test_vllm_tp.py (cpu) and tools/gpu_check.sh (cuda).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

CFG = dict(vocab_size=48, hidden_size=64, num_layers=2, num_attention_heads=2, num_query_groups=1,
           max_position_embeddings=64)
PROMPTS = [[1, 5, 6, 7], [1, 8], [1, 9, 10, 11, 12, 13, 14], [1, 20, 21]]


def main(rank: int, world: int, store: str, out: Path, device: str = "cpu") -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      VLLM_ENABLE_V1_MULTIPROCESSING="0")
    import torch
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(rank)
    backend = "cuda:nccl,cpu:gloo" if device == "cuda" else "gloo"  # the shards travel from host memory
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    from slurm_rl.engines.model_config import ModelConfig
    from slurm_rl.engines.rollout import SamplingParams, make_rollout_engine
    from slurm_rl.engines.rollout.hf import build_hf_model
    from slurm_rl.engines.rollout.tp_shards import expand_shards, recv_shards, send_shards

    cfg = ModelConfig(**CFG)
    res: dict = {"rank": rank}
    gc.collect()  # vLLM collects the whole heap five times while it builds the engine: frozen, the imports
    gc.freeze()   # are not walked again (0.28 s a collection on cpu); a 64 MiB KV cache holds these prompts
    engine = make_rollout_engine("vllm", cfg, device=device, seed=0, ranks=world, tensor_parallel_size=world,
                                 max_model_len=32, kv_cache_gib=1 / 16)
    res["executor"] = engine.options["distributed_executor_backend"]
    hf = make_rollout_engine("hf", cfg, device=device, seed=0)
    greedy = SamplingParams(max_new_tokens=8, temperature=0)
    res["init"] = [[g.token_ids for g in e.generate(PROMPTS, greedy)] for e in (engine, hf)]
    new = [(n, t.detach().clone()) for n, t in build_hf_model(cfg, 11).state_dict().items()]
    shapes = {n: (tuple(t.shape), t.dtype) for n, t in new}
    heads, kv = cfg.num_attention_heads, cfg.kv_groups
    if rank == 0:
        own, res["bytes_sent"] = send_shards(new, list(range(world)), heads, kv)
        res["bytes_received"] = 0
    else:
        own, res["bytes_received"] = recv_shards(shapes, 0, world, rank, heads, kv)
    res["bytes_full"] = sum(t.numel() * t.element_size() for _, t in new)
    res["bytes_own_shard"] = sum(t.numel() * t.element_size() for _, t in own)
    engine.update_weights(expand_shards(own, {n: s for n, (s, _) in shapes.items()}, world, rank, heads, kv),
                          version=1)
    hf.update_weights(new, version=1)
    res["synced"] = [[g.token_ids for g in e.generate(PROMPTS, greedy)] for e in (engine, hf)]
    probe = [p + [3, 4, 5] for p in PROMPTS]
    res["score_diff"] = max(float((a.cpu() - b.cpu()).abs().max()) for a, b in zip(engine.score(probe), hf.score(probe)))
    res["version"] = engine.weight_version
    (out / f"rank-{rank}.json").write_text(json.dumps(res))
    engine.close()
    if dist.is_initialized():  # vLLM may have torn the group down with its engine
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), *sys.argv[5:6])
