"""The matched dispatch inside verl 0.9.1's v1 trainer: the DivOPD buffer decides how many sessions start per step.

divopd's agent-loop manager holds the training prompts verl submits (a reservoir of at most :data:`RESERVOIR_STEPS`
steps' worth; older surplus prompts are released unplayed, their TransferQueue markers cleared); each step the buffer's
:class:`VerlDispatch` starts the sessions the rule of :mod:`divopd.integrations.dispatch` asks for, from the reservoir
first, then through verl's ``refill_fn``. Without divopd's manager, or with ``dispatch=verl``, verl dispatches as it
does and the buffer only measures.
"""

from __future__ import annotations

import json
import logging
import math
import os
import weakref
from collections.abc import Callable
from typing import Any

from divopd.errors import UsageError
from divopd.integrations.plugin_run import PluginRun, split_plugin_args
from divopd.sampling.ledger import Ledger

__all__ = ["DISPATCH_MODES", "RESERVOIR_STEPS", "VerlDispatch", "claim", "verl_dispatch", "verl_resume_point"]

log = logging.getLogger("divopd.integrations")

#: The reservoir keeps at most this many steps of prompts (in prompts per step, at least one gen_batch_size chunk).
RESERVOIR_STEPS = 4

#: ``sampler_kwargs.dispatch``: ``matched`` (the buffer starts the sessions) or ``verl`` (verl's own per-step
#: dispatch of ``train_batch_size`` prompts; the buffer only measures).
DISPATCH_MODES = ("matched", "verl")

_UNCLAIMED: weakref.ref | None = None  # the newest DivOPD buffer's matched dispatch that no manager has linked yet


def claim() -> VerlDispatch | None:
    """The matched dispatch of the DivOPD buffer built in this process that no manager has linked yet (verl's trainer
    builds its buffer before its agent-loop manager, in one process); each dispatch is claimed once."""
    global _UNCLAIMED
    dispatch = _UNCLAIMED() if _UNCLAIMED is not None else None
    _UNCLAIMED = None
    return dispatch


def _horizon(prompts: Any) -> int | None:
    """``max_steps`` of the first divopd task row in a prompt batch (``extra_info.divopd_task``), if any."""
    try:
        extra = prompts["extra_info"][0]
        row = extra.get("divopd_task")
        row = json.loads(row) if isinstance(row, str) else row
        return int(row["max_steps"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return None


def verl_resume_point(*nodes: Any) -> tuple[str | None, int | None]:
    """``(the run's checkpoint folder, the global step verl resumes from)`` as verl's ``_load_checkpoint`` decides it,
    read from the config root of any of ``nodes`` (the buffer's ``sampler_kwargs`` / ``trainer_config``); ``(None,
    None)`` where no node leads to verl's config, a step of ``None`` for a fresh run."""
    for node in nodes:
        try:
            trainer = node._get_root().trainer
            break
        except (AttributeError, KeyError):  # a plain dict (a buffer built by hand), or no trainer section
            continue
    else:
        return None, None
    folder = trainer.get("default_local_dir")
    folder = None if folder is None else os.path.abspath(str(folder))
    mode = trainer.get("resume_mode", "auto")
    if mode == "auto" and folder is not None:
        from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

        found = find_latest_ckpt_path(folder)
    elif mode == "resume_path" and trainer.get("resume_from_path"):
        found = os.path.abspath(str(trainer.resume_from_path))
        folder = os.path.dirname(found.rstrip(os.sep))
    else:
        found = None
    try:
        step = None if found is None else int(str(found).rstrip(os.sep).split("global_step_")[-1])
    except ValueError:
        step = None
    return folder, step


def verl_dispatch(sampler_kwargs: dict[str, Any], refill_fn: Any, trainer_mode: str,
                  resume: tuple[str | None, int | None] = (None, None)) -> VerlDispatch:
    """The buffer's dispatch and plug-in bookkeeping from its ``sampler_kwargs`` (one line on a bad value); ``resume``
    is :func:`verl_resume_point`: a run resumed from step K continues the experience log without the rows logged at
    learner version K or later (verl's step K + 1 composes for version K)."""
    settings = split_plugin_args({k: v for k, v in sampler_kwargs.items() if k != "dispatch"})[0]
    run, step = resume
    plugin = PluginRun(settings, int(sampler_kwargs.get("batch_size") or 1), "DivOPDReplayBuffer",
                       "trainer.v1.sampler.sampler_kwargs", framework="verl", run=run)
    plugin.start(resume_update=step)  # the buffer's sampler numbers arrivals from 0 again: the log goes on after them
    return VerlDispatch(plugin, refill_fn, trainer_mode, str(sampler_kwargs.get("dispatch") or "matched"))


class VerlDispatch:
    """The buffer's side: ``before_step`` starts the step's sessions through the linked manager."""

    def __init__(self, plugin: PluginRun, refill_fn: Any, trainer_mode: str, mode: str = "matched") -> None:
        global _UNCLAIMED
        if mode not in DISPATCH_MODES:
            raise UsageError(f"trainer.v1.sampler.sampler_kwargs.dispatch: one of {', '.join(DISPATCH_MODES)}, got "
                             f"{mode!r}")
        self.plugin = plugin
        self.refill_fn = refill_fn
        self.plugin.dispatch.asynchronous = trainer_mode != "sync"
        self.manager: Any = None
        self.gen_batch_size = 1
        self.reservoir: list[Any] = []  # prompt TensorDicts verl submitted, oldest first
        self.released = 0  # surplus prompts released unplayed (their markers cleared)
        self._step: int | None = None
        if mode == "matched" and refill_fn is not None:
            _UNCLAIMED = weakref.ref(self)

    # ------------------------------------------------------------------ the manager's side
    def link(self, manager: Any, sessions_per_prompt: int, gen_batch_size: int) -> None:
        """divopd's manager registers: from now on it holds training prompts and this dispatch starts them."""
        self.manager = manager
        self.plugin.dispatch.sessions_per_prompt = max(1, int(sessions_per_prompt))
        self.gen_batch_size = max(1, int(gen_batch_size))

    def hold(self, prompts: Any) -> None:
        """Keep a training prompt batch verl submitted; release the oldest surplus past the reservoir's size."""
        import transfer_queue as tq

        horizon = _horizon(prompts)
        if horizon is not None:
            self.plugin.set_horizon(horizon)
        self.reservoir.append(prompts)
        limit = RESERVOIR_STEPS * max(self.plugin.dispatch.prompts_to_submit(), self.gen_batch_size)
        while len(self.reservoir) > 1 and self.held - len(self.reservoir[0]) >= limit:
            keys = [str(k) for k in self.reservoir.pop(0)["uid"]]
            tq.kv_clear(keys=keys, partition_id="train")  # a surplus prompt released unplayed: its marker cleared
            self.released += len(keys)

    @property
    def held(self) -> int:
        return sum(len(p) for p in self.reservoir)

    # ------------------------------------------------------------------ the buffer's side
    version = 0  # the learner version the buffer composes for now (turns read are logged with it)

    def observe(self, rollout_ids: list[str], arrivals: list[int], turns: Callable[[], list[Any]] | None = None
                ) -> None:
        """Turns the buffer received (their rollouts); ``turns()`` reads them in full, only for the experience log."""
        self.plugin.observe(rollout_ids, arrivals, self.version, turns)

    def step(self, ledger: Ledger) -> dict[str, float]:
        """Close a step: the plug-in's metrics."""
        return self.plugin.step(ledger)

    def before_step(self, global_steps: int) -> None:
        """Start this step's sessions (once per step; nothing when no manager is linked)."""
        if self.manager is None or self._step == global_steps:
            return
        self._step = global_steps
        want = self.plugin.dispatch.prompts_to_submit()
        if want <= 0:
            self.plugin.dispatch.started(0)
            return
        if self.held < want:  # verl's refill: a whole number of gen_batch_size chunks, into the reservoir
            self.refill_fn(math.ceil((want - self.held) / self.gen_batch_size) * self.gen_batch_size)
        batch = self._take(want, global_steps)
        self.manager.start_sessions(batch)
        self.plugin.dispatch.started(len(batch) * self.plugin.dispatch.sessions_per_prompt)

    def _take(self, n: int, global_steps: int) -> Any:
        """The oldest ``n`` held prompts as one batch, stamped with the step that starts them."""
        from verl.utils import tensordict_utils as tu

        out, need = [], n
        while need > 0 and self.reservoir:
            head = self.reservoir.pop(0)
            if len(head) > need:
                self.reservoir.insert(0, head[need:])
                head = head[:need]
            out.append(head)
            need -= len(head)
        for piece in out:
            tu.assign_non_tensor_data(piece, "global_steps", global_steps)
        return out[0] if len(out) == 1 else tu.concat_tensordict(out)
