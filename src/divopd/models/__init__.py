"""Models: load any Hugging Face causal LM and tokenizer (:func:`load_model`); tiny offline models
(:mod:`~divopd.models.tiny`), packing (:mod:`~divopd.models.packing`) and no-grad scoring
(:mod:`~divopd.models.scoring`) live beside it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from divopd.errors import UsageError, first_line

__all__ = ["DTYPES", "ModelLoadError", "load_model", "load_tokenizer", "resolve_dtype"]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    """``"float32" | "bfloat16" | "float16"`` (also ``fp32``/``bf16``/``fp16``) → torch dtype; clear error otherwise."""
    alias = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
    key = alias.get(name, name)
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)} (or fp32/bf16/fp16)")
    return DTYPES[key]


class ModelLoadError(UsageError, OSError):
    """A model or tokenizer path transformers cannot load (not a model folder; offline and not cached; ...)."""


def _is_plain_fast_tokenizer_folder(path: Path) -> bool:
    cfg = path / "tokenizer_config.json"
    if not (path / "tokenizer.json").is_file() or not cfg.is_file():
        return False
    try:
        data = json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return data.get("tokenizer_class") in ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer of ``name_or_path``; a plain ``PreTrainedTokenizerFast`` folder loads as such (``AutoTokenizer``
    would pick the model type's own class and re-tokenise with different ids)."""
    path = Path(name_or_path)
    try:
        if path.is_dir() and _is_plain_fast_tokenizer_folder(path):
            return PreTrainedTokenizerFast.from_pretrained(str(path))
        return AutoTokenizer.from_pretrained(name_or_path)
    except OSError as exc:
        raise ModelLoadError(f"{name_or_path}: no tokenizer there (or a Hugging Face tokenizer that can be fetched): "
                             f"{first_line(exc)}") from exc


def load_model(name_or_path: str, *, dtype: str = "float32",
               device: str = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Any causal LM ``AutoModelForCausalLM`` reads, in ``dtype`` on ``device`` and in eval mode, with its tokenizer
    (``pad = eos`` when it has no pad token)."""
    torch_dtype = resolve_dtype(dtype)
    if Path(name_or_path).is_dir() and not (Path(name_or_path) / "config.json").is_file():
        raise ModelLoadError(f"{name_or_path} is not a model folder (no config.json)")
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype)
    except (OSError, ValueError) as exc:  # transformers: "... does not appear to have ...", "Unrecognized model ..."
        if isinstance(exc, ValueError) and not str(exc).startswith("Unrecognized model"):
            raise
        raise ModelLoadError(f"{name_or_path} is not a model folder (or a Hugging Face model that can be fetched): "
                             f"{first_line(exc)}") from exc
    model = model.to(device).eval()
    tokenizer = load_tokenizer(name_or_path)
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
