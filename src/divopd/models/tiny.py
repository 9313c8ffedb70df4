"""Tiny offline models for CPU runs and tests: a tokenizer trained on an environment's text and a Llama/Qwen2 causal LM
built from a config alone. Chat format: every message is ``<|role|>`` + content + ``<eos>``; the generation prompt is
``<|assistant|>``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

__all__ = ["CHAT_TEMPLATE", "ROLES", "SIZES", "SPECIAL_TOKENS", "TOKENIZER_KINDS", "build_model", "build_tokenizer"]

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
ROLES: tuple[str, ...] = ("system", "user", "assistant")
SPECIAL_TOKENS: list[str] = [PAD, EOS, UNK] + [f"<|{r}|>" for r in ROLES]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('tiny chat template: unknown role ' + message['role']) }}{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# name -> (hidden, layers, heads, intermediate); parameter counts with a ~1k vocabulary, tied embeddings. "0.5m" has
# head_dim 64 (hidden / heads), the smallest head vLLM's CPU attention kernel accepts (the others have 16 or 32).
SIZES: dict[str, tuple[int, int, int, int]] = {
    "0.2m": (64, 2, 4, 256),
    "0.5m": (128, 2, 2, 256),
    "1m": (128, 4, 4, 512),
    "5m": (256, 5, 8, 1024),
    "20m": (512, 5, 8, 2048),
}


#: build_tokenizer's kinds: the two byte-level ones the tiny models use, and three more tokenizer families of real
#: models (for cross-tokenizer teachers: docs/concepts/teacher-vocabularies.md).
TOKENIZER_KINDS: tuple[str, ...] = ("word", "bpe", "sentencepiece", "metaspace", "whitespace")


def build_tokenizer(texts: Iterable[str], kind: str = "word", vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    """Train a tokenizer of ``kind`` on ``texts``, with :data:`SPECIAL_TOKENS` and :data:`CHAT_TEMPLATE`: ``word`` /
    ``bpe`` (the tiny models': byte-level, ``decode(encode(text)) == text`` for known words / every text),
    ``sentencepiece`` (Llama-2's layout: byte fallback, ``▁`` prefix; ``vocab_size`` + 256 byte pieces), ``metaspace``
    (a T5-style Unigram) or ``whitespace`` (BERT-era word-level, no decoder)."""
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"build_tokenizer: kind must be one of {', '.join(TOKENIZER_KINDS)}, got {kind!r}")
    texts = list(texts)
    if not texts:
        raise ValueError("build_tokenizer: no texts given")
    if kind in ("word", "bpe"):
        tok = _byte_level(texts, kind, vocab_size)
    elif kind == "sentencepiece":
        tok = Tokenizer(models.BPE(unk_token=UNK, byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")  # training only
        byte_pieces = [f"<0x{i:02X}>" for i in range(256)]
        tok.train_from_iterator(texts, trainer=trainers.BpeTrainer(
            vocab_size=vocab_size + 256, special_tokens=SPECIAL_TOKENS + byte_pieces, show_progress=False))
        tok.pre_tokenizer = None  # as in Llama-2's tokenizer.json: the normalizer alone marks the words
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    elif kind == "metaspace":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        tok.train_from_iterator(texts, trainer=trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, unk_token=UNK, show_progress=False))
    else:
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.train_from_iterator(texts, trainer=trainers.WordLevelTrainer(
            vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
        additional_special_tokens=[f"<|{r}|>" for r in ROLES], clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "right"
    return fast


def _byte_level(texts: list[str], kind: str, vocab_size: int) -> Tokenizer:
    if kind == "word":
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    else:
        tok = Tokenizer(models.BPE(unk_token=None))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        )
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def build_model(tokenizer: PreTrainedTokenizerFast, size: str = "1m", arch: str = "llama", seed: int = 0,
                max_position_embeddings: int = 4096) -> PreTrainedModel:
    """A seeded random causal LM (float32, eval): ``arch`` ``llama`` or ``qwen2``, ``size`` one of :data:`SIZES`."""
    if size not in SIZES:
        raise ValueError(f"build_model: unknown size {size!r}; expected one of {sorted(SIZES)}")
    hidden, layers, heads, inter = SIZES[size]
    common = dict(
        vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, intermediate_size=inter, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, attention_dropout=0.0,
    )
    archs = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if arch not in archs:
        raise ValueError(f"build_model: arch must be 'llama' or 'qwen2', got {arch!r}")
    config_cls, cls = archs[arch]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config_cls(**common))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model.eval()
