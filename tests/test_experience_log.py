"""Experience log: exact round trips, directory appends, optional columns, and malformed logs rejected by name."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from divopd import Turn
from divopd.experience.log import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    SCHEMA,
    ExperienceLogError,
    ExperienceLogWriter,
    read_log,
    row_to_turn,
    rows_to_batch,
    turn_to_row,
    validate_schema,
    write_log,
)


def make_turn(rid: str = "r0", t: int = 0, version: int = 0, n: int = 3, **kw) -> Turn:
    defaults = dict(
        prompt_ids=list(range(5)),
        response_ids=list(range(100, 100 + n)),
        student_logprobs=[-0.5] * n,
        teacher_logprobs=[-1.0] * n,
    )
    defaults.update(kw)
    return Turn(rid, t, version, **defaults)


def same_array(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def assert_same_turn(a: Turn, b: Turn, ids: bool = True) -> None:
    assert (a.rollout_id, a.turn_index, a.policy_version, a.prompt_truncated) == (
        b.rollout_id,
        b.turn_index,
        b.policy_version,
        b.prompt_truncated,
    )
    assert (a.prompt_len, a.response_len) == (b.prompt_len, b.response_len)
    for name in ("action_mask", "student_logprobs", "teacher_logprobs", "teacher_valid_mask"):
        assert same_array(getattr(a, name), getattr(b, name)), name
    if ids:
        assert same_array(a.prompt_ids, b.prompt_ids) and same_array(a.response_ids, b.response_ids)
    assert a.n_valid == b.n_valid
    assert a.disagreement == pytest.approx(b.disagreement, nan_ok=True)


EDGE_TURNS = [
    make_turn("a", 0, 0, action_mask=[True, False, True], teacher_logprobs=[-1.0, float("nan"), -2.0]),
    make_turn("a", 1, 2, teacher_logprobs=None, prompt_truncated=True, info={"env": "alfworld", "success": False}),
    make_turn("b", 0, 1, n=0, student_logprobs=[], teacher_logprobs=[], prompt_ids=[]),
    make_turn("b", 1, 1, student_logprobs=None, teacher_valid_mask=[False, True, True], info={"teacher_acted": True}),
    make_turn("c", 7, 9, n=4, info={"success": True}),
]


def test_length_mismatched_turn_is_logged_as_invalid(tmp_path):
    from divopd import gate

    bad = [
        make_turn("m", 0, n=4, teacher_logprobs=[-1.0, -2.0]),
        make_turn("m", 1, n=3, action_mask=[True]),
        make_turn("m", 2, n=3, teacher_topk_ids=np.zeros((2, 4)), teacher_topk_logprobs=np.zeros((2, 4))),
    ]
    assert all(gate.check(t) == "length_mismatch" for t in bad)
    write_log(tmp_path / "m.parquet", [(t, i, 0) for i, t in enumerate(bad)])
    back = [b.turn for b in read_log(tmp_path / "m.parquet")]
    assert [gate.check(t) for t in back] == ["missing_teacher"] * 3
    assert back[1].action_mask is None and back[1].student_logprobs is not None


def test_schema_is_exactly_the_issue_columns_and_types():
    expected = {
        "rollout_id": pa.string(),
        "turn_index": pa.int32(),
        "policy_version": pa.int64(),
        "arrival": pa.int64(),
        "arrival_update": pa.int64(),
        "prompt_truncated": pa.bool_(),
        "prompt_len": pa.int32(),
        "response_len": pa.int32(),
        "action_mask": pa.list_(pa.bool_()),
        "student_logprobs": pa.list_(pa.float32()),
        "teacher_logprobs": pa.list_(pa.float32()),
        "teacher_valid_mask": pa.list_(pa.bool_()),
        "prompt_ids": pa.list_(pa.int32()),
        "response_ids": pa.list_(pa.int32()),
        "success": pa.bool_(),
        "env": pa.string(),
        "teacher_acted": pa.bool_(),
        "task": pa.string(),  # optional, added for divopd-focus's task groups
    }
    assert {f.name: f.type for f in SCHEMA} == expected
    assert set(OPTIONAL_COLUMNS) == {"prompt_ids", "response_ids", "success", "env", "teacher_acted", "task"}
    assert set(REQUIRED_COLUMNS) | set(OPTIONAL_COLUMNS) == set(expected)


@pytest.mark.parametrize("write_ids", [True, False])
def test_round_trip_single_file(tmp_path, write_ids):
    path = tmp_path / "log.parquet"
    items = [(t, 10 + i, i // 2) for i, t in enumerate(EDGE_TURNS)]
    assert write_log(path, items, write_ids=write_ids) == len(items)
    back = list(read_log(path))
    assert [(b.arrival, b.arrival_update) for b in back] == [(a, u) for _, a, u in items]
    for (orig, _, _), b in zip(items, back, strict=True):
        assert_same_turn(orig, b.turn, ids=write_ids)
        if not write_ids:  # placeholder ids of the logged lengths
            assert not b.turn.prompt_ids.any() and not b.turn.response_ids.any()
    assert back[1].turn.info == {"env": "alfworld", "success": False, "teacher_acted": False}
    assert back[3].turn.info["teacher_acted"] is True
    assert math.isnan(back[0].turn.teacher_logprobs[1]) and back[1].turn.teacher_logprobs is None
    # the file itself carries the exact schema types
    schema = pq.read_schema(path)
    for name in schema.names:
        assert schema.field(name).type == SCHEMA.field(name).type
    assert ("prompt_ids" in schema.names) == write_ids


def test_turn_to_row_and_row_to_turn_round_trip():
    for i, turn in enumerate(EDGE_TURNS):
        row = turn_to_row(turn, arrival=i, arrival_update=0, write_ids=True)
        assert row["arrival"] == i and row["response_len"] == turn.response_len
        plain = rows_to_batch([row]).to_pylist()[0]
        assert_same_turn(turn, row_to_turn(plain))


def test_directory_log_appends_across_writers_and_rolls_parts(tmp_path):
    d = tmp_path / "experience"
    turns = [make_turn(f"r{i // 3}", i % 3, 0) for i in range(10)]
    with ExperienceLogWriter(d, rows_per_file=4, row_group_size=3) as w:  # each flush of 3 rows: a whole part
        arrivals = [w.append(t, arrival_update=0) for t in turns[:6]]
    assert arrivals == list(range(6))
    with ExperienceLogWriter(d, rows_per_file=3) as w:  # a resumed run continues numbering and arrivals
        assert w.next_arrival == 6
        w.extend(turns[6:], arrival_update=3)  # 4 rows, at most 3 a part: two parts
    parts = sorted(p.name for p in d.iterdir())
    assert parts == [f"part-00000{i}.parquet" for i in range(4)]
    assert [pq.read_metadata(d / p).num_rows for p in parts] == [3, 3, 3, 1]
    back = list(read_log(d, batch_size=3))
    assert [b.arrival for b in back] == list(range(10))
    assert [b.arrival_update for b in back] == [0] * 6 + [3] * 4
    assert [b.turn.key for b in back] == [t.key for t in turns]


def test_writer_rejects_out_of_order_arrivals_and_existing_file(tmp_path):
    with pytest.raises(ExperienceLogError, match="'arrival'.*strictly increasing"):
        with ExperienceLogWriter(tmp_path / "a.parquet") as w:
            w.append(make_turn(), 0, arrival=5)
            w.append(make_turn(t=1), 0, arrival=5)
            w.flush()
    with pytest.raises(ExperienceLogError, match="'arrival_update'.*must not decrease"):
        with ExperienceLogWriter(tmp_path / "b") as w:
            w.append(make_turn(), 3)
            w.append(make_turn(t=1), 2)
    write_log(tmp_path / "c.parquet", [make_turn()])
    with pytest.raises(FileExistsError):
        ExperienceLogWriter(tmp_path / "c.parquet")
    write_log(tmp_path / "c.parquet", [make_turn(), make_turn(t=1)], overwrite=True)
    assert len(list(read_log(tmp_path / "c.parquet"))) == 2


def test_empty_log_is_readable(tmp_path):
    ExperienceLogWriter(tmp_path / "e.parquet").close()
    validate_schema(pq.read_schema(tmp_path / "e.parquet"))
    assert list(read_log(tmp_path / "e.parquet")) == []


def test_reader_accepts_logs_without_optional_columns_and_wider_types(tmp_path):
    rows = [turn_to_row(t, i, 0, write_ids=True) for i, t in enumerate(EDGE_TURNS[:2])]
    table = pa.Table.from_batches([rows_to_batch(rows)])
    table = table.drop_columns(list(OPTIONAL_COLUMNS))
    # a writer that used int64 everywhere and float64 log probs (e.g. pandas) is accepted and cast
    table = table.set_column(
        table.schema.get_field_index("turn_index"), "turn_index", table["turn_index"].cast(pa.int64())
    )
    idx = table.schema.get_field_index("student_logprobs")
    table = table.set_column(idx, "student_logprobs", table["student_logprobs"].cast(pa.list_(pa.float64())))
    pq.write_table(table, tmp_path / "min.parquet")
    back = list(read_log(tmp_path / "min.parquet"))
    assert len(back) == 2
    assert_same_turn(EDGE_TURNS[0], back[0].turn, ids=False)
    assert back[0].turn.info == {}


# ---------------------------------------------------------------------------------------------------- malformed
def good_table() -> pa.Table:
    rows = [turn_to_row(make_turn(f"r{i}", 0, i), i, i) for i in range(4)]
    return pa.Table.from_batches([rows_to_batch(rows)])


def replace_column(table: pa.Table, name: str, array: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, array)


def malformed(name: str) -> pa.Table:
    t = good_table()
    if name == "missing column":
        return t.drop_columns(["policy_version"])
    if name == "wrong type":
        return replace_column(t, "turn_index", pa.array(["0", "0", "0", "0"]))
    if name == "wrong list type":
        return replace_column(t, "teacher_logprobs", pa.array([["x"]] * 4, type=pa.list_(pa.string())))
    if name == "list length":
        return replace_column(t, "student_logprobs", pa.array([[-1.0] * 3, [-1.0] * 3, [-1.0] * 2, [-1.0] * 3]))
    if name == "negative version":
        return replace_column(t, "policy_version", pa.array([0, 1, -1, 3], type=pa.int64()))
    if name == "null required":
        return replace_column(t, "prompt_truncated", pa.array([False, None, False, False]))
    if name == "arrival order":
        return replace_column(t, "arrival", pa.array([0, 2, 1, 3], type=pa.int64()))
    if name == "arrival_update order":
        return replace_column(t, "arrival_update", pa.array([0, 2, 1, 3], type=pa.int64()))
    if name == "empty rollout id":
        return replace_column(t, "rollout_id", pa.array(["r0", "", "r2", "r3"]))
    if name == "null in mask":
        return replace_column(
            t, "action_mask", pa.array([None, None, [True, None, True], None], type=pa.list_(pa.bool_()))
        )
    raise AssertionError(name)


MALFORMED = {
    "missing column": r"missing required column\(s\) 'policy_version'",
    "wrong type": r"column 'turn_index' has type string, expected int32",
    "wrong list type": r"column 'teacher_logprobs' has type list<string>, expected list<float32>",
    "list length": r"column 'student_logprobs', row 0: list length 3 != response_len 3|"
    r"column 'student_logprobs', row 2: list length 2 != response_len 3",
    "negative version": r"column 'policy_version', row 2: negative value -1",
    "null required": r"column 'prompt_truncated', row 1: null value",
    "arrival order": r"column 'arrival', row 2: arrival 1 after 2",
    "arrival_update order": r"column 'arrival_update', row 2: arrival_update 1 after 2",
    "empty rollout id": r"column 'rollout_id', row 1: empty rollout id",
    "null in mask": r"column 'action_mask', row 2: null inside a list",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_logs_are_rejected_naming_the_column(tmp_path, case):
    path = tmp_path / "bad.parquet"
    pq.write_table(malformed(case), path)
    with pytest.raises(ExperienceLogError, match=MALFORMED[case]) as info:
        list(read_log(path))
    assert str(path) in str(info.value)


def test_row_numbers_count_across_batches_and_files(tmp_path):
    d = tmp_path / "dir"
    d.mkdir()
    pq.write_table(good_table(), d / "part-000000.parquet")
    bad = replace_column(good_table(), "arrival", pa.array([4, 5, 6, 7], type=pa.int64()))
    bad = replace_column(bad, "arrival_update", pa.array([3, 3, 3, 3], type=pa.int64()))
    bad = replace_column(bad, "response_len", pa.array([3, 3, 3, 9], type=pa.int32()))
    pq.write_table(bad, d / "part-000001.parquet")
    with pytest.raises(ExperienceLogError, match=r"part-000001.parquet: column 'student_logprobs', row 7"):
        list(read_log(d, batch_size=2))


def test_not_a_log(tmp_path):
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ExperienceLogError, match="not a readable Parquet file"):
        list(read_log(tmp_path / "junk.parquet"))
    with pytest.raises(ExperienceLogError, match="no such experience log"):
        list(read_log(tmp_path / "missing.parquet"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExperienceLogError, match="no part-"):
        list(read_log(tmp_path / "empty"))


def test_reader_streams_lazily(tmp_path):
    """The reader is a generator over record batches: a bad row late in the log is not touched by reading early rows."""
    path = tmp_path / "log.parquet"
    t = good_table()
    t = replace_column(t, "policy_version", pa.array([0, 1, 2, -5], type=pa.int64()))
    pq.write_table(t, path, row_group_size=2)
    it = read_log(path, batch_size=2)
    assert [next(it).arrival, next(it).arrival] == [0, 1]
    with pytest.raises(ExperienceLogError, match="row 3"):
        list(it)


# ---------------------------------------------------------------------------------------------------- property
finite = st.floats(-20, 0, allow_nan=False, width=32)
maybe_nan = st.one_of(finite, st.just(float("nan")))


@st.composite
def turns(draw):
    n = draw(st.integers(0, 6))
    lst = lambda el: draw(st.one_of(st.none(), st.lists(el, min_size=n, max_size=n)))  # noqa: E731
    return Turn(
        rollout_id=draw(st.text(min_size=1, max_size=5)),
        turn_index=draw(st.integers(0, 50)),
        policy_version=draw(st.integers(0, 2**40)),
        prompt_ids=draw(st.lists(st.integers(0, 2**31 - 1), max_size=5)),
        response_ids=draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n)),
        action_mask=lst(st.booleans()),
        student_logprobs=lst(finite),
        teacher_logprobs=lst(maybe_nan),
        teacher_valid_mask=lst(st.booleans()),
        prompt_truncated=draw(st.booleans()),
        info={
            "success": draw(st.one_of(st.none(), st.booleans())),
            "env": draw(st.one_of(st.none(), st.text(max_size=4))),
        },
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(turns(), max_size=8))
def test_property_round_trip(tmp_path, ts):
    path = tmp_path / "p.parquet"
    write_log(path, [(t, i, 0) for i, t in enumerate(ts)], write_ids=True, overwrite=True)
    back = list(read_log(path, batch_size=3))
    assert len(back) == len(ts)
    for a, b in zip(ts, back, strict=True):
        assert_same_turn(a, b.turn)
        assert {k: v for k, v in a.info.items() if v is not None} == {
            k: v for k, v in b.turn.info.items() if k != "teacher_acted"
        }


def test_resume_truncates_rows_after_the_checkpoint_and_crashed_parts(tmp_path):
    d = tmp_path / "experience"
    with ExperienceLogWriter(d, rows_per_file=3) as w:
        for i in range(8):
            w.append(make_turn(f"r{i}"), arrival_update=i // 2)
    (d / "part-000003.parquet").write_bytes(b"PAR1 crashed before the footer")
    with pytest.raises(ExperienceLogError, match="unreadable part.*truncate_from"):
        ExperienceLogWriter(d)
    # the checkpoint restored a sampler whose next arrival is 5: rows 5..7 were logged after it
    with ExperienceLogWriter(d, truncate_from=5) as w:
        assert w.next_arrival == 5
        w.append(make_turn("again"), arrival_update=2)
    back = list(read_log(d))
    assert [b.arrival for b in back] == [0, 1, 2, 3, 4, 5]
    assert back[-1].turn.rollout_id == "again"
    assert (d / "part-000003.parquet.unreadable").exists()


def test_requeued_rows_are_logged_at_the_checkpoints_update_and_new_rows_follow_them(tmp_path):
    from divopd.experience.log import requeue_at_update

    d = tmp_path / "experience"
    with ExperienceLogWriter(d, rows_per_file=3) as w:
        for i in range(8):
            w.append(make_turn(f"r{i}"), arrival_update=i // 2)  # updates 0 0 1 1 2 2 3 3
    # resumed at update 1 with arrivals 3.. queued again: 3 stays at 1, 4..7 arrived at 1 in the resumed run
    assert requeue_at_update(d, first_arrival=3, update=1) == 4
    assert requeue_at_update(d, first_arrival=3, update=1) == 0
    with ExperienceLogWriter(d) as w:
        w.append(make_turn("next"), arrival_update=1)
    back = list(read_log(d))
    assert [b.arrival_update for b in back] == [0, 0, 1, 1, 1, 1, 1, 1, 1]
    assert [b.turn.rollout_id for b in back] == [f"r{i}" for i in range(8)] + ["next"]
    assert pq.read_schema(d / "part-000001.parquet") == pq.read_schema(d / "part-000000.parquet")


def test_require_ids_rejects_logs_without_token_ids(tmp_path):
    write_log(tmp_path / "no-ids.parquet", [make_turn()])
    assert len(list(read_log(tmp_path / "no-ids.parquet"))) == 1  # fine for replay
    with pytest.raises(ExperienceLogError, match="'prompt_ids' is missing"):
        list(read_log(tmp_path / "no-ids.parquet", require_ids=True))
    write_log(tmp_path / "ids.parquet", [make_turn()], write_ids=True)
    (back,) = read_log(tmp_path / "ids.parquet", require_ids=True)
    assert back.turn.response_ids.tolist() == [100, 101, 102]


def test_the_task_survives_the_log_so_divopd_focus_groups_replay_and_resume_alike(tmp_path):
    """divopd-focus groups turns by ``info["task"]``: a turn read back from a log must keep it (and old logs without
    the column read back without it)."""
    from divopd.sampling import SamplerConfig, make_sampler

    turns = [Turn(rollout_id=f"r{r}", turn_index=t, policy_version=0, prompt_ids=[1, 2], response_ids=[3, 4],
                  student_logprobs=[-0.1 * t, -0.2], teacher_logprobs=[-0.5 - r, -1.0],
                  info={"task": f"T{r % 2}", "env": "tiny"}) for r in range(6) for t in range(3)]
    write_log(tmp_path / "t.parquet", [(t, i, 0) for i, t in enumerate(turns)])
    back = [b.turn for b in read_log(tmp_path / "t.parquet")]
    assert [t.info.get("task") for t in back] == [t.info["task"] for t in turns]

    def batch(ts):
        s = make_sampler(SamplerConfig("divopd-focus", batch_size=6, pool_factor=3, seed=3))
        s.add(ts)
        b = s.next_batch(0)
        return [t.key for t in b.payloads], b.row_weights

    assert batch(back) == batch(turns)
    old = pq.read_table(tmp_path / "t.parquet").drop(["task"])
    pq.write_table(old, tmp_path / "old.parquet")
    assert all("task" not in b.turn.info for b in read_log(tmp_path / "old.parquet"))
