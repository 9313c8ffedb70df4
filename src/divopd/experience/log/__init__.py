"""Experience logs: every student turn as it entered the queue, one Parquet row per turn in arrival order (columns:
:data:`SCHEMA`, docs/reference/experience-log.md), so every selection rule can be replayed over the same experience
(``divopd replay``, Appendix Table 11). A log is one ``.parquet`` file or a directory of ``part-*.parquet`` files."""

from __future__ import annotations

from divopd.experience.log.parts import compact_parts as compact_parts
from divopd.experience.log.parts import first_arrival_at_update, log_files, requeue_at_update, truncate_log
from divopd.experience.log.parts import part_files as part_files
from divopd.experience.log.parts import set_aside_unreadable_parts as set_aside_unreadable_parts
from divopd.experience.log.reader import iter_record_batches, read_log, row_to_turn
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

__all__ = ["SCHEMA", "REQUIRED_COLUMNS", "OPTIONAL_COLUMNS", "ExperienceLogError", "ExperienceLogWriter", "LoggedTurn",
           "first_arrival_at_update", "iter_record_batches", "log_files", "read_log", "row_to_turn",
           "requeue_at_update", "truncate_log", "turn_to_row", "validate_batch", "validate_schema", "write_log"]
