"""DivOPD's batch composer inside verl 0.9.1's v1 trainer: a ``ReplayBuffer`` for ``custom_sampler``
(docs/integrations/verl.md)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from divopd.errors import UsageError
from divopd.integrations.plugin_keys import VERL_KWARGS
from divopd.integrations.verl_dispatch import verl_dispatch, verl_resume_point
from divopd.integrations.verl_records import (
    RECORD_FIELDS,
    SUMMARY_TAG,
    VerlRecordError,
    candidate_of,
    record_summary,
    safe_fields,
)
from divopd.sampling import Batch, Candidate, Ledger, Sampler, SamplerConfig, make_sampler

__all__ = ["DivOPDReplayBuffer", "DEFAULTS", "VerlRecordError", "batch_metrics", "divopd_config"]

_STATE_VERSION = 2

#: The settings ``sampler_kwargs`` may give, with their defaults (:mod:`divopd.integrations.plugin_keys`).
DEFAULTS: dict[str, Any] = VERL_KWARGS


def divopd_config(sampler_kwargs: Any, max_off_policy_threshold: int | None, batch_size: int) -> SamplerConfig:
    """The :class:`SamplerConfig` of verl's ``sampler_kwargs`` for ``batch_size`` turns (one line on a bad value)."""
    kwargs = dict(sampler_kwargs or {})
    unknown = sorted(set(kwargs) - set(DEFAULTS))
    if unknown:
        raise UsageError(f"trainer.v1.sampler.sampler_kwargs: unknown key(s) {unknown}; known: {sorted(DEFAULTS)}")
    settings = {**DEFAULTS, **kwargs}  # None: max_pending / max_pending_age off; batch_size, max_staleness derived
    if settings["batch_size"] is not None and settings["batch_size"] != batch_size:
        raise UsageError(f"trainer.v1.sampler.sampler_kwargs.batch_size={settings['batch_size']} but verl asks for "
                         f"{batch_size} rows per sample (data.train_batch_size / parameter_sync_step): make them equal")
    staleness = settings["max_staleness"]
    if staleness is None:
        staleness = 2 if max_off_policy_threshold is None else int(max_off_policy_threshold) - 1
    try:
        return SamplerConfig(
            method=str(settings["method"]), batch_size=int(batch_size), pool_factor=settings["pool_factor"],
            cap=settings["cap"], max_staleness=staleness, max_pending=settings["max_pending"],
            seed=settings["seed"], cap_unit=settings["cap_unit"], max_pending_age=settings["max_pending_age"],
            group_order=settings["group_order"])
    except (ValueError, KeyError) as exc:
        raise UsageError(f"trainer.v1.sampler.sampler_kwargs: {exc}") from None


#: What the sampler holds per turn: the record's TransferQueue key and its tag.
Held = tuple[str, dict[str, Any]]


def batch_metrics(batch: Batch[Held] | None, ledger: Ledger) -> dict[str, float]:
    """divopd's metric names (docs/reference/metrics.md): ``sampler/<stat>`` of the batch and ``ledger/...``."""
    return ledger.as_metrics(None if batch is None else batch.stats)


def _rows(value: Any) -> list[Any]:
    """The rows of a field TransferQueue returned: a (nested) tensor, or a list where the records' ranks differ."""
    return list(value.unbind(0)) if hasattr(value, "unbind") else list(value)


class DivOPDReplayBuffer(ReplayBuffer):
    """verl v1 ``ReplayBuffer`` whose training batches are composed by a divopd method.

    Load it with ``trainer.v1.sampler.custom_sampler.path=pkg://divopd.integrations.verl`` and
    ``custom_sampler.name=DivOPDReplayBuffer``; ``sampler_kwargs`` take the :class:`~divopd.sampling.SamplerConfig`
    fields (``method``, ``pool_factor``, ``cap``, ...). Each ``sample(global_steps, "train", batch_size)`` adds the
    per-turn records put into TransferQueue since the last call to one :class:`~divopd.sampling.Sampler` kept across
    steps, and returns the keys of exactly ``batch_size`` turns composed for learner version ``global_steps - 1``.
    Expired and rejected turns are cleared from TransferQueue at once and counted in the ledger; a short step polls
    every ``poll_interval`` seconds up to ``sample_timeout_s``, then stops with one line. A turn expires when
    ``(global_steps - 1) - min_global_steps > max_staleness`` (default: verl's ``max_off_policy_threshold`` − 1).
    Validation batches keep verl's rule.
    """

    def __init__(self, trainer_mode: str, trainer_config: Any, max_off_policy_threshold: int | None,
                 max_off_policy_strategy: str, sampler_kwargs: Any, poll_interval: float = 2.0, refill_fn: Any = None,
                 **kwargs: Any) -> None:
        if max_off_policy_strategy == "wait":
            raise UsageError("trainer.v1.sampler.max_off_policy_strategy=wait: DivOPDReplayBuffer expires stale turns "
                             "(drop); 'wait' is verl's built-in rule")
        super().__init__(trainer_mode=trainer_mode, trainer_config=trainer_config,
                         max_off_policy_threshold=max_off_policy_threshold,
                         max_off_policy_strategy=max_off_policy_strategy, sampler_kwargs=sampler_kwargs,
                         poll_interval=poll_interval, refill_fn=refill_fn, **kwargs)
        self._settings = dict(sampler_kwargs or {})
        divopd_config(self._settings, max_off_policy_threshold, self._settings.get("batch_size") or 1)  # fail early
        self.sample_timeout_s = float(self._settings.get("sample_timeout_s") or DEFAULTS["sample_timeout_s"])
        self.sampler: Sampler[Held] | None = None
        self._listed: set[str] = set()  # keys read (waiting, or handed out) that TransferQueue still lists
        self.stopped: list[str] = []  # keys of the records that stopped the run (left in TransferQueue)
        # sessions per step, metrics, and the experience log (continued where verl resumes this run)
        self.dispatch = verl_dispatch(self._settings, refill_fn, trainer_mode,
                                      verl_resume_point(sampler_kwargs, trainer_config))

    # ------------------------------------------------------------------ sampling
    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """Block until divopd composes ``batch_size`` turns (validation partitions: verl's own rule)."""
        if partition_id != "train":
            return super().sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        deadline = time.monotonic() + self.sample_timeout_s
        self._ensure_sampler(batch_size)
        self.dispatch.before_step(global_steps)  # the matched dispatch starts this step's sessions
        while True:
            batch, metrics = self.sample_nowait(global_steps, partition_id, batch_size)
            if batch is not None:
                return batch, metrics
            if time.monotonic() >= deadline:
                ledger = {k: v for k, v in asdict(self.sampler.ledger).items() if not isinstance(v, dict)}
                raise UsageError(f"DivOPDReplayBuffer: no batch of {batch_size} turns for step {global_steps} within "
                                 f"sample_timeout_s={self.sample_timeout_s:g} (ledger {ledger}): the rollout side "
                                 "produced too few valid, fresh turns")
            time.sleep(self.poll_interval)

    def sample_nowait(self, global_steps: int, partition_id: str, batch_size: int
                      ) -> tuple[KVBatchMeta | None, dict[str, float]]:
        """One poll: read new records, compose once; ``(None, metrics)`` when too few turns are eligible."""
        sampler = self._ensure_sampler(batch_size)
        self.dispatch.version = int(global_steps) - 1
        self.ingest(partition_id)
        batch = sampler.next_batch(int(global_steps) - 1)
        departed = [key for key, _ in sampler.take_departed()]  # expired or rejected: cleared at once
        if departed:
            self._listed.difference_update(departed)
            tq.kv_clear(keys=departed, partition_id=partition_id)
        metrics = batch_metrics(batch, sampler.ledger)
        if batch is None:
            return None, metrics
        metrics["sampler/teacher_masked_tokens"] = float(self.make_safe(partition_id, batch.payloads))
        keys = [key for key, _ in batch.payloads]
        tags = [{k: v for k, v in tag.items() if k != SUMMARY_TAG} for _, tag in batch.payloads]
        metrics.update(self.dispatch.step(sampler.ledger))
        return KVBatchMeta(partition_id=partition_id, keys=keys, tags=tags), metrics

    def _ensure_sampler(self, batch_size: int) -> Sampler:
        if self.sampler is None:
            self.sampler = make_sampler(divopd_config(self._settings, self.max_off_policy_threshold, batch_size),
                                        track_departed=True)
            self.dispatch.plugin.dispatch.batch_size = int(batch_size)
        elif self.sampler.config.batch_size != batch_size:
            raise UsageError(f"DivOPDReplayBuffer: verl asked for {batch_size} rows, the sampler composes "
                             f"{self.sampler.config.batch_size} (keep data.train_batch_size fixed)")
        return self.sampler

    def ingest(self, partition_id: str) -> list[Candidate]:
        """Add the records put since the last poll (in TransferQueue's order) to the sampler; clear finished prompts.
        A record is read from divopd's summary tag alone; one without it has its fields fetched once to summarise it."""
        listing = (tq.kv_list(partition_id=partition_id) or {}).get(partition_id, {})
        self._listed &= listing.keys()  # verl cleared the handed-out records it trained on
        keys, tags, done_prompts = [], [], []
        for key, tag in listing.items():
            if tag.get("is_prompt", False):
                if tag.get("status") in ("finished", "failure"):
                    done_prompts.append(key)
            elif key not in self._listed and tag.get("status") == "success":  # a record being written has no status yet
                keys.append(key)
                tags.append(tag)
        errors: dict[str, VerlRecordError] = {}
        bare = [i for i, tag in enumerate(tags) if SUMMARY_TAG not in tag]
        for i, values in zip(bare, self._read(partition_id, [keys[i] for i in bare]), strict=True):
            try:
                tags[i] = {**tags[i], SUMMARY_TAG: record_summary(keys[i], tags[i], values)[1]}
            except VerlRecordError as exc:
                errors[keys[i]] = exc
        candidates: list[Candidate] = []
        for key, tag in zip(keys, tags, strict=True):
            try:
                candidates.append(candidate_of(key, tag))
            except VerlRecordError as exc:
                errors.setdefault(key, exc)
        if errors:
            self._stop(partition_id, errors)
        arrivals = self.sampler.add(list(zip(keys, tags, strict=True)), candidates)
        self.dispatch.observe([c.rollout_id for c in candidates], arrivals, lambda: [  # in full, for the experience log
            record_summary(k, t, v)[0] for k, t, v in zip(keys, tags, self._read(partition_id, keys), strict=True)])
        self._listed.update(keys)
        if done_prompts:  # their trajectories were put before their terminal status: all read above
            tq.kv_clear(keys=done_prompts, partition_id=partition_id)
        return candidates

    def _stop(self, partition_id: str, errors: dict[str, VerlRecordError]) -> None:
        """Count the records that stop the run (:attr:`stopped`) and raise one line; nothing is read out of
        TransferQueue: they, and the records read with them, stay there (none entered the sampler)."""
        self.stopped.extend(k for k in errors if k not in self.stopped)
        first = next(iter(errors.values()))
        raise VerlRecordError(f"{first} [{len(self.stopped)} record(s) stopped the run, kept in TransferQueue "
                              f"partition {partition_id!r}: {sorted(errors)[:3]}]")

    @staticmethod
    def _read(partition_id: str, keys: list[str]) -> list[dict[str, Any]]:
        """The fields of ``keys`` that the composer reads (one batched get; per key where fields differ)."""
        if not keys:
            return []
        try:
            data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=list(RECORD_FIELDS))
            columns = {f: _rows(data[f]) for f in RECORD_FIELDS}
            return [{f: columns[f][i] for f in RECORD_FIELDS} for i in range(len(keys))]
        except (ValueError, KeyError, RuntimeError):  # some record lacks a field: read each on its own
            out = []
            for key in keys:
                data = tq.kv_batch_get(keys=[key], partition_id=partition_id)
                out.append({f: _rows(data[f])[0] for f in RECORD_FIELDS if f in data.keys()})
            return out

    def make_safe(self, partition_id: str, records: list[Held]) -> int:
        """Rewrite the selected records verl could not train on as they are (:func:`safe_fields`: a teacher value
        that is not finite, a teacher in the one-value-per-token layout); returns the positions that left the mask."""
        rewrite = [key for key, tag in records if tag[SUMMARY_TAG]["rewrite"]]
        dropped = 0
        for key, values in zip(rewrite, self._read(partition_id, rewrite), strict=True):
            fields, n = safe_fields(values, key)
            tq.kv_put(key=key, partition_id=partition_id, fields=fields)
            dropped += n
        return dropped

    # ------------------------------------------------------------------ state
    def waiting_keys(self) -> set[str]:
        """The keys of the records still waiting in the sampler (pending or queued)."""
        return set() if self.sampler is None else {key for key, _ in self.sampler.waiting_payloads()}

    def state_dict(self) -> dict[str, Any]:
        """The sampler state (queue, pending pool, ledger) with the waiting records' keys and tags (JSON-able), for a
        trainer that checkpoints its buffer (verl 0.9.1 does not)."""
        return {"version": _STATE_VERSION, "sampler": None if self.sampler is None else self.sampler.state_dict(list),
                "read": sorted(self._listed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (TransferQueue must still hold the waiting turns' records)."""
        if state.get("version") != _STATE_VERSION:
            raise UsageError(f"DivOPDReplayBuffer state version {state.get('version')!r} was written by another "
                             f"divopd; this one reads version {_STATE_VERSION} only")
        self.sampler = None
        if state["sampler"] is not None:
            self.sampler = make_sampler(SamplerConfig(**state["sampler"]["config"]), track_departed=True)
            self.sampler.load_state_dict(state["sampler"], tuple)
        self._listed = set(state["read"])

    # ------------------------------------------------------------------ verl's async-trainer hooks
    def get_sampleable_count(self, global_steps: int, partition_id: str) -> int:
        """Turns waiting in the sampler after reading new records (verl asks before a hybrid-rollout switch)."""
        if self.sampler is None:
            return 0
        self.ingest(partition_id)
        return self.sampler.waiting
