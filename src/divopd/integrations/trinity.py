"""DivOPD inside Trinity-RFT: a sample strategy registered as ``divopd`` (``algorithm.sample_strategy: divopd``).

Trinity-RFT's trainer asks its sample strategy for one batch per step (``await strategy.sample(step)``). Its default
strategy hands over the next ``train_batch_size`` experiences of the experience buffer in arrival order, which is the
paper's arrival-order reader (``vanilla``). This strategy reads the same buffer with Trinity's own reader and lets a
divopd rule compose the batch: each :class:`~trinity.common.experience.Experience` (one per student turn) becomes a
:class:`divopd.Turn`, divopd's own :class:`~divopd.sampling.Sampler` keeps the queue, the pending pool and the ledger
across steps, and the experiences of the selected turns go back to the trainer in composition order.

Step ``s`` (the trainer's ``train_step_num + 1``) is composed for learner version ``s − 1``, the model version the
explorer tags experiences with once the weights of ``s − 1`` updates are synced (``info["model_version"]``):

1. top up: read what the buffer holds now, without waiting, until the sampler has enough non-stale turns to fill
   its candidate pool (c·B for pooled rules, B for ``vanilla``) or the buffer is empty (what is left stays in
   Trinity's buffer, so the experiences held here never exceed the pool);
2. compose with :meth:`Sampler.next_batch`; too few valid turns: wait for the next experience (up to the buffer's
   ``max_read_timeout``), top up and compose again;
3. return the B experiences, divopd's metrics (``sampler/...``, ``ledger/...``) in Trinity's metrics dict, and
   Trinity's representative samples.

Records: ``eid.rid`` (batch/task/run) is the rollout, ``eid.step`` the turn index, ``info["model_version"]`` the
policy version, ``tokens[prompt_length:]`` the response with ``action_mask``, ``logprobs`` and ``teacher_logprobs``.
A record without a rollout id or a version stops the run with one line naming the field; one whose content the
composer cannot use (no teacher log probs, lengths that disagree, a truncated prompt) is rejected by divopd's gate
and counted under its reason in ``ledger/invalid/<reason>``.
"""

from __future__ import annotations

import base64
import time
from dataclasses import fields, replace
from typing import Any

import numpy as np
from trinity.algorithm.sample_strategy import SAMPLE_STRATEGY, SampleStrategy
from trinity.algorithm.sample_strategy.utils import representative_sample
from trinity.buffer import get_buffer_reader
from trinity.common.config import BufferConfig, StorageConfig
from trinity.common.constants import StorageType
from trinity.common.experience import Experience
from trinity.utils.timer import Timer

from divopd.errors import UsageError, one_line
from divopd.experience import Turn
from divopd.sampling import Batch, Sampler, SamplerConfig, is_stale, ledger_metrics, make_sampler

__all__ = ["STRATEGY_NAME", "DivOPDSampleStrategy", "default_sample_args", "experience_to_turn", "sampler_config"]

#: The name in Trinity's SAMPLE_STRATEGY registry.
STRATEGY_NAME = "divopd"
_STATE_VERSION = 1
_WHO = "sample_strategy divopd"


def default_sample_args() -> dict[str, Any]:
    """``sample_strategy_args`` and their defaults: the paper's values (``SamplerConfig``'s defaults), the rule
    ``divopd``, and ``batch_size`` None = Trinity's ``buffer.train_batch_size``."""
    args: dict[str, Any] = {"method": "divopd", "batch_size": None}
    for f in fields(SamplerConfig):
        args.setdefault(f.name, f.default)
    return args


def sampler_config(args: dict[str, Any], train_batch_size: int) -> SamplerConfig:
    """The :class:`SamplerConfig` of ``sample_strategy_args``; a bad key or value is one :class:`UsageError` line."""
    defaults = default_sample_args()
    unknown = sorted(set(args) - set(defaults))
    if unknown:
        raise UsageError(f"algorithm.sample_strategy_args: unknown key {unknown[0]!r} for sample_strategy "
                         f"{STRATEGY_NAME!r}; known: {', '.join(defaults)}")
    merged = {**defaults, **args}
    if merged["batch_size"] is None:
        merged["batch_size"] = train_batch_size
    try:
        return SamplerConfig(**merged)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"algorithm.sample_strategy_args: {exc}") from None


# ---------------------------------------------------------------------------------------------------- records
def _numpy(tensor: Any, dtype: Any) -> np.ndarray | None:
    if tensor is None:
        return None
    if hasattr(tensor, "detach"):  # a torch tensor (bf16 has no numpy form: go through float32)
        tensor = tensor.detach().cpu()
        tensor = tensor.float() if tensor.is_floating_point() else tensor
        tensor = tensor.numpy()
    return np.asarray(tensor, dtype=dtype).reshape(-1)


def _field_error(exp: Experience, what: str) -> UsageError:
    return UsageError(f"{_WHO}: experience {exp.eid} {what}; DivOPD selects per turn and needs the rollout id "
                      "(eid.batch/eid.task/eid.run), the turn index (eid.step) and info['model_version'] on every "
                      "experience (docs/integrations/trinity.md)")


def experience_to_turn(exp: Experience) -> Turn:
    """The :class:`divopd.Turn` of one Trinity experience (one student turn); its content is judged by the gate.

    Raises :class:`UsageError` (one line naming the field) when the record has no rollout id or no model version.
    """
    eid = exp.eid
    if eid is None or (eid.batch in ("", None) and eid.task in ("", None)):
        raise _field_error(exp, "has no rollout id (eid.batch and eid.task are empty)")
    version = (exp.info or {}).get("model_version")
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
        raise _field_error(exp, f"has no usable info['model_version'] (got {version!r})")
    tokens = _numpy(exp.tokens, np.int64)
    if tokens is None:
        raise _field_error(exp, "has no tokens")
    prompt_length = int(exp.prompt_length)
    info = {"task": (exp.info or {}).get("task", eid.tid)}
    if (exp.info or {}).get("success") is not None:
        info["success"] = bool(exp.info["success"])
    try:
        return Turn(
            rollout_id=eid.rid,
            turn_index=eid.step,
            policy_version=int(version),
            prompt_ids=tokens[:prompt_length],
            response_ids=tokens[prompt_length:],
            action_mask=_numpy(exp.action_mask, bool),
            student_logprobs=_numpy(exp.logprobs, np.float32),
            teacher_logprobs=_numpy(exp.teacher_logprobs, np.float32),
            prompt_truncated=exp.truncate_status == "prompt_truncated",
            info=info,
        )
    except ValueError as exc:  # a negative eid.step, a field that is not a 1-d sequence
        raise _field_error(exp, f"cannot be read as a turn ({exc})") from None


def _queue_storage(buffer_config: BufferConfig) -> StorageConfig:
    """The trainer's experience buffer as a storage config; it must be a queue without Trinity's replay buffer."""
    exp_buffer = buffer_config.trainer_input.experience_buffer
    if exp_buffer is None:
        raise UsageError(f"{_WHO}: buffer.trainer_input.experience_buffer is not set")
    storage = exp_buffer.to_storage_config()
    if storage.storage_type != StorageType.QUEUE.value:
        raise UsageError(f"{_WHO} reads a queue experience buffer: set buffer.trainer_input.experience_buffer."
                         f"storage_type to queue (got {storage.storage_type!r})")
    if storage.replay_buffer is not None and storage.replay_buffer.enable:
        raise UsageError(f"{_WHO}: set buffer.trainer_input.experience_buffer.replay_buffer.enable to false "
                         "(DivOPD keeps its own pending pool; a replayed experience would be counted twice)")
    return storage


# ---------------------------------------------------------------------------------------------------- strategy
class DivOPDSampleStrategy(SampleStrategy):
    """Trinity-RFT sample strategy that composes each batch with a divopd rule (see the module docstring).

    Args:
        buffer_config: Trinity's ``buffer`` config (the trainer's experience buffer is read).
        **kwargs: ``algorithm.sample_strategy_args``: ``method``, ``batch_size``, ``pool_factor``, ``cap``,
            ``max_staleness``, ``max_pending_age`` and the other :class:`SamplerConfig` fields
            (:func:`default_sample_args`).
    """

    def __init__(self, buffer_config: BufferConfig, **kwargs: Any) -> None:
        super().__init__(buffer_config)
        self.config = sampler_config(kwargs, buffer_config.train_batch_size)
        self.sampler: Sampler = make_sampler(self.config)
        storage = _queue_storage(buffer_config)
        self._reader = get_buffer_reader(storage)  # blocking reads: waits up to max_read_timeout
        self._probe = get_buffer_reader(replace(storage, max_read_timeout=0.0))  # answers within about 1 s
        self._wait_s = float(storage.max_read_timeout)
        self._held: dict[int, tuple[int, Experience]] = {}  # arrival -> (model version, experience), turns waiting
        self._closed = False  # the explorer side released the buffer and it is empty

    @classmethod
    def default_args(cls) -> dict:
        return default_sample_args()

    @property
    def held(self) -> int:
        """Experiences held for turns still waiting in the sampler (pending or queued): at most the pool."""
        return len(self._held)

    # ------------------------------------------------------------------ one step
    async def sample(self, step: int, **kwargs: Any) -> tuple[list[Experience], dict, list]:
        """Exactly ``batch_size`` experiences for trainer step ``step`` (learner version ``step − 1``)."""
        learner_version = int(step) - 1
        metrics: dict[str, Any] = {}
        with Timer(metrics, "time/read_experience"):
            batch = await self._compose(learner_version)
        experiences = [self._held.pop(arrival)[1] for arrival in batch.arrivals]
        self._forget_departed()
        metrics.update(self._metrics(batch))
        self.set_model_version_metric(experiences, metrics)
        return experiences, metrics, representative_sample(experiences)

    async def _compose(self, learner_version: int) -> Batch:
        deadline = time.monotonic() + self._wait_s
        while True:
            await self._top_up(learner_version)
            batch = self.sampler.next_batch(learner_version)
            if batch is not None:
                return batch
            if self._closed:
                raise StopAsyncIteration(f"{_WHO}: the experience buffer is closed; {self._waiting_note()}")
            if time.monotonic() > deadline:
                raise TimeoutError(self._starved(learner_version))
            try:  # too few valid turns: wait for the next experience
                self._add(await self._reader.read(1))
            except TimeoutError:
                raise TimeoutError(self._starved(learner_version)) from None
            except StopAsyncIteration:
                self._closed = True

    async def _top_up(self, learner_version: int) -> None:
        """Read without waiting until the sampler can fill its pool with non-stale turns or the buffer is empty."""
        target = self.config.pool_size if self.sampler.method.pooled else self.config.batch_size
        while not self._closed:
            fresh = sum(not is_stale(v, learner_version, self.config.max_staleness) for v, _ in self._held.values())
            if fresh >= target:
                return
            experiences = await self._read_now(target - fresh)
            if not experiences:
                return
            self._add(experiences)

    async def _read_now(self, limit: int) -> list[Experience]:
        """Up to ``limit`` experiences the buffer holds now; ``[]`` when it is empty (or closed)."""
        try:
            payloads = await self._reader.queue.length.remote()  # written, unread payloads: >= 1 experience each
            if payloads > 0:
                return await self._reader.read(min(payloads, limit))
            return await self._probe.read(1)  # the rest of a payload read in part, or nothing within ~1 s
        except TimeoutError:  # the probe found the buffer empty (Trinity's reader loses nothing on 0 of 1)
            return []
        except StopAsyncIteration:
            self._closed = True
            return []

    def _add(self, experiences: list[Experience]) -> None:
        turns = [experience_to_turn(e) for e in experiences]  # all first: a bad record stops before any is queued
        for arrival, turn, exp in zip(self.sampler.add(turns), turns, experiences, strict=True):
            self._held[arrival] = (turn.policy_version, exp)

    def _forget_departed(self) -> None:
        """Drop the experiences of turns that left the sampler unselected (expired, or rejected by the gate)."""
        if len(self._held) <= self.sampler.waiting:
            return
        waiting = self.sampler.waiting_arrivals()
        for arrival in [a for a in self._held if a not in waiting]:
            del self._held[arrival]

    # ------------------------------------------------------------------ metrics and messages
    def _metrics(self, batch: Batch) -> dict[str, float]:
        """divopd's names: ``sampler/<batch stat>``, ``ledger/<counter>``, ``ledger/{invalid,expired}/<reason>``."""
        metrics = {f"sampler/{k}": float(v) for k, v in batch.stats.items()} | ledger_metrics(self.sampler.ledger)
        metrics["sampler/held_experiences"] = float(len(self._held))
        return metrics

    def _waiting_note(self) -> str:
        ledger = self.sampler.ledger
        counts = ", ".join(f"{k} {ledger[k]}" for k in ("received", "selected", "expired", "invalid", "pending",
                                                         "queued"))
        return f"{self.sampler.waiting} turns waiting, too few valid for a batch of {self.config.batch_size} ({counts})"

    def _starved(self, learner_version: int) -> str:
        return one_line(f"{_WHO}: no batch for step {learner_version + 1} within {self._wait_s:g} s "
                        f"(buffer.trainer_input.experience_buffer.max_read_timeout): {self._waiting_note()}")

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """The sampler's state and the experiences of its waiting turns (JSON-able: Trinity writes it as JSON)."""
        self._forget_departed()
        arrivals = sorted(self._held)
        payload = Experience.serialize_many([self._held[a][1] for a in arrivals]) if arrivals else b""
        return {
            "divopd": _STATE_VERSION,
            "sampler": self.sampler.state_dict(),
            "arrivals": arrivals,
            "experiences": base64.b64encode(payload).decode("ascii"),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Resume from :meth:`state_dict`; an empty state (a fresh run) or a queue reader's index changes nothing."""
        if not state_dict or (set(state_dict) <= {"current_index"}):
            return
        if state_dict.get("divopd") != _STATE_VERSION or "sampler" not in state_dict:
            raise UsageError(f"{_WHO}: the checkpoint's sample_strategy_state was not written by this strategy "
                             f"(keys {sorted(state_dict)})")
        try:
            self.sampler.load_state_dict(state_dict["sampler"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{_WHO}: cannot resume the sampler: {exc}") from None
        payload = base64.b64decode(state_dict["experiences"])
        experiences = Experience.deserialize_many(payload) if payload else []
        arrivals = [int(a) for a in state_dict["arrivals"]]
        if len(experiences) != len(arrivals) or len(arrivals) != self.sampler.waiting:
            raise UsageError(f"{_WHO}: the checkpoint holds {len(experiences)} experiences for {len(arrivals)} "
                             f"arrivals and {self.sampler.waiting} waiting turns")
        self._held = {a: (int(e.info["model_version"]), e) for a, e in zip(arrivals, experiences, strict=True)}


if STRATEGY_NAME not in SAMPLE_STRATEGY.modules:  # a plug-in directory may load this module a second time
    SAMPLE_STRATEGY.register_module(STRATEGY_NAME, module_cls=DivOPDSampleStrategy)
