"""The small Hugging Face architectures the tests make (``slurm_rl.toy.checkpoint.make_checkpoint``
keyword arguments), each with its real particulars: Llama GQA + Llama-3 RoPE scaling (positions
beyond the original 16 are rotated by the scaled frequencies), Qwen2 q/k/v biases + tied
embeddings, Qwen3 q/k RMSNorm + head_dim 48 != hidden 64 / 2 heads."""

from typing import Any

ARCHS: dict[str, dict[str, Any]] = {
    "llama": dict(num_heads=2, num_kv_heads=1, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}),
    "qwen2": dict(num_heads=2, num_kv_heads=1, tie_word_embeddings=True, rope_theta=1e6),
    "qwen3": dict(num_heads=2, num_kv_heads=2, head_dim=48, rope_theta=1e6),
}
