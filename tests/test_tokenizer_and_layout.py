"""The built-in character tokenizer and the next-token layout of per-response values."""

from __future__ import annotations

import pytest

from slurm_rl.rl.tokenizer import CharTokenizer, pad_batch


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
    import torch

    from slurm_rl.rl.losses import place_responses, response_mask

    vals, mask = place_responses([3, 2], [[-1.0, -2.0], [-3.0]], width=4)
    assert vals.tolist() == [[0, 0, -1, -2], [0, -3, 0, 0]]
    assert mask.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]
    with pytest.raises(ValueError, match="row 0"):
        place_responses([4], [[1.0, 2.0]], width=4)
    assert response_mask(torch.tensor([2, 0]), 3).tolist() == [[1, 1, 0], [0, 0, 0]]
