"""Prompt builder: chat layout, context budget (most recent history kept, truncation flagged), action encoding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from divopd.explore.prompting import (
    PromptConfig,
    build_messages,
    decode_action,
    encode_action,
    encode_prompt,
    render_ids,
)
from explorer_helpers import env_tokenizer

FIRST = "Your task is to take the coin in room 3.\nYou are in room 0."
HISTORY = [("move east", f"You are in room {i}.") for i in range(1, 4)] + [("take coin", "You take the coin.")]


@pytest.fixture(scope="module")
def tok():
    return env_tokenizer("tiny")


def test_messages_alternate_and_valid_actions_go_on_the_last_observation():
    msgs = build_messages(PromptConfig(), FIRST, HISTORY[:2], ["look around", "move east"])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[1]["content"] == FIRST and msgs[2]["content"] == "move east"
    assert msgs[-1]["content"].endswith("Valid actions: look around, move east")
    assert "Valid actions" not in msgs[3]["content"]
    no_sys = build_messages(PromptConfig(system="", include_valid_actions=False), FIRST, [], ["x"])
    assert no_sys == [{"role": "user", "content": FIRST}]


def test_whole_history_fits_untruncated(tok):
    enc = encode_prompt(tok, PromptConfig(max_prompt_tokens=4096), FIRST, HISTORY)
    assert not enc.truncated and enc.history_kept == enc.history_total == 4
    assert enc.ids == render_ids(tok, build_messages(PromptConfig(), FIRST, HISTORY))


def test_small_budget_keeps_the_most_recent_history_that_fits_and_flags_it(tok):
    full = encode_prompt(tok, PromptConfig(max_prompt_tokens=4096), FIRST, HISTORY)
    budget = len(full.ids) - 5
    cfg = PromptConfig(max_prompt_tokens=budget)
    enc = encode_prompt(tok, cfg, FIRST, HISTORY)
    assert enc.truncated and 1 <= enc.history_kept < 4 and len(enc.ids) <= budget
    # exactly the last `history_kept` pairs, and one more pair would not fit
    assert enc.ids == render_ids(tok, build_messages(cfg, FIRST, HISTORY[-enc.history_kept:]))
    more = render_ids(tok, build_messages(cfg, FIRST, HISTORY[-enc.history_kept - 1:]))
    assert len(more) > budget
    assert "You take the coin." in tok.decode(enc.ids) and FIRST.split("\n")[0] in tok.decode(enc.ids)


def test_dropping_history_as_a_window_is_not_flagged(tok):
    full = encode_prompt(tok, PromptConfig(max_prompt_tokens=4096), FIRST, HISTORY)
    enc = encode_prompt(tok, PromptConfig(max_prompt_tokens=len(full.ids) - 5, flag_dropped_history=False), FIRST,
                        HISTORY)
    assert not enc.truncated and enc.history_kept < 4


def test_budget_below_task_plus_last_pair_cuts_tokens_and_flags(tok):
    for flag in (True, False):
        enc = encode_prompt(tok, PromptConfig(max_prompt_tokens=10, flag_dropped_history=flag), FIRST, HISTORY)
        assert enc.truncated and len(enc.ids) == 10


def test_history_window_and_short_past_observations(tok):
    enc = encode_prompt(tok, PromptConfig(history_window=2), FIRST, HISTORY)
    assert not enc.truncated and enc.history_kept == 2 and enc.history_total == 4
    assert "room 2" not in tok.decode(enc.ids)
    msgs = build_messages(PromptConfig(past_observation_max_words=2), FIRST, HISTORY)
    assert msgs[3]["content"] == "You are ..." and msgs[-1]["content"] == "You take the coin."
    assert msgs[1]["content"] == FIRST


@settings(max_examples=40, deadline=None)
@given(n_hist=st.integers(0, 6), budget=st.integers(8, 200), flag=st.booleans())
def test_prompt_never_exceeds_budget_and_flags_exactly_when_content_is_lost(n_hist, budget, flag):
    tok = env_tokenizer("tiny")
    hist = (HISTORY * 2)[:n_hist]
    cfg = PromptConfig(max_prompt_tokens=budget, flag_dropped_history=flag)
    enc = encode_prompt(tok, cfg, FIRST, hist)
    full = render_ids(tok, build_messages(cfg, FIRST, hist))
    assert len(enc.ids) <= budget
    if len(full) <= budget:
        assert enc.ids == full and not enc.truncated
    elif flag:
        assert enc.truncated
    else:
        assert enc.truncated == (enc.history_kept <= 1 and len(render_ids(
            tok, build_messages(cfg, FIRST, hist[-1:] if hist else []))) > budget)


def test_action_encoding_round_trip(tok):
    ids = encode_action(tok, "move east")
    assert ids[-1] == tok.eos_token_id and decode_action(tok, ids) == "move east"
    assert decode_action(tok, tok("take coin\nmove east", add_special_tokens=False)["input_ids"]) == "take coin"
    assert decode_action(tok, [tok.eos_token_id]) == ""


def test_tokenizer_without_chat_template_gets_a_plain_rendering(tok):
    import copy

    plain = copy.deepcopy(tok)
    plain.chat_template = None
    ids = render_ids(plain, [{"role": "user", "content": "move east"}])
    assert ids == plain("user: move east\nassistant: ", add_special_tokens=False)["input_ids"]
