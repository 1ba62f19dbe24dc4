"""Packed micro-batches (``train.use_remove_padding``), token bins, DP balance and chunked log-probs.

A packed row concatenates a micro-batch's samples without padding: positions restart per sample and
attention stays inside each (megatron-core's THD path, one causal SDPA call per sample), so every sample's
log-probs, and a step's gradients, are those of the padded micro-batch up to float rounding. The log-probs
come from chunked logits whose backward recomputes each chunk: the same values and gradients as the whole
logits' (fp64 to 1e-9). How many micro-batches a step is cut into never changes its loss or the LR schedule.
"""

from __future__ import annotations

import math

import pytest
import torch

from slurm_rl.engines.actor.logprobs import batch_logprobs, chunked_logprobs, full_logprobs
from slurm_rl.engines.actor.microbatch import (BatchConfig, balanced_partition, collate, collate_packed,
                                               first_fit_decreasing, shard_for_rank, split_microbatches,
                                               token_and_sequence_counts, workload)
from slurm_rl.engines.actor.model import build_gpt_model, init_local_process_group
from slurm_rl.engines.model_config import ModelConfig
from slurm_rl.rl.losses import LossAggregation

MODEL = ModelConfig(vocab_size=97, hidden_size=64, num_layers=2, num_attention_heads=2, num_query_groups=1,
                    ffn_hidden_size=128, max_position_embeddings=128)
LENGTHS = (5, 17, 9, 30, 3, 12)  # short samples: attention under one block-diagonal mask
LONG = (60, 90, 7)  # long ones: attention one call per sample (slurm_rl.engines.actor.attention)


@pytest.fixture(scope="module", autouse=True)
def _world() -> None:
    init_local_process_group()


def samples_of(lengths=LENGTHS, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(0, MODEL.vocab_size, (n,), generator=g).tolist()
        mask = [0.0] * min(2, n - 1) + [1.0] * (n - 1 - min(2, n - 1))  # a 3-token prompt, the rest response
        out.append({"input_ids": ids, "loss_mask": mask, "advantages": [(-1.0) ** i * m for m in mask]})
    return out


def per_sample(values: torch.Tensor, batch: dict, lengths) -> list[torch.Tensor]:
    """Each sample's ``T - 1`` next-token values out of a padded ``[B, T-1]`` or packed ``[1, N-1]`` batch."""
    if "cu_seqlens" not in batch:
        return [values[i, :n - 1] for i, n in enumerate(lengths)]
    cu = batch["cu_seqlens"].tolist()
    return [values[0, cu[i]:cu[i] + n - 1] for i, n in enumerate(lengths)]


@pytest.mark.parametrize("lengths", [LENGTHS, LONG])
@pytest.mark.parametrize("precision,atol", [("fp32", 2e-6), ("bf16", 0.04)])
def test_packed_and_padded_rows_give_the_same_logprobs_entropies_and_gradients(precision: str, atol: float,
                                                                               lengths: tuple) -> None:
    """Log-probs are O(5) (log 97 = 4.6): fp32 rounding moves them by ~5e-7; in bf16 a logit's last bit is
    4.6 * 2^-8 = 0.018, and the tolerance two of those (measured: 1e-6, the fp32 reduction). Gradients are compared to their tensor's largest
    entry (a sum over tokens of O(1) terms): 1e-5 in fp32, 2e-2 (bf16's 8 bits of mantissa) in bf16."""
    from slurm_rl.engines.actor.attention import packed_attention_form

    model = build_gpt_model(MODEL, seed=0, precision=precision)
    samples = samples_of(lengths)
    padded, packed = collate(samples), collate_packed(samples)
    assert packed["input_ids"].shape == (1, sum(lengths)) and padded["input_ids"].shape == (len(lengths), max(lengths))
    assert packed_attention_form(packed["cu_seqlens"].tolist()) == ("mask" if lengths == LENGTHS else "per_sample")
    results = []
    for batch in (padded, packed):
        model.zero_grad()
        lp, ent = batch_logprobs(model, batch, "cpu", entropy=True)
        ((lp * batch["advantages"] + 0.01 * ent) * batch["loss_mask"]).sum().backward()
        results.append((per_sample(lp.detach(), batch, lengths), per_sample(ent.detach(), batch, lengths),
                        {n: p.grad.float().clone() for n, p in model.named_parameters()}))
    (lp_a, ent_a, grad_a), (lp_b, ent_b, grad_b) = results
    for a, b in zip(lp_a + ent_a, lp_b + ent_b):
        assert float((a - b).abs().max()) <= atol
    rtol = 1e-5 if precision == "fp32" else 2e-2
    for name, g in grad_a.items():
        assert float((g - grad_b[name]).abs().max()) <= rtol * float(g.abs().max()), name


@pytest.mark.parametrize("lengths", [LENGTHS, LONG])
def test_a_sample_of_a_packed_row_sees_only_itself(lengths: tuple) -> None:
    model = build_gpt_model(MODEL, seed=1)
    samples = samples_of(lengths)
    changed = [dict(s) for s in samples]
    changed[2] = {**samples[2], "input_ids": [(t + 1) % MODEL.vocab_size for t in samples[2]["input_ids"]]}
    with torch.no_grad():
        before = per_sample(batch_logprobs(model, collate_packed(samples), "cpu")[0], collate_packed(samples), lengths)
        after = per_sample(batch_logprobs(model, collate_packed(changed), "cpu")[0], collate_packed(changed), lengths)
        alone = [batch_logprobs(model, collate([s]), "cpu")[0][0] for s in samples]
    for i in range(len(samples)):
        if i == 2:
            assert not torch.allclose(before[i], after[i])
        else:
            assert torch.equal(before[i], after[i]), i  # the neighbour's tokens change nothing, bit for bit
        assert float((before[i] - alone[i]).abs().max()) <= 2e-6  # and each is the sample scored alone


def test_packed_row_layout_masks_the_gap_between_samples() -> None:
    samples = samples_of((4, 3))
    b = collate_packed(samples)
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    assert b["cu_seqlens"].tolist() == [0, 4, 7] and int(b["max_seqlen"]) == 4
    # sample 0's 3 targets at columns 0-2, column 3 (its last token predicting sample 1's first) is a gap
    assert b["loss_mask"].tolist() == [[0.0, 0.0, 1.0, 0.0, 0.0, 0.0]]
    assert b["segment_ids"].tolist() == [[0, 0, 0, 0, 1, 1]]
    assert token_and_sequence_counts(b) == (1.0, 1.0)  # sample 1 has no loss token (its 2 targets are prompt)
    assert token_and_sequence_counts(collate(samples)) == (1.0, 1.0)


@pytest.mark.parametrize("chunk_tokens", [3, 11])  # several chunks (recomputed in the backward), or one (kept)
@pytest.mark.parametrize("entropy", [False, True])
def test_chunked_logprobs_equal_the_whole_logits_values_and_gradients(entropy: bool, chunk_tokens: int) -> None:
    """fp64: the same log-probs, entropies and gradients as from the whole logits to 1e-9."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(11, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 8, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 13, (11,), generator=g)
    w_lp, w_ent = torch.randn(11, generator=g, dtype=torch.float64), torch.randn(11, generator=g, dtype=torch.float64)
    out = []
    for chunked in (True, False):
        hidden.grad = weight.grad = None
        if chunked:
            lp, ent = chunked_logprobs(hidden, weight, targets, entropy, chunk_bytes=chunk_tokens * 13 * 4)
        else:
            lp, ent = full_logprobs(hidden @ weight.t(), targets, entropy)
        loss = (lp.double() * w_lp).sum() + ((ent.double() * w_ent).sum() if entropy else 0.0)
        loss.backward()
        out.append((lp.detach(), ent, hidden.grad.clone(), weight.grad.clone()))
    (lp_c, ent_c, gh_c, gw_c), (lp_f, ent_f, gh_f, gw_f) = out
    # written out: log p_t = z_t - logsumexp(z); H = -sum p log p
    z = (hidden @ weight.t()).detach()
    logp = z - torch.logsumexp(z, -1, keepdim=True)
    assert float((lp_f.double() - logp.gather(-1, targets[:, None]).squeeze(-1)).abs().max()) < 1e-9
    assert float((lp_c.double() - lp_f.double()).abs().max()) < 1e-9
    if entropy:
        assert float((ent_c.detach().double() - (-(logp.exp() * logp).sum(-1))).abs().max()) < 1e-9
    assert float((gh_c - gh_f).abs().max()) < 1e-9 and float((gw_c - gw_f).abs().max()) < 1e-9


def test_first_fit_decreasing_bins_hold_every_sample_once_within_the_budget() -> None:
    lengths = [50, 7, 33, 20, 90, 5, 41, 12, 64, 3]
    bins = first_fit_decreasing(lengths, 100)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 100 for b in bins)
    assert len(bins) == math.ceil(sum(lengths) / 100)  # 325 tokens: 4 bins, the fewest possible
    assert first_fit_decreasing([150, 10], 100) == [[0], [1]]  # a sample over the budget has a bin of its own
    cfg = BatchConfig(global_batch_size=10, micro_batch_size=1, max_tokens_per_microbatch=100, remove_padding=True)
    mbs = split_microbatches([{"input_ids": [0] * n} for n in lengths], cfg)
    assert [sum(len(s["input_ids"]) for s in mb) for mb in mbs] == [sum(lengths[i] for i in b) for b in bins]


def test_balanced_partition_gives_equal_counts_and_near_equal_workloads() -> None:
    g = torch.Generator().manual_seed(3)
    lengths = [int(math.exp(4.5 + 0.8 * float(torch.randn(1, generator=g)))) for _ in range(32)]
    weights = [workload(n, 896) for n in lengths]
    parts = balanced_partition(weights, 4)
    assert sorted(i for p in parts for i in p) == list(range(32)) and all(len(p) == 8 for p in parts)
    balanced = [sum(weights[i] for i in p) for p in parts]
    contiguous = [sum(weights[8 * r:8 * r + 8]) for r in range(4)]
    assert max(balanced) - min(balanced) <= max(weights)  # LPT: within one item of each other
    assert max(balanced) / min(balanced) < max(contiguous) / min(contiguous)
    rows = list(range(32))
    shares = [shard_for_rank(rows, r, 4, lengths, 896) for r in range(4)]
    assert shares == parts and shard_for_rank(rows, 1, 4) == list(range(8, 16))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_a_step_loss_does_not_depend_on_packing_or_the_token_budget(mode: str) -> None:
    """The same 6 samples as padded rows of 2, packed rows of 2, and packed bins of 40 or 64 tokens: one
    step's loss (an aggregate of O(1) terms) within 1e-6, its gradient norm within 1e-5 of itself."""
    from slurm_rl.engines.actor.groups import GroupCache
    from slurm_rl.engines.actor.optimizer import OptimConfig
    from slurm_rl.engines.actor.trainer import ActorTrainer

    def pg(lp: torch.Tensor, batch: dict) -> torch.Tensor:
        return -batch["advantages"] * torch.exp(lp - lp.detach())

    stats = []
    for cfg in (BatchConfig(6, 2), BatchConfig(6, 2, remove_padding=True),
                BatchConfig(6, 1, max_tokens_per_microbatch=40, remove_padding=True),
                BatchConfig(6, 1, max_tokens_per_microbatch=64, remove_padding=True)):
        trainer = ActorTrainer(MODEL, OptimConfig(lr=1e-3), cfg, [0], GroupCache(), seed=0)
        stats.append(trainer.train_step(samples_of(), pg, LossAggregation(mode)))
    assert len({s["micro_batches"] for s in stats}) > 1  # the budgets cut the step differently
    for s in stats[1:]:
        assert abs(s["loss"] - stats[0]["loss"]) <= 1e-6
        assert s["grad_norm"] == pytest.approx(stats[0]["grad_norm"], rel=1e-5)
        assert s["tokens"] == stats[0]["tokens"]


def test_the_lr_after_n_steps_does_not_depend_on_the_token_budget() -> None:
    """The dynamic-batching symptom (an LR schedule stepped per micro-batch): after 4 steps with budgets that
    cut each step into 2 to 6 micro-batches, the LR and consumed samples are the same in every run."""
    from slurm_rl.engines.actor.groups import GroupCache
    from slurm_rl.engines.actor.optimizer import OptimConfig
    from slurm_rl.engines.actor.trainer import ActorTrainer, nll_loss

    optim = OptimConfig(lr=1e-3, min_lr=1e-4, lr_warmup_samples=6, lr_decay_samples=30)
    runs = {}
    for budget in (None, 32, 80):
        cfg = (BatchConfig(6, 3) if budget is None
               else BatchConfig(6, 1, max_tokens_per_microbatch=budget, remove_padding=True))
        trainer = ActorTrainer(MODEL, optim, cfg, [0], GroupCache(), seed=0)
        runs[budget] = [(s["lr"], s["consumed_samples"], s["micro_batches"])
                        for s in (trainer.train_step(samples_of(seed=k), nll_loss) for k in range(4))]
    micro = {b: [m for _, _, m in r] for b, r in runs.items()}
    assert micro[None] == [2.0] * 4 and micro[32] != micro[80]
    lrs = {b: [(lr, c) for lr, c, _ in r] for b, r in runs.items()}
    assert lrs[32] == lrs[None] and lrs[80] == lrs[None]
    assert [c for _, c in lrs[None]] == [6.0, 12.0, 18.0, 24.0] and len({lr for lr, _ in lrs[None]}) == 4


def test_packed_scorers_give_the_padded_scores() -> None:
    from slurm_rl.engines.inference import ReferenceScorer, ValueScorer

    model = build_gpt_model(MODEL, seed=2)
    seqs = [s["input_ids"] for s in samples_of()]
    padded = ReferenceScorer(MODEL, model.named_parameters()).score(seqs)
    packed = ReferenceScorer(MODEL, model.named_parameters(), packed=True, max_tokens_per_batch=40).score(seqs)
    assert [len(t) for t in packed] == [n - 1 for n in LENGTHS]
    assert max(float((a - b).abs().max()) for a, b in zip(padded, packed)) <= 2e-6
    values = ValueScorer(MODEL, None, packed=True, max_tokens_per_batch=40), ValueScorer(MODEL, None)
    got = [v.score(seqs) for v in values]
    assert max(float((a - b).abs().max()) for a, b in zip(*got)) <= 2e-6
