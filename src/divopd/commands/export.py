"""``divopd export CHECKPOINT --out DIR [--merged]``: a checkpoint's student as a Hugging Face folder, without the
training state: a LoRA checkpoint's adapter in PEFT's format (``--merged``: the base with the adapter merged in), a full
fine-tuning checkpoint's model folder (docs/guides/training.md)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from divopd.errors import InputFileError, UsageError, check_model_folder

__all__ = ["add_arguments", "export_checkpoint", "run"]

#: Files of a checkpoint that are training state, not the student.
TRAINING_STATE = ("optimizer.pt", "state.json", "manifest.json", "dcp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="checkpoint folder, e.g. RUN/checkpoints/update-000100")
    parser.add_argument("--out", required=True, help="new folder to write (must not exist, or be empty)")
    parser.add_argument("--merged", action="store_true",
                        help="LoRA: merge the adapter into its base weights (a plain model folder)")


def run(args: argparse.Namespace) -> int:
    out = export_checkpoint(args.checkpoint, args.out, merged=args.merged)
    print(f"exported {args.checkpoint} to {out}")
    return 0


def export_checkpoint(checkpoint: str | Path, out: str | Path, *, merged: bool = False) -> Path:
    """Write the student of ``checkpoint`` to ``out`` (an HF folder; see the module); returns ``out``."""
    from divopd.learn.checkpoint import atomic_dir
    from divopd.learn.lora import is_adapter_folder

    src, dst = Path(checkpoint), Path(out)
    if not src.is_dir():
        raise InputFileError(f"checkpoint: no checkpoint folder at {src}")
    adapter = is_adapter_folder(src)
    if not adapter:
        check_model_folder(src, "checkpoint", what="a checkpoint or model folder")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise UsageError(f"--out: {dst} already exists and is not an empty folder; name a new folder")
    if dst.exists():
        dst.rmdir()  # empty: atomic_dir renames the finished folder into its place
    with atomic_dir(dst) as tmp:
        if adapter and merged:
            _write_merged(src, tmp)
        else:
            for f in src.iterdir():
                if f.name in TRAINING_STATE or f.name.startswith("."):
                    continue
                if f.is_dir():
                    shutil.copytree(f, tmp / f.name)
                else:
                    shutil.copy2(f, tmp / f.name)
    return dst


def _write_merged(adapter: Path, out: Path) -> None:
    from divopd.learn.lora import load_adapter_model, merged_model

    model, tokenizer = load_adapter_model(adapter)
    merged_model(model).save_pretrained(out, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
