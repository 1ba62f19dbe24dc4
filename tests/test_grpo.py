"""GRPO math on hand-built batches, plus the built-in character tokenizer."""

from __future__ import annotations

import math

import pytest
import torch

from slurm_rl.rl.grpo import group_advantages, grpo_loss, kl_k3, response_mask
from slurm_rl.rl.tokenizer import CharTokenizer, pad_batch


def test_group_advantages_normalise_per_group() -> None:
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    adv = group_advantages(r, group_size=4)
    assert torch.allclose(adv[:4], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    assert torch.equal(adv[4:], torch.zeros(4))  # equal rewards carry no signal
    centred = group_advantages(r, group_size=4, scale=False)
    assert torch.allclose(centred[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    with pytest.raises(ValueError, match="group_size=3"):
        group_advantages(r, group_size=3)


def test_loss_on_policy_is_minus_mean_advantage() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    parts = grpo_loss(lp.clone().requires_grad_(), lp, adv, mask, global_tokens=3)
    # ratio 1 everywhere: loss = -(2 + 2 - 1) / 3
    assert parts.loss.item() == pytest.approx(-1.0)
    assert parts.tokens.item() == 3 and parts.clipped_tokens.item() == 0
    assert parts.ratio_sum.item() == pytest.approx(3.0)


def test_gradient_is_advantage_times_score() -> None:
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    parts = grpo_loss(lp, lp.detach(), torch.tensor([3.0]), torch.ones(1, 2), global_tokens=4)
    parts.loss.backward()
    # d/dlp of -ratio*A / N at ratio 1 is -A / N
    assert torch.allclose(lp.grad, torch.full((1, 2), -0.75))


def test_clipping_positive_and_negative_advantages() -> None:
    old = torch.zeros(1, 4)
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]])).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])  # per-token advantages
    parts = grpo_loss(lp, old, adv, torch.ones(1, 4), global_tokens=4, clip_eps=0.2)
    # token 0: min(1.5, 1.2) -> clipped 1.2; token 1: min(0.5, 0.8) -> 0.5 (not clipped)
    # token 2: min(-1.5, -1.2) -> -1.5; token 3: min(-0.5, -0.8) -> clipped -0.8
    expected = -(1.2 + 0.5 - 1.5 - 0.8) / 4
    assert parts.loss.item() == pytest.approx(expected, abs=1e-6)
    assert parts.clipped_tokens.item() == 2
    parts.loss.backward()
    assert lp.grad[0, 0] == 0 and lp.grad[0, 3] == 0  # clipped tokens give no gradient
    assert lp.grad[0, 1] != 0 and lp.grad[0, 2] != 0
    asym = grpo_loss(lp.detach(), old, adv, torch.ones(1, 4), 4, clip_eps=0.2, clip_eps_high=0.6)
    assert asym.loss.item() == pytest.approx(-(1.5 + 0.5 - 1.5 - 0.8) / 4, abs=1e-6)


def test_kl_k3_and_its_weight() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.2]]))
    ref = torch.log(torch.tensor([[0.25, 0.2]]))
    kl = kl_k3(lp, ref)
    assert kl[0, 0].item() == pytest.approx(0.5 - math.log(0.5) - 1)
    assert kl[0, 1].item() == 0.0
    parts = grpo_loss(lp, lp, torch.zeros(1), torch.ones(1, 2), global_tokens=2,
                      ref_logprobs=ref, kl_coef=0.1)
    assert parts.loss.item() == pytest.approx(0.1 * kl.sum().item() / 2)
    assert parts.kl_sum.item() == pytest.approx(kl.sum().item())
    no_coef = grpo_loss(lp, lp, torch.zeros(1), torch.ones(1, 2), 2, ref_logprobs=ref)
    assert no_coef.loss.item() == 0.0 and no_coef.kl_sum.item() > 0  # reported, not trained


def test_token_mean_over_global_batch_is_split_invariant() -> None:
    torch.manual_seed(0)
    lp = torch.randn(6, 5)
    old = lp + 0.1 * torch.randn(6, 5)
    ref = lp + 0.1 * torch.randn(6, 5)
    mask = response_mask(torch.tensor([5, 3, 1, 4, 2, 5]), 5)
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.2, 0.9, 0.4, 0.3]), 3)
    n = int(mask.sum())

    def grad(chunks: list[slice]) -> torch.Tensor:
        p = lp.clone().requires_grad_()
        for s in chunks:
            grpo_loss(p[s], old[s], adv[s], mask[s], n, ref_logprobs=ref[s],
                      kl_coef=0.05).loss.backward()
        return p.grad

    whole = grad([slice(0, 6)])
    assert torch.allclose(whole, grad([slice(0, 2), slice(2, 3), slice(3, 6)]), atol=1e-6)


def test_loss_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 3), 1)
    with pytest.raises(ValueError, match="global_tokens"):
        grpo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), 0)


def test_tokenizer_round_trip_and_errors(tmp_path) -> None:
    tok = CharTokenizer()
    ids = tok.encode("12+7=abc", add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == "12+7=abc"
    assert tok.decode([5, tok.eos_id, 6]) == tok.decode([5])
    assert tok.decode([tok.vocab_size + 3, 5]) == tok.decode([5])  # padded vocab ids
    with pytest.raises(ValueError, match="'#'"):
        tok.encode("1#2")
    assert pad_batch([[1, 2], [3]], 0, left=True) == ([[1, 2], [0, 3]], [[1, 1], [0, 1]])
    tok.save_hf(tmp_path)
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert hf.encode("3+4=", add_special_tokens=False) == tok.encode("3+4=", add_bos=False)


def test_character_tokenizer_as_hf_and_stop_strings() -> None:
    from slurm_rl.rl.tokenizer import cut_at_stop_strings, load_tokenizer

    tok = CharTokenizer()
    hf = load_tokenizer(None, None)  # a random model without tokenizer files gets this one
    assert hf("3+4=")["input_ids"] == tok.encode("3+4=", add_bos=True)
    assert (hf.eos_token_id, hf.pad_token_id, hf.bos_token_id) == (tok.eos_id, tok.pad_id, tok.bos_id)
    ids = tok.encode("12 ab", add_bos=False) + [tok.eos_id]
    assert cut_at_stop_strings(ids, hf, [" "]) == 3  # "12 " completes the stop string
    assert cut_at_stop_strings(ids, hf, ["b"]) == 5
    assert cut_at_stop_strings(ids, hf, ["zz"]) == len(ids)


def test_place_responses_matches_next_token_layout() -> None:
    from slurm_rl.rl.grpo import place_responses

    vals, mask = place_responses([3, 2], [[-1.0, -2.0], [-3.0]], width=4)
    assert vals.tolist() == [[0, 0, -1, -2], [0, -3, 0, 0]]
    assert mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    with pytest.raises(ValueError, match="row 0"):
        place_responses([4], [[1.0, 2.0]], width=4)
