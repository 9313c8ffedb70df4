"""DivOPD inside Trinity-RFT: the sample strategy ``divopd`` (``algorithm.sample_strategy: divopd``)."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError
from trinity.algorithm.sample_strategy import SAMPLE_STRATEGY, SampleStrategy
from trinity.algorithm.sample_strategy.utils import representative_sample
from trinity.buffer import get_buffer_reader
from trinity.common.config import BufferConfig, StorageConfig
from trinity.common.constants import StorageType
from trinity.common.experience import Experience
from trinity.utils.timer import Timer

from divopd.errors import UsageError, one_line
from divopd.integrations.plugin_keys import TRINITY_ARGS
from divopd.integrations.plugin_run import TRINITY_HINT, PluginRun, split_plugin_args
from divopd.integrations.trinity_queue import Packed, ReadNow, fetch_function, read_now_function, unpack
from divopd.integrations.trinity_records import (
    TURN_VERSION_KEY,
    UNSCORED_KEY,
    experience_to_turn,
    light_candidates,
    mask_unscored,
    read_candidates,
    restore_model_version,
    stale_candidate,
)
from divopd.sampling import Batch, Candidate, Sampler, SamplerConfig, make_sampler

__all__ = ["STRATEGY_NAME", "DivOPDSampleStrategy", "default_sample_args", "experience_to_turn", "sampler_config"]

#: The name in Trinity's SAMPLE_STRATEGY registry.
STRATEGY_NAME = "divopd"
_STATE_VERSION = 2
#: Per turn: its experience, or the key under which Trinity's queue actor keeps it (an int), or ``None`` (a record
#: that arrived stale, dropped in the actor, expires unselected); and whether it has a teacher position not finite.
Held = tuple[Experience | int | None, bool]
_WHO = "sample_strategy divopd"
#: A request to Trinity's queue actor gets the buffer's ``max_read_timeout`` plus this many seconds (its take waits up
#: to the former, its reply up to 30 s more), then stops the step with a TimeoutError line.
CALL_SLACK_S = 60.0


def default_sample_args() -> dict[str, Any]:
    """``sample_strategy_args`` and their defaults (:data:`~divopd.integrations.plugin_keys.TRINITY_ARGS`)."""
    return dict(TRINITY_ARGS)


def sampler_config(args: dict[str, Any], train_batch_size: int) -> SamplerConfig:
    """The :class:`SamplerConfig` of ``sample_strategy_args``; a bad key or value is one :class:`UsageError` line."""
    defaults, args = split_plugin_args(default_sample_args())[1], split_plugin_args(args)[1]
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


def _encode(held: Held) -> list[Any]:
    return [base64.b64encode(Experience.serialize_many([held[0]])).decode("ascii"), held[1]]


def _decode(data: list[Any]) -> Held:
    return Experience.deserialize_many(base64.b64decode(data[0]))[0], bool(data[1])


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


class DivOPDSampleStrategy(SampleStrategy):
    """Trinity-RFT sample strategy (``algorithm.sample_strategy: divopd``) that composes each batch with a divopd rule.

    Each ``Experience`` of the trainer's queue buffer (one student turn) enters one :class:`~divopd.sampling.Sampler`,
    kept across steps, with the experience as payload. A step reads until the candidate pool can be filled, composes,
    waits (up to the buffer's ``max_read_timeout``) while too few turns are valid, and returns the B experiences in
    composition order with divopd's metrics. ``kwargs``: ``sample_strategy_args`` (:func:`default_sample_args`).
    """

    def __init__(self, buffer_config: BufferConfig, **kwargs: Any) -> None:
        super().__init__(buffer_config)
        self.config = sampler_config(kwargs, buffer_config.train_batch_size)
        self.sampler: Sampler[Held] = make_sampler(self.config, track_departed=True)
        storage = _queue_storage(buffer_config)
        self._reader = get_buffer_reader(storage)  # blocking reads: waits up to max_read_timeout
        self._read_fn = read_now_function(TURN_VERSION_KEY, UNSCORED_KEY)  # count and read, in the queue actor
        self._fetch_fn = fetch_function()  # the records kept in the queue actor, taken when selected
        self._release: list[int] = []  # keys of kept records that left unselected: dropped at the next fetch
        self._wait_s = float(storage.max_read_timeout)
        self._closed = False  # the explorer side released the buffer and it is empty
        self._known = 0  # experiences the buffer holds for sure (counted, not yet read): a read of that many won't wait
        self._keep_dir = buffer_config.cache_dir  # <checkpoint job dir>/buffer, where records that stop a run go
        self.stopped: list[Experience] = []  # records that stopped the run (no rollout id / version), kept
        job_dir = str(Path(buffer_config.cache_dir).parent) if buffer_config.cache_dir else None
        self.plugin = PluginRun(split_plugin_args(kwargs)[0], self.config.batch_size, _WHO,
                                "algorithm.sample_strategy_args", config_hint=TRINITY_HINT, framework="Trinity-RFT",
                                run=job_dir)
        self._learner_version = 0  # the version the step being composed is for (turns read are logged with it)
        self._counted_for: int | None = None  # the step whose read counted the queue (_known is its backlog)
        # records stay in the queue actor until selected and stale ones are dropped there, unless the experience log
        # needs every turn's arrays
        self.keep_in_queue = self.plugin.experience is None

    @classmethod
    def default_args(cls) -> dict:
        return default_sample_args()

    @property
    def held(self) -> int:
        """Experiences held for turns still waiting in the sampler (pending or queued), most of them in Trinity's queue
        actor: at most the pool."""
        return self.sampler.waiting

    async def sample(self, step: int, **kwargs: Any) -> tuple[list[Experience], dict, list]:
        """Exactly ``batch_size`` experiences for trainer step ``step`` (learner version ``step − 1``)."""
        learner_version = self._learner_version = int(step) - 1
        metrics: dict[str, Any] = {}
        with Timer(metrics, "time/read_experience"):
            batch = await self._compose(learner_version)
            experiences = await self._hand_over(batch.payloads)
        masked = sum(mask_unscored(exp) for exp, (_, unscored) in zip(experiences, batch.payloads, strict=True)
                     if unscored)  # flagged on arrival
        metrics.update(self.sampler.ledger.as_metrics(batch.stats))
        metrics["sampler/held_experiences"] = float(self.held)
        metrics["sampler/teacher_masked_tokens"] = float(masked)
        backlog = self._known if self._counted_for == learner_version else await self._count_unread()
        metrics.update(self.plugin.step(self.sampler.ledger, backlog=backlog))
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
                experiences = await self._reader.read(1)
                self._known = max(self._known - 1, 0)  # it may have been one of those counted
                self._counted_for = None
                self._add(ReadNow(None, [], [], None, len(experiences), False), experiences)
            except TimeoutError:
                raise TimeoutError(self._starved(learner_version)) from None
            except StopAsyncIteration:
                self._closed = True

    async def _top_up(self, learner_version: int) -> None:
        """Read without waiting until the sampler can fill its pool with non-stale turns or the buffer is empty."""
        target = self.config.pool_size if self.sampler.method.pooled else self.config.batch_size
        while not self._closed:
            fresh = self.sampler.fresh(learner_version)
            if fresh >= target:
                return
            read, experiences, drained = await self._read_now(target - fresh, learner_version)
            self._add(read, experiences)
            if drained:  # the buffer held no more when asked: no second round trip to find it empty
                return

    async def _count_unread(self) -> int:
        """The experiences Trinity's queue holds now, unread (one round trip, nothing read): the backlog of a step whose
        read did not ask the queue actor, so that ``sampler/arrival_ratio`` counts arrivals at the step they came in."""
        if self._closed:
            return 0
        try:
            available = ReadNow(*await self._ask("a count", self._read_fn, 0, self._wait_s)).available
        except StopAsyncIteration:
            return 0
        self._known = int(available)
        return self._known

    async def _read_now(self, limit: int, learner_version: int) -> tuple[ReadNow, list[Experience], bool]:
        """Up to ``limit`` records the buffer holds now, without waiting (one round trip to the queue actor): the read,
        the experiences sent whole, and whether that was all the buffer held. A read within an earlier count goes to
        Trinity's reader (it won't wait), unless :attr:`keep_in_queue`."""
        keep = self.keep_in_queue
        stale_below = learner_version - self.config.max_staleness if keep else None
        empty = ReadNow(None, [], [], None, 0, True)
        try:
            if limit <= self._known and not keep:
                read = ReadNow(None, [], [], None, self._known, False)
            else:
                read = ReadNow(*await self._ask("a read", self._read_fn, limit, self._wait_s, stale_below, keep))
                self._counted_for = learner_version
                if read.available == 0:
                    self._closed = self._closed or read.closed
                    self._known = 0
                    return empty, [], True
            if read.data is None and not read.stale and not read.kept:  # counted only: Trinity's reader, no wait
                experiences = await self._reader.read(min(read.available, limit))
            else:
                experiences = [] if read.data is None else unpack(read.data)
                fresh, taken = len(experiences) + len(read.kept), len(experiences) + len(read.kept) + len(read.stale)
                if taken > read.available or (fresh != min(read.available, limit) and taken != read.available):
                    raise TimeoutError(f"{_WHO}: the queue held {read.available} experiences but gave {fresh} and "
                                       f"{len(read.stale)} stale for the {limit} asked for")
        except StopAsyncIteration:
            self._closed, self._known = True, 0
            return empty, [], True
        self._known = read.available - len(experiences) - len(read.kept) - len(read.stale)
        return read, experiences, self._known == 0

    def _add(self, read: ReadNow, experiences: list[Experience]) -> None:
        """Queue the turns of one read in arrival order: the records kept in the queue actor and those that arrived
        stale (from their headers) and ``experiences`` (the records sent whole, in the positions left). A record
        without a rollout id or version is kept (:attr:`stopped`, a file under ``buffer.cache_dir``) and, once the
        records read with it are queued, stops the run: the one-line :class:`UsageError` names the first bad record
        and the file."""
        slots: list[tuple[Candidate, Held] | None] = [None] * (len(experiences) + len(read.kept) + len(read.stale))
        for position, *head in read.stale:
            slots[position] = stale_candidate(*head), (None, False)
        if read.kept:
            for (position, key, *_), (candidate, flag) in zip(
                    read.kept, light_candidates([k[2:] for k in read.kept], read.arrays), strict=True):
                slots[position] = candidate, (key, flag)
        bad, error = [], None
        free = [i for i, slot in enumerate(slots) if slot is None]
        for position, exp, candidate, flag in zip(free, experiences, *read_candidates(experiences), strict=True):
            if isinstance(candidate, UsageError):
                bad.append(exp)
                error = error or candidate
            else:
                restore_model_version(exp)
                slots[position] = candidate, (exp, flag)  # flag: a teacher position not finite, masked at hand-over
        candidates = [slot[0] for slot in slots if slot is not None]
        held = [slot[1] for slot in slots if slot is not None]
        if held:
            arrivals = self.sampler.add(held, candidates)
            self.plugin.observe([c.rollout_id for c in candidates], arrivals, self._learner_version,
                                lambda: [experience_to_turn(exp) for exp, _ in held])
        if bad:
            self.stopped += bad
            raise UsageError(f"{error} [{len(self.stopped)} record(s) stopped the run; {self._keep(bad)}]")

    async def _hand_over(self, payloads: list[Held]) -> list[Experience]:
        """The selected experiences, in order: those kept in the queue actor taken from it in one request (which also
        drops the kept records that left unselected)."""
        self._release += [key for key, _ in self.sampler.take_departed() if type(key) is int]
        keys = [key for key, _ in payloads if type(key) is int]
        if not keys:
            return [exp for exp, _ in payloads]  # type: ignore[misc]  (no key, no stale record is ever selected)
        data, missing = await self._ask("the hand-over of the selected records", self._fetch_fn, keys,
                                            self._release)
        self._release = []
        fetched = iter(self._fetched(data, missing))
        return [next(fetched) if type(exp) is int else exp for exp, _ in payloads]  # type: ignore[misc]

    async def _ask(self, what: str, function: Any, *args: Any) -> Any:
        """``function(storage, *args)`` run in Trinity's queue actor, within ``max_read_timeout`` +
        :data:`CALL_SLACK_S` (``what``: the request, for the error line)."""
        try:
            return await asyncio.wait_for(self._reader.queue.__ray_call__.remote(function, *args),
                                          self._wait_s + CALL_SLACK_S)
        except asyncio.TimeoutError:
            raise TimeoutError(self._no_reply(what)) from None

    def _no_reply(self, what: str) -> str:
        return (f"{_WHO}: Trinity's queue actor did not answer {what} within {self._wait_s + CALL_SLACK_S:g} s "
                f"(buffer.trainer_input.experience_buffer.max_read_timeout + {CALL_SLACK_S:g} s); resume from the last "
                "checkpoint")

    def _fetched(self, data: Packed | None, missing: list[int]) -> list[Experience]:
        if missing:
            raise RuntimeError(f"{_WHO}: Trinity's queue actor no longer holds {len(missing)} of the records read into "
                               "the pool (was it restarted?); resume from the last checkpoint")
        experiences = unpack(data) if data else []
        for exp in experiences:
            restore_model_version(exp)
        return experiences

    def _keep(self, bad: list[Experience]) -> str:
        """Write the records that stop the run beside Trinity's buffer; where they went, for the error line."""
        if not self._keep_dir:
            return "kept in memory (DivOPDSampleStrategy.stopped): Trinity set no buffer.cache_dir"
        path = Path(self._keep_dir) / f"divopd-stopped-records-{time.strftime('%Y%m%d-%H%M%S')}-{len(self.stopped)}.bin"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(Experience.serialize_many(bad))
        except OSError as exc:
            return f"kept in memory only (DivOPDSampleStrategy.stopped): cannot write {path}: {exc.strerror}"
        return f"kept in {path} (Experience.deserialize_many)"

    def _waiting_note(self) -> str:
        ledger = self.sampler.ledger
        counts = ", ".join(f"{k} {getattr(ledger, k)}"
                           for k in ("received", "selected", "expired", "invalid", "pending", "queued"))
        return f"{self.sampler.waiting} turns waiting, too few valid for a batch of {self.config.batch_size} ({counts})"

    def _starved(self, learner_version: int) -> str:
        return one_line(f"{_WHO}: no batch for step {learner_version + 1} within {self._wait_s:g} s "
                        f"(buffer.trainer_input.experience_buffer.max_read_timeout): {self._waiting_note()}")

    def state_dict(self) -> dict:
        """The sampler's state with the experiences of its waiting turns (JSON-able: Trinity writes it as JSON); those
        kept in the queue actor are copied from it (one blocking request, within ``max_read_timeout`` +
        :data:`CALL_SLACK_S`)."""
        self.plugin.compact()  # the experience log's parts merged at each checkpoint, as divopd train does
        keys = [key for key, _ in self.sampler.waiting_payloads() if type(key) is int]
        kept: dict[int, Experience] = {}
        if keys:
            request = self._reader.queue.__ray_call__.remote(self._fetch_fn, keys, [], False)
            try:
                reply = ray.get(request, timeout=self._wait_s + CALL_SLACK_S)
            except GetTimeoutError:
                raise TimeoutError(self._no_reply("copying the waiting records for a checkpoint")) from None
            kept = dict(zip(keys, self._fetched(*reply), strict=True))

        def encode(held: Held) -> list[Any]:
            exp = kept[held[0]] if type(held[0]) is int else held[0]
            if exp is None:
                raise RuntimeError(f"{_WHO}: a stale record is still waiting at a checkpoint (expired at each step)")
            return _encode((exp, held[1]))

        return {"divopd": _STATE_VERSION, "sampler": self.sampler.state_dict(encode)}

    def load_state_dict(self, state_dict: dict) -> None:
        """Resume from :meth:`state_dict` (an empty state or a queue reader's index: a fresh run). Called once, right
        after the strategy is built: the experience log opens, or drops the turns logged past the checkpoint."""
        if not state_dict or (set(state_dict) <= {"current_index"}):
            self.plugin.start()
            return
        if "divopd" not in state_dict or "sampler" not in state_dict:
            raise UsageError(f"{_WHO}: the checkpoint's sample_strategy_state was not written by this strategy "
                             f"(keys {sorted(state_dict)})")
        if state_dict["divopd"] != _STATE_VERSION:
            raise UsageError(f"{_WHO}: the checkpoint's sample_strategy_state is version {state_dict['divopd']!r}, "
                             f"written by another divopd; this one reads version {_STATE_VERSION} only")
        try:
            self.sampler.load_state_dict(state_dict["sampler"], _decode)
        except UsageError as exc:
            raise UsageError(f"{_WHO}: cannot resume the sampler: {exc}") from None
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise UsageError(f"{_WHO}: cannot resume the sampler: {exc!r}") from None
        received = self.sampler.ledger.received  # arrivals are numbered 0, 1, ...: the next one
        self.plugin.start(resume_arrival=received, next_arrival=received)


if STRATEGY_NAME not in SAMPLE_STRATEGY.modules:  # a plug-in directory may load this module a second time
    SAMPLE_STRATEGY.register_module(STRATEGY_NAME, module_cls=DivOPDSampleStrategy)
