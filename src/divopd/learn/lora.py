"""LoRA students (``student.lora.rank > 0``): PEFT adapters injected in place on a frozen base, published as the
adapter's tensors, saved as PEFT adapter folders (PEFT and vLLM read them as they are) and exported merged. PEFT (the
``divopd[lora]`` extra) is imported only when a LoRA student is configured or read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from divopd.errors import UsageError
from divopd.learn.lora_settings import LoraSettings

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "LoraError", "LoraSettings", "adapter_settings", "add_adapter",
           "apply_adapter", "check_lora", "handle_adapter", "has_adapter", "is_adapter_folder", "load_adapter_model",
           "load_student", "merge_adapter", "merged_model", "published_weights", "read_adapter", "save_weights",
           "write_adapter"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: The prefix PEFT's saved adapters put before a module's name (a ``PeftModel`` wraps ``LoraModel`` wraps the model).
SAVED_PREFIX = "base_model.model."
PEFT_FIX = "install the LoRA extra: pip install 'divopd[lora]' (PEFT)"


class LoraError(UsageError, ValueError):
    """A LoRA setting or model this student cannot use (one line, exit 2)."""


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise LoraError(f"student.lora.rank > 0 needs PEFT, which is not installed; {PEFT_FIX}") from None
    return peft


def _linear_names(model: torch.nn.Module) -> list[str]:
    """The last name part of every linear layer (``nn.Linear``, GPT-2's ``Conv1D``) of ``model``."""
    from transformers.pytorch_utils import Conv1D

    return sorted({name.rsplit(".", 1)[-1] for name, mod in model.named_modules()
                   if isinstance(mod, (torch.nn.Linear, Conv1D))})


def _target_names(model: torch.nn.Module, settings: LoraSettings, where: str) -> list[str]:
    """``target_modules`` checked against ``model``'s linear layers (``all-linear``: all but the output head)."""
    found = _linear_names(model)
    head = getattr(model, "get_output_embeddings", lambda: None)()
    head_names = {name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if mod is head and head is not None}
    if settings.target_modules == "all-linear":
        names = [n for n in found if n not in head_names]
        if not names:
            raise LoraError(f"student.lora: {where} ({type(model).__name__}) has no linear layers besides the output "
                            f"head for all-linear to wrap (linear modules: {', '.join(found) or 'none'})")
        return names
    unknown = [n for n in settings.target_modules if n not in found]
    if unknown:
        raise LoraError(f"student.lora.target_modules: {', '.join(unknown)} not in {where} "
                        f"({type(model).__name__}); its linear modules: {', '.join(found) or 'none'}")
    return list(settings.target_modules)


def _lora_config(r: int, alpha: float, targets: list[str], base: str | None = None) -> Any:
    peft = _peft()
    return peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets), bias="none",
                           task_type="CAUSAL_LM", base_model_name_or_path=base)


def _settings_config(settings: Mapping[str, Any]) -> Any:
    """The PEFT config of published adapter ``settings`` (:func:`adapter_settings`)."""
    return _lora_config(int(settings["r"]), float(settings["lora_alpha"]), list(settings["target_modules"]),
                        settings.get("base_model_name_or_path"))


def add_adapter(model: torch.nn.Module, settings: LoraSettings, *, base: str, seed: int = 0) -> torch.nn.Module:
    """Inject fresh LoRA adapters (seeded by ``seed``; ``lora_B`` = 0, so the student starts as the base) into
    ``model`` in place and freeze everything else; ``base``: the base model folder the checkpoints name."""
    targets = _target_names(model, settings, str(base))
    folder = Path(base).expanduser()
    config = _lora_config(settings.rank, settings.lora_alpha, targets,
                          str(folder.resolve()) if folder.exists() else str(base))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        _inject(model, config, str(base))
    return model


def _inject(model: torch.nn.Module, config: Any, where: str) -> None:
    peft = _peft()
    targets = _short(config.target_modules)
    try:
        peft.inject_adapter_in_model(config, model)
    except (ValueError, TypeError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LoraError(f"student.lora: PEFT cannot wrap {where} ({type(model).__name__}): {first}; its linear "
                        f"modules: {', '.join(_linear_names(model)) or 'none'}") from None
    model._divopd_lora = {"r": int(config.r), "lora_alpha": float(config.lora_alpha),  # type: ignore[assignment]
                          "target_modules": targets,
                          "base_model_name_or_path": config.base_model_name_or_path}


def _short(names: Any) -> list[str]:
    return sorted({str(n).rsplit(".", 1)[-1] for n in names})


def has_adapter(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds divopd's LoRA adapters."""
    return getattr(model, "_divopd_lora", None) is not None


def adapter_settings(model: torch.nn.Module) -> dict[str, Any] | None:
    """A model's adapter settings (``r``, ``lora_alpha``, ``target_modules``, base model) or ``None``."""
    info = getattr(model, "_divopd_lora", None)
    return None if info is None else dict(info)


def published_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What the learner publishes: a CPU copy of a LoRA student's adapter tensors, else of the whole ``state_dict``."""
    if has_adapter(model):
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(model)
    else:
        state = model.state_dict()
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def save_weights(model: torch.nn.Module, folder: str | os.PathLike) -> None:
    """Write the student's weights into ``folder``: a LoRA student's adapter folder, else ``save_pretrained``."""
    if not has_adapter(model):
        model.save_pretrained(folder, safe_serialization=True)
        return
    write_adapter(folder, published_weights(model), adapter_settings(model) or {})


def write_adapter(folder: str | os.PathLike, state: Mapping[str, torch.Tensor], settings: Mapping[str, Any]) -> None:
    """An adapter folder PEFT and vLLM load: the tensors under PEFT's saved names and its ``adapter_config.json``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {SAVED_PREFIX + k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    save_file(tensors, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = _settings_config(settings)
    config.inference_mode = True
    config.save_pretrained(str(folder))


def is_adapter_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a PEFT adapter folder (``adapter_config.json``, no ``config.json`` of a whole model)."""
    p = Path(path)
    return (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


def read_adapter(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An adapter folder's tensors (names without the saved prefix) and settings; :class:`LoraError` in one line when
    it is not a LoRA adapter divopd can load."""
    from safetensors.torch import load_file

    folder = Path(path)
    try:
        data = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LoraError(f"{path}: not a readable PEFT adapter folder ({ADAPTER_CONFIG}: {exc})") from None
    if str(data.get("peft_type", "LORA")).upper() != "LORA" or not (folder / ADAPTER_WEIGHTS).is_file():
        raise LoraError(f"{path}: not a LoRA adapter with {ADAPTER_WEIGHTS} (peft_type {data.get('peft_type')!r})")
    targets = data.get("target_modules") or []
    settings = {"r": int(data["r"]), "lora_alpha": float(data.get("lora_alpha") or 2 * int(data["r"])),
                "target_modules": [targets] if isinstance(targets, str) else _short(targets),
                "base_model_name_or_path": data.get("base_model_name_or_path")}
    state = {k.removeprefix(SAVED_PREFIX): v for k, v in load_file(str(folder / ADAPTER_WEIGHTS)).items()}
    return state, settings


def apply_adapter(model: torch.nn.Module, state: Mapping[str, torch.Tensor], settings: Mapping[str, Any]
                  ) -> torch.nn.Module:
    """Load a published adapter version into ``model`` in place (injecting the adapter on first use), in the model's
    dtype; :class:`ValueError` when the tensors do not fit."""
    if not has_adapter(model):
        _inject(model, _settings_config(settings), str(settings.get("base_model_name_or_path") or type(model).__name__))
        model.eval()
    own = getattr(model, "_divopd_lora_tensors", None)
    if own is None:  # the adapter's tensors under their published names, found once
        own = {k.replace(".default.", "."): p for k, p in model.named_parameters() if ".lora_" in k}
        model._divopd_lora_tensors = own  # type: ignore[assignment]
    if own.keys() != state.keys():
        missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        raise ValueError(f"adapter weights do not fit the student's adapter (missing {missing[:3]}, unexpected "
                         f"{extra[:3]})")
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(state[name])
    return model


def load_adapter_model(path: str | os.PathLike, *, dtype: str = "float32", device: str = "cpu",
                       base: str | None = None) -> tuple[torch.nn.Module, Any]:
    """The base model (``base``, default the one the adapter names) with the adapter folder at ``path`` loaded, and
    the tokenizer saved beside the adapter, else the base's; only the adapter's parameters require gradients."""
    from divopd.models import load_model, load_tokenizer

    state, settings = read_adapter(path)
    base = base or settings.get("base_model_name_or_path")
    if not base:
        raise LoraError(f"{path}: the adapter names no base model (base_model_name_or_path in {ADAPTER_CONFIG})")
    from divopd.errors import check_model_folder

    check_model_folder(base, f"the base model of the adapter {path}")
    model, tokenizer = load_model(str(base), dtype=dtype, device=device)
    apply_adapter(model, state, settings)
    if (Path(path) / "tokenizer_config.json").is_file():
        tokenizer = load_tokenizer(str(path))
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
            tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def load_student(source: str, *, dtype: str = "float32", device: str = "cpu", lora: LoraSettings | None = None,
                 seed: int = 0) -> tuple[torch.nn.Module, Any]:
    """A learner's student and tokenizer: an adapter folder's base with that adapter, else the HF model at ``source``
    with fresh adapters (seeded) when ``lora`` is enabled; every rank and the driver's copy start equal."""
    if is_adapter_folder(source):
        return load_adapter_model(source, dtype=dtype, device=device)
    from divopd.models import load_model

    model, tokenizer = load_model(source, dtype=dtype, device=device)
    if lora is not None and lora.enabled:
        add_adapter(model, lora, base=source, seed=seed)
    return model, tokenizer


def merged_model(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its adapters merged into the base weights and removed (a plain HF model, in place)."""
    if not has_adapter(model):
        return model
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):  # merged, then replaced by its base layer
            module.merge()
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.get_base_layer())
    del model._divopd_lora
    model.__dict__.pop("_divopd_lora_tensors", None)
    if hasattr(model, "peft_config"):
        del model.peft_config
    return model


def handle_adapter(handle: Any) -> dict[str, torch.Tensor]:
    """The adapter tensors of a published LoRA handle (its ``state_dict``, or the adapter folder at its ``path``)."""
    state = getattr(handle, "state_dict", None)
    return state if state is not None else read_adapter(str(handle.path))[0]


def merge_adapter(base: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor], settings: Mapping[str, Any]
                  ) -> dict[str, torch.Tensor]:
    """The base model's tensors (``base``: name → tensor, HF names) with the adapter merged in: every wrapped linear
    layer's ``W + (α / r) · B · A``; the other tensors as they are (not copied)."""
    scale = float(settings["lora_alpha"]) / int(settings["r"])
    merged = dict(base)
    for key, a in state.items():
        if ".lora_A." not in key:
            continue
        module = key.split(".lora_A.")[0]
        b = state[key.replace(".lora_A.", ".lora_B.")]
        name = f"{module}.weight"
        if name not in base:
            raise ValueError(f"adapter module {module} has no {name} in the base model's weights")
        w = base[name]
        merged[name] = (w.float() + scale * (b.float() @ a.float())).to(w.dtype)
    return merged


def check_lora(path: str, settings: LoraSettings) -> str:
    """A line for ``divopd doctor`` if ``settings`` can wrap the student at ``path`` (meta device); else LoraError."""
    _peft()
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError) as exc:
        raise LoraError(f"student.lora: {path} cannot be built as a causal LM to place adapters ({exc})") from None
    targets = _target_names(model, settings, path)
    config = _lora_config(settings.rank, settings.lora_alpha, targets, path)
    with torch.device("meta"):
        _inject(model, config, path)
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return (f"rank {settings.rank}, alpha {settings.lora_alpha:g} on {', '.join(targets)}: {n:,} trainable of "
            f"{total:,} parameters ({100 * n / max(total, 1):.2f}%)")
