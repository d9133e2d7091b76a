"""Character-level tokenizer built locally with `tokenizers` (nothing is downloaded).

Every character of the alphabet is one token; four special tokens come first:

    id 0 "<pad>", id 1 "<bos>", id 2 "<eos>", id 3 "<unk>", then the alphabet in order.

Encoding a text prepends ``<bos>`` (``add_special_tokens=True``, the default), so a prompt
"12+34=" becomes ``[<bos>, '1', '2', '+', '3', '4', '=']``. Decoding concatenates the
characters (no spaces inserted) and drops special tokens with ``skip_special_tokens=True``.
Padding is on the left, as the sampler and ``token_logprobs`` expect (prompts share the
column where their responses start). The result is a ``transformers.PreTrainedTokenizerFast``
that round-trips through ``save_pretrained`` / ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)

#: Enough for the arithmetic tasks (addition with scratchpad, countdown): 22 characters.
ARITHMETIC_ALPHABET = "0123456789+-*/=;,:()> "
#: Printable ASCII without the vertical whitespace other than newline (for text tasks).
TEXT_ALPHABET = "".join(ch for ch in string.printable if ch not in "\r\x0b\x0c")


def build_char_tokenizer(alphabet: str | None = None) -> PreTrainedTokenizerFast:
    """Build a character-level ``PreTrainedTokenizerFast``.

    Args:
        alphabet: the characters of the vocabulary, in id order after the 4 special tokens.
            Duplicates are dropped (first occurrence kept). ``None`` means
            ``ARITHMETIC_ALPHABET``. Characters outside it encode as ``<unk>``.

    Returns:
        A tokenizer with ``pad_token``/``bos_token``/``eos_token``/``unk_token`` set,
        ``padding_side="left"`` and ``len(tokenizer) == 4 + len(unique alphabet)``.
    """
    alphabet = ARITHMETIC_ALPHABET if alphabet is None else alphabet
    if not isinstance(alphabet, str) or not alphabet:
        raise ValueError(f"alphabet must be a non-empty string, got {alphabet!r}")
    chars = list(dict.fromkeys(alphabet))  # unique, order kept
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab[ch] = len(vocab)

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every character is its own pre-token ("isolated" keeps it, whitespace included).
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # concatenate, no spaces between characters
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        truncation_side="left",
        clean_up_tokenization_spaces=False,
    )
