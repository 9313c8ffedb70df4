"""Tokenizers of the families real models use, trained offline in well under a second on the tiny environment's text
with the ``tokenizers`` library (no package here ships a SentencePiece model file: the ``sentencepiece`` wheel holds
normalization tables only), each wrapped as a ``PreTrainedTokenizerFast`` with the tiny models' special tokens and chat
template. Shared by tests/test_teacher_families.py and benchmarks/teacher_families.py.

* ``sentencepiece``: the layout of Llama-2's and Mistral's ``tokenizer.json`` (a SentencePiece BPE converted by
  transformers): BPE with byte fallback, a normalizer that prepends the dummy prefix ``▁`` and turns spaces into
  ``▁``, a decoder that undoes both (``Strip`` of the first space);
* ``metaspace``: a SentencePiece Unigram with the ``Metaspace`` pre-tokenizer and decoder (prefix ``always``: T5,
  ALBERT, the ``tokenizers`` library's own SentencePiece implementations);
* ``word``: a word-level vocabulary split on whitespace and punctuation, without a decoder (decoding joins the words
  with spaces, as BERT-era word-level tokenizers do);
* ``bpe``: byte-level BPE (GPT-2, Qwen, SmolLM2): :func:`divopd.models.tiny.build_tokenizer`.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from divopd.models.tiny import CHAT_TEMPLATE, EOS, PAD, ROLES, SPECIAL_TOKENS, UNK, build_tokenizer

__all__ = ["DUMMY_PREFIX", "FAMILIES", "build_family"]

FAMILIES = ("sentencepiece", "metaspace", "word", "bpe")
#: the families that start every encoded text with a word boundary (a dummy prefix, or a space-joining decoder)
DUMMY_PREFIX = {"sentencepiece": True, "metaspace": True, "word": True, "bpe": False}


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   additional_special_tokens=[f"<|{r}|>" for r in ROLES],
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "right"
    return fast


def build_family(family: str, texts: list[str], vocab_size: int = 600) -> PreTrainedTokenizerFast:
    """A tokenizer of ``family`` (one of :data:`FAMILIES`) trained on ``texts``."""
    if family == "bpe":
        return build_tokenizer(texts, kind="bpe", vocab_size=vocab_size)
    if family == "sentencepiece":
        byte_pieces = [f"<0x{i:02X}>" for i in range(256)]
        tok = Tokenizer(models.BPE(unk_token=UNK, byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")  # training only
        tok.train_from_iterator(texts, trainer=trainers.BpeTrainer(
            vocab_size=vocab_size + 256, special_tokens=SPECIAL_TOKENS + byte_pieces, show_progress=False))
        tok.pre_tokenizer = None  # as in Llama-2's tokenizer.json: the normalizer alone marks the words
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        return _wrap(tok)
    if family == "metaspace":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        tok.train_from_iterator(texts, trainer=trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, unk_token=UNK, show_progress=False))
        return _wrap(tok)
    if family == "word":
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(texts, trainer=trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS,
                                                                         show_progress=False))
        return _wrap(tok)
    raise ValueError(f"build_family: unknown family {family!r}; expected one of {FAMILIES}")
