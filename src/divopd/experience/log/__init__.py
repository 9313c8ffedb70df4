"""Experience logs: every student response turn as it entered the queue, in Parquet (pyarrow), one row per turn.

A log records the queue's input, not any reader's output, so every selection rule can later be replayed over the same
experience (``divopd replay``; the paper's shared-buffer replays, Appendix Table 11). The training pipeline logs each
turn when it enters the queue; ``divopd simulate`` writes synthetic logs.

Columns (``SCHEMA``; *optional* columns may be absent from a log):

- ``rollout_id`` string: rollout (episode) id.
- ``turn_index`` int32: position of the turn in its rollout (>= 0).
- ``policy_version`` int64: student version that generated the response (>= 0).
- ``arrival`` int64: global arrival order (>= 0, strictly increasing down the log).
- ``arrival_update`` int64: learner updates completed when the turn entered the queue (>= 0, non-decreasing).
- ``prompt_truncated`` bool: the explorer truncated the prompt.
- ``prompt_len``, ``response_len`` int32: token counts.
- ``action_mask`` list<bool>: per response token; null = all true.
- ``student_logprobs`` list<float32>: per response token, generating policy; null = not kept.
- ``teacher_logprobs`` list<float32>: per response token; null = not scored; NaN = position not scored.
- ``teacher_valid_mask`` list<bool>: per response token; null = none.
- optional ``prompt_ids``, ``response_ids`` list<int32>: token ids (lengths ``prompt_len``, ``response_len``).
- optional ``success`` bool (nullable, rollout outcome), ``env`` string (nullable), ``teacher_acted`` bool.

Rows are in arrival order. A log is a single ``.parquet`` file or a directory of ``part-*.parquet`` files read in
numeric order (what a training run appends; compacted at each checkpoint into ``part-A-B.parquet`` files). Readers
stream record batches and never hold the whole log; they reject a
malformed log with :class:`ExperienceLogError` naming the file, the column and the first bad row. Readers accept any
integer width for integer columns and float16/32/64 for log probabilities (cast to the types above); everything else
must match. Nothing is pickled: the files are plain Parquet.

When ``prompt_ids``/``response_ids`` are absent, turns read back carry read-only zero ids of the logged lengths (enough
for selection and batch statistics, which use lengths only). The optional per-token teacher top-k arrays of
:class:`~divopd.experience.turn.Turn` are not logged.

The package: :mod:`~divopd.experience.log.schema` (columns, :class:`ExperienceLogError`, validation),
:mod:`~divopd.experience.log.reader`, :mod:`~divopd.experience.log.writer` and :mod:`~divopd.experience.log.parts`
(the part files of a directory log); every name is importable from here.
"""

from __future__ import annotations

from divopd.experience.log.parts import compact_parts as compact_parts
from divopd.experience.log.parts import log_files, requeue_at_update, truncate_log
from divopd.experience.log.parts import part_files as part_files
from divopd.experience.log.parts import set_aside_unreadable_parts as set_aside_unreadable_parts
from divopd.experience.log.reader import batch_to_turns as batch_to_turns
from divopd.experience.log.reader import iter_record_batches, read_log, row_to_turn
from divopd.experience.log.schema import LIST_LENGTHS as LIST_LENGTHS
from divopd.experience.log.schema import NON_NEGATIVE as NON_NEGATIVE
from divopd.experience.log.schema import NOT_NULL as NOT_NULL
from divopd.experience.log.schema import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    SCHEMA,
    ExperienceLogError,
    LoggedTurn,
    validate_batch,
    validate_schema,
)
from divopd.experience.log.schema import PART_PATTERN as PART_PATTERN
from divopd.experience.log.writer import ExperienceLogWriter, turn_to_row, write_log
from divopd.experience.log.writer import rows_to_batch as rows_to_batch

__all__ = [
    "SCHEMA",
    "REQUIRED_COLUMNS",
    "OPTIONAL_COLUMNS",
    "ExperienceLogError",
    "ExperienceLogWriter",
    "LoggedTurn",
    "iter_record_batches",
    "log_files",
    "read_log",
    "row_to_turn",
    "requeue_at_update",
    "truncate_log",
    "turn_to_row",
    "validate_batch",
    "validate_schema",
    "write_log",
]
