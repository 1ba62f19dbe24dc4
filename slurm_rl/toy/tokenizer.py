"""A character-level Hugging Face tokenizer trained with the ``tokenizers`` library.

The model is BPE, but the pre-tokenizer isolates every character, so no merge can form and every
character is one token: ids 0, 1, 2 are ``<pad>``, ``<bos>``, ``<eos>``, then the characters of the
alphabet (and of the training texts) in sorted order of their byte-level symbols. The post-processor
puts ``<bos>`` in front of every encoded text; the decoder joins the characters back. The result is
saved with ``PreTrainedTokenizerFast.save_pretrained`` (``tokenizer.json``,
``tokenizer_config.json``, ...) and loads with ``AutoTokenizer.from_pretrained``, in HF and vLLM.

Tokens are byte-level symbols, as in GPT-2 / Llama-3 / Qwen vocabularies (``"Ġ"`` is a space,
``"Ċ"`` a newline): transformers 5 loads the tokenizer of a ``qwen2`` checkpoint as
``Qwen2Tokenizer`` whatever ``tokenizer_config.json`` says, rebuilding the pipeline from the vocabulary
with Qwen2's byte-level pre-tokenizer and decoder; with byte-level symbols and no merges that
pipeline gives the same ids and texts as this one.

Characters outside the vocabulary are dropped on encode (a BPE model without an unknown token);
``unk_token`` is named ``<pad>`` all the same, else ``Qwen2Tokenizer`` adds its own
``<|endoftext|>`` as a 4th special token.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["ALPHABET", "BOS", "CHAT_TEMPLATE", "EOS", "PAD", "SPECIALS", "train_tokenizer"]

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS)  # ids 0, 1, 2
# digits and operators of the arithmetic tasks, '#' of the GSM8K answer marker ("#### 7"), letters of
# the string tasks, and ':' / newline of the chat template's turn markers
ALPHABET: str = string.digits + "+-*=# " + string.ascii_lowercase + ":\n"

# One line per turn, "role: content", an assistant turn ends with <eos>; the generation prompt is
# "assistant: ". Rendered text starts with <bos> (chat prompts are tokenized without special tokens).
CHAT_TEMPLATE: str = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def train_tokenizer(directory: str | Path, texts: Iterable[str] | None = None, *,
                    alphabet: str = ALPHABET, chat_template: str | None = None,
                    ) -> PreTrainedTokenizerFast:
    """Train a character-level tokenizer on ``texts`` (plus ``alphabet``), save it to ``directory``
    with ``save_pretrained`` and return it. ``<pad>``/``<bos>``/``<eos>`` are ids 0/1/2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    symbols = set(byte_level.pre_tokenize_str(alphabet)[0][0]) if alphabet else set()
    tok = Tokenizer(models.BPE())
    # one pre-token per character, in byte-level symbols (a space is "Ġ")
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("", behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1 << 16, special_tokens=list(SPECIALS),
                                  initial_alphabet=sorted(symbols), show_progress=False)
    tok.train_from_iterator(list(texts or ()), trainer=trainer)
    if [tok.token_to_id(t) for t in SPECIALS] != [0, 1, 2]:  # the trainer puts them first
        raise RuntimeError(f"special tokens got ids {[tok.token_to_id(t) for t in SPECIALS]}")
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=PAD,
        chat_template=chat_template, clean_up_tokenization_spaces=False, model_max_length=1 << 20)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(directory)
    # transformers 5 writes its own class name "TokenizersBackend", which transformers 4 (and tools
    # pinned to it) cannot resolve; "PreTrainedTokenizerFast" loads in both
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return fast
