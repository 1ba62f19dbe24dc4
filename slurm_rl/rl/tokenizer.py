"""Tokenizers of a run: the model's own (``AutoTokenizer``), or the built-in character tokenizer.

:func:`load_tokenizer` gives the tokenizer of ``model.tokenizer_path`` / ``model.path``, or, for a
random model without one, :class:`CharTokenizer` as a ``transformers`` fast tokenizer; every
caller then sees one interface (ids, chat template, EOS / pad ids).

Character-level tokenizer built in the project (no hub download):

Ids 0..2 are the special tokens ``<pad>``, ``<bos>``, ``<eos>``; then digits, operators, space
and lower-case letters, one id per character. Models may use a larger (padded) vocabulary; ids
outside this tokenizer decode to ``""``.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any, Iterable, Sequence

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS)
CHARS: str = string.digits + "+-*=" + " " + string.ascii_lowercase


class CharTokenizer:
    """Maps single characters to ids and back."""

    def __init__(self, chars: str = CHARS) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError(f"tokenizer chars: duplicates in {chars!r}")
        self.tokens: tuple[str, ...] = SPECIALS + tuple(chars)
        self._ids: dict[str, int] = {t: i for i, t in enumerate(self.tokens)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2

    @property
    def vocab_size(self) -> int:
        """Number of ids this tokenizer produces."""
        return len(self.tokens)

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = False) -> list[int]:
        """Encode ``text`` one character per id; unknown characters are an error naming them."""
        try:
            ids = [self._ids[c] for c in text]
        except KeyError as err:
            raise ValueError(f"tokenizer: character {err.args[0]!r} of {text!r} is not in the "
                             f"vocabulary {''.join(self.tokens[len(SPECIALS):])!r}") from None
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True) -> str:
        """Decode ids to text, dropping special and out-of-vocabulary ids."""
        out: list[str] = []
        for i in ids:
            if i == self.eos_id and stop_at_eos:
                break
            if len(SPECIALS) <= i < len(self.tokens):
                out.append(self.tokens[i])
        return "".join(out)

    def to_tokenizers(self) -> Any:
        """This vocabulary as a ``tokenizers.Tokenizer`` (one id per character, ``<bos>`` first)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

        vocab = {t: i for i, t in enumerate(self.tokens)}
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
        tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
        tok.decoder = decoders.Fuse()
        tok.add_special_tokens(list(SPECIALS))
        tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, self.bos_id)])
        return tok

    def to_hf(self) -> Any:
        """This vocabulary as a ``transformers.PreTrainedTokenizerFast`` (no chat template)."""
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=self.to_tokenizers(), pad_token=PAD, bos_token=BOS,
                                       eos_token=EOS, unk_token=PAD, model_max_length=1 << 20)

    def save_hf(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` + config files so HF / vLLM can load this vocabulary."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.to_tokenizers().save(str(directory / "tokenizer.json"))
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": PAD, "bos_token": BOS,
               "eos_token": EOS, "unk_token": PAD, "model_max_length": 1 << 20}
        (directory / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
        special = {"pad_token": PAD, "bos_token": BOS, "eos_token": EOS, "unk_token": PAD}
        (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=1))


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, left: bool = False
              ) -> tuple[list[list[int]], list[list[int]]]:
    """Pad sequences to a common length; returns (ids, attention mask)."""
    n = max((len(s) for s in seqs), default=0)
    ids, mask = [], []
    for s in seqs:
        fill = [pad_id] * (n - len(s))
        ones, zeros = [1] * len(s), [0] * (n - len(s))
        ids.append(fill + list(s) if left else list(s) + fill)
        mask.append(zeros + ones if left else ones + zeros)
    return ids, mask


def load_tokenizer(model_path: str | None, tokenizer_path: str | None) -> Any:
    """The run's tokenizer: ``AutoTokenizer`` of ``tokenizer_path`` (default ``model_path``), or the
    built-in character tokenizer when neither is given. A tokenizer without a pad token pads with EOS."""
    source = tokenizer_path or model_path
    if source is None:
        return CharTokenizer().to_hf()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    return tok


def stop_token_ids(tok: Any, model_path: str | None) -> tuple[int, ...]:
    """Token ids that end a response: the tokenizer's EOS and the model's
    ``generation_config.json`` ``eos_token_id`` (one id or a list, as Qwen's instruct models have)."""
    ids = {int(tok.eos_token_id)} if tok.eos_token_id is not None else set()
    if model_path is not None:
        gen = Path(model_path) / "generation_config.json"
        if gen.exists():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids.update(int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None)
    return tuple(sorted(ids))


def cut_at_stop_strings(ids: Sequence[int], tok: Any, stops: Sequence[str]) -> int:
    """How many of ``ids`` to keep: up to the token that completes the first of ``stops`` in the
    decoded text (all of them when none occurs). The stop string stays in the response."""
    if not stops or not any(s in tok.decode(ids, skip_special_tokens=True) for s in stops):
        return len(ids)
    lo, hi = 1, len(ids)  # the shortest prefix whose text holds a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tok.decode(ids[:mid], skip_special_tokens=True) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo
