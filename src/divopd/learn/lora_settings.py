"""``student.lora``'s schema (:class:`LoraSettings`), apart from :mod:`divopd.learn.lora` so that the config schema
loads without torch (a bad flag is answered before torch is imported)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["LoraSettings"]


class LoraSettings(BaseModel):
    """``student.lora``: low-rank adapters on the student (PEFT's LoRA); ``rank: 0`` = full fine-tuning."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(0, ge=0, description="LoRA rank r; 0 = full fine-tuning (every parameter trains).")
    alpha: float | None = Field(None, gt=0, description="LoRA α (the update is scaled by α/r); unset = 2·rank.")
    dropout: float = Field(0.0, description="LoRA dropout; only 0.0: the learner runs the student in eval mode (its "
                           "gradient pass is θ_old's pass), so dropout would never apply.")
    target_modules: str | list[str] = Field(
        "all-linear", description="Module names the adapters wrap (the last part of a name, e.g. [q_proj, v_proj]), "
        "or all-linear (every linear layer but the output head).")

    @field_validator("dropout")
    @classmethod
    def _dropout(cls, v: float) -> float:
        if v != 0.0:
            raise ValueError(f"only 0.0 is supported, got {v}: the learner runs the student in eval mode so that its "
                             "gradient pass is also θ_old's pass, and LoRA dropout would never apply")
        return v

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, str) and v != "all-linear":
            raise ValueError(f"a list of module names or all-linear, got {v!r}")
        if isinstance(v, list) and (not v or not all(isinstance(x, str) and x for x in v)):
            raise ValueError("a non-empty list of module names (e.g. [q_proj, v_proj]) or all-linear")
        return v

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def lora_alpha(self) -> float:
        """α: the configured one, else 2·rank."""
        return float(self.alpha) if self.alpha is not None else 2.0 * self.rank
