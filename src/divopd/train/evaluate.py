"""Student-only evaluation of a checkpoint (or any HF model folder), behind ``divopd eval CHECKPOINT``, under the
run's ``config.yaml`` (found above the checkpoint) or ``--config``; recovery is always off, as in the paper."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from divopd.errors import InputFileError, UsageError, check_model_folder
from divopd.train.config import load_config


def find_config(checkpoint: Path) -> Path | None:
    found = (p / "config.yaml" for p in [checkpoint, *checkpoint.parents][:4] if (p / "config.yaml").is_file())
    return next(found, None)


def evaluate_checkpoint(checkpoint: str | Path, config: str | Path | None = None, overrides: list[str] | None = None,
                        split: str | None = None, tasks: int | None = None) -> dict[str, float]:
    """Evaluate ``checkpoint`` as the student of ``config``; returns ``eval/*`` metrics."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise InputFileError(f"checkpoint: no checkpoint folder at {checkpoint}")
    adapter = _adapter_handle(checkpoint)  # a LoRA checkpoint: its base model with the adapter
    if adapter is None:
        check_model_folder(checkpoint, "checkpoint", what="a checkpoint or model folder")
    config = Path(config) if config else find_config(checkpoint)
    if config is None:
        raise InputFileError(f"no config.yaml found beside {checkpoint}; pass --config")
    if tasks is not None and tasks < 1:
        raise UsageError(f"--tasks must be at least 1, got {tasks}")
    base = checkpoint if adapter is None else adapter.adapter["base_model_name_or_path"]  # type: ignore[index]
    over = [f"student.path={base}"] + list(overrides or [])
    if split:
        over.append(f"explorer.eval_split={split}")
    cfg = load_config(config, over)
    from divopd.train.assemble import build_explorer  # torch and transformers: only once the input is valid

    explorer = build_explorer(cfg, 0, 0, adapter, None, evaluation=True,
                              policy_version=_checkpoint_version(checkpoint))
    try:
        results = explorer.evaluate(num_tasks=tasks or cfg.eval.tasks, **cfg.eval.sampling(cfg.seed))
    finally:
        explorer.close()
    return {"checkpoint": str(checkpoint), "split": cfg.explorer.eval_split, **results}


def _checkpoint_version(checkpoint: Path) -> int:
    """The learner version a checkpoint holds (its ``state.json``); 0 for a plain model folder (e.g. an SFT model)."""
    from divopd.learn.checkpoint import STATE_FILE, read_state

    if not (checkpoint / STATE_FILE).is_file():
        return 0
    return int(read_state(checkpoint).get("learner", {}).get("version", 0))


def _adapter_handle(checkpoint: Path) -> Any:
    """A LoRA checkpoint as the published handle of its version, else ``None``; one line when its base is gone."""
    from divopd.learn.lora import is_adapter_folder

    if not is_adapter_folder(checkpoint):
        return None
    from divopd.learn.checkpoint import WeightHandle
    from divopd.learn.lora import read_adapter

    state, settings = read_adapter(checkpoint)
    base = settings.get("base_model_name_or_path")
    if not base:
        raise UsageError(f"checkpoint: {checkpoint} is a LoRA adapter that names no base model "
                         "(base_model_name_or_path in adapter_config.json)")
    check_model_folder(base, f"the base model of {checkpoint}")
    return WeightHandle(version=_checkpoint_version(checkpoint), state_dict=state, adapter=settings)
