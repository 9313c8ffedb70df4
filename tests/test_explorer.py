"""Explorer: well-formed Turns with the right gate verdicts, teacher scoring, failures counted (never dropped), env
crashes, weight loads between rollouts, evaluation. Real TextWorld-Express where it matters, the tiny env elsewhere."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from divopd import gate
from divopd.explore.envs import EnvCrash
from divopd.explore.envs.tiny import TinyEnv
from divopd.explore.explorer import Explorer, ExplorerConfig
from divopd.learn.checkpoint import WeightHandle
from divopd.models.scoring import response_logprobs
from explorer_helpers import env_tokenizer, tiny_model


def make_explorer(env_name="tiny", teacher=True, **cfg):
    tok = env_tokenizer(env_name)
    cfg = {"env": env_name, "num_envs": 3, "max_steps": 6, "generation": {"max_new_tokens": 6}, **cfg}
    return Explorer(ExplorerConfig(**cfg), tiny_model(tok, 0), tok, tiny_model(tok, 1) if teacher else None, seed=0)


# ---------------------------------------------------------------------------- well-formed turns on the real env
def test_random_student_plays_twx_to_the_step_limit_with_right_gate_verdicts():
    max_steps = 8
    with make_explorer("twx", max_steps=max_steps, prompt={"max_prompt_tokens": 300}) as explorer:
        rollouts = explorer.collect(4)
        tok, student, teacher = explorer.tokenizer, explorer.student, explorer.teacher
    ids = [r.info.rollout_id for r in rollouts]
    assert len(set(ids)) == 4
    saw_truncated = saw_valid = 0
    for r in rollouts:
        info = r.info
        assert info.env == "twx" and info.task.startswith("train:") and info.teacher_turns == 0
        assert info.horizon == max_steps and info.hit_step_limit and not info.success  # random init
        assert [t.turn_index for t in r.turns] == list(range(max_steps))
        flags = [t.prompt_truncated for t in r.turns]
        assert flags == sorted(flags)  # once the history outgrows the budget, every later prompt is truncated
        assert not flags[0] and flags[-1]  # early turns fit, late turns of a long rollout do not
        assert info.truncated_turns == sum(flags)
        for t in r.turns:
            assert t.rollout_id == info.rollout_id and t.policy_version == 0
            assert t.prompt_len <= 300 and 1 <= t.response_len <= 6
            assert len(t.student_logprobs) == len(t.teacher_logprobs) == t.response_len
            assert np.isfinite(t.teacher_logprobs).all() and np.isfinite(t.student_logprobs).all()
            assert t.info["success"] is False and t.info["horizon"] == max_steps
            expected = "prompt_truncated" if t.prompt_truncated else None
            assert gate.check(t) == expected
            # truncated_turns_dead (default): the teacher never saw a truncated turn's real context, so the turn is
            # a dead row (no valid token) for a reader without the gate; every other turn keeps all its tokens
            assert t.n_valid == (0 if t.prompt_truncated else t.response_len)
            saw_truncated += t.prompt_truncated
            saw_valid += not t.prompt_truncated
    assert saw_truncated and saw_valid
    # stored logprobs are the generating student's and the teacher's, recomputed independently
    turns = [t for r in rollouts for t in r.turns][:6]
    prompts, responses = [t.prompt_ids.tolist() for t in turns], [t.response_ids.tolist() for t in turns]
    for t, s, te in zip(turns, response_logprobs(student, prompts, responses),
                        response_logprobs(teacher, prompts, responses), strict=True):
        np.testing.assert_allclose(t.student_logprobs, s, atol=1e-4)
        np.testing.assert_allclose(t.teacher_logprobs, te, atol=1e-4)
        assert tok.decode(t.response_ids, skip_special_tokens=True).strip().startswith(t.info["action"])


def test_truncated_turns_keep_their_teacher_scores_when_not_dead():
    with make_explorer("twx", max_steps=8, prompt={"max_prompt_tokens": 300}, truncated_turns_dead=False) as explorer:
        turns = [t for r in explorer.collect(2) for t in r.turns]
    truncated = [t for t in turns if t.prompt_truncated]
    assert truncated and all(t.n_valid == t.response_len for t in truncated)
    assert all(gate.check(t) == "prompt_truncated" for t in truncated)  # the gate rejects them either way


def test_collect_carries_in_flight_rollouts_over_and_ids_never_repeat():
    with make_explorer() as explorer:
        # the random student runs all 3 instances to the step limit together: 3 rollouts end in one round, and a
        # rollout is scored and counted only when collect takes it (the other two wait in the stream)
        (one,) = explorer.collect(1)
        assert explorer.stats()["explorer/rollouts"] == 1 and one.info.hit_step_limit
        first, second = [one, *explorer.collect(2)], explorer.collect(3)
        stats = explorer.stats()
    ids = [r.info.rollout_id for r in first + second]
    assert len(set(ids)) == 6
    assert stats["explorer/rollouts"] == 6 and stats["explorer/turns"] == sum(len(r.turns) for r in first + second)


def test_same_seed_same_rollouts():
    def actions(explorer):
        with explorer:
            return [[t.info["action"] for t in r.turns] for r in explorer.collect(3)]

    assert actions(make_explorer()) == actions(make_explorer())


def test_topk_teacher_scores_are_attached():
    with make_explorer(teacher_topk=3) as explorer:
        (r,) = explorer.collect(1)
    t = r.turns[0]
    assert t.teacher_topk_ids.shape == (t.response_len, 3) and t.teacher_topk_logprobs.shape == (t.response_len, 3)
    np.testing.assert_allclose(t.teacher_topk_logprobs[:, 0], t.teacher_topk_logprobs.max(axis=1))


def _rounds(mode: str, n: int = 14):
    with make_explorer(enqueue=mode, teacher_topk=2) as explorer:
        return [explorer.step_round() for _ in range(n)], explorer.stats()


def test_turn_enqueue_queues_every_round_the_same_turns_rollout_enqueue_queues_at_the_end():
    by_turn, turn_stats = _rounds("turn")
    by_rollout, rollout_stats = _rounds("rollout")
    # each round queues exactly the round's student turns: one per env stepped (no +R: the student takes every step)
    assert all(sum(len(c.turns) for c in chunks) == steps for chunks, steps in by_turn)
    assert [steps for _, steps in by_turn] == [steps for _, steps in by_rollout]
    pieces: dict[str, list] = {}
    for chunks, _ in by_turn:
        for chunk in chunks:
            pieces.setdefault(chunk.info.rollout_id, []).append(chunk)
    finished = {r.info.rollout_id: r for chunks, _ in by_rollout for r in chunks}
    assert finished and set(finished) <= set(pieces)
    for rid, chunks in pieces.items():
        *running, last = chunks
        # a chunk of a running rollout: partial, outcome unknown; the last one carries the rollout's outcome
        assert all(c.info.partial and all(t.info["success"] is None for t in c.turns) for c in running)
        ended = not last.info.partial
        assert ended == (rid in finished)
        if not ended:
            continue
        assert all(t.info["success"] is last.info.success for t in last.turns)
        whole = finished[rid]
        assert replace(last.info, weight_load_s=0.0) == replace(whole.info, weight_load_s=0.0)
        turns = [t for c in chunks for t in c.turns]
        assert [(t.turn_index, t.policy_version, t.info["action"]) for t in turns] == \
            [(t.turn_index, t.policy_version, t.info["action"]) for t in whole.turns]
        for a, b in zip(turns, whole.turns, strict=True):
            np.testing.assert_array_equal(a.response_ids, b.response_ids)
            np.testing.assert_array_equal(a.student_logprobs, b.student_logprobs)
            # scored in another batch (the round's turns of all envs together): the same scores up to float noise
            np.testing.assert_allclose(a.teacher_logprobs, b.teacher_logprobs, atol=1e-5)
            np.testing.assert_allclose(a.teacher_topk_logprobs, b.teacher_topk_logprobs, atol=1e-5)
    # a rollout is counted once, when it ends; every queued turn is counted by then
    assert turn_stats["explorer/rollouts"] == rollout_stats["explorer/rollouts"] == len(finished)
    assert turn_stats["explorer/turns"] == rollout_stats["explorer/turns"]


# ---------------------------------------------------------------------------- failures are counted, never dropped
class BrokenTeacher(torch.nn.Module):
    """A teacher whose forward fails: always, or only for batches of more than one sequence."""

    def __init__(self, model, only_batches: bool = False):
        super().__init__()
        self.model, self.only_batches = model, only_batches

    def forward(self, input_ids=None, **kw):
        rows = int(kw["cu_seq_lens_q"].numel() - 1) if "cu_seq_lens_q" in kw else input_ids.shape[0]
        if not self.only_batches or rows > 1:
            raise RuntimeError("teacher out of memory")
        return self.model(input_ids=input_ids, **kw)


@pytest.mark.parametrize("only_batches", [False, True])
def test_teacher_failure_marks_turns_unscored_and_counts_it(only_batches):
    tok = env_tokenizer("tiny")
    teacher = BrokenTeacher(tiny_model(tok, 1), only_batches)
    cfg = ExplorerConfig(env="tiny", num_envs=2, max_steps=4, generation={"max_new_tokens": 4},
                         teacher_max_tokens_per_batch=1)  # one sequence per forward: the batch path is per-row
    if only_batches:
        cfg.teacher_max_tokens_per_batch = 100_000  # whole rollout in one forward: fails, then per-turn retry works
    with Explorer(cfg, tiny_model(tok, 0), tok, teacher) as explorer:
        rollouts = explorer.collect(2)
        stats = explorer.stats()
    turns = [t for r in rollouts for t in r.turns]
    assert len(turns) == sum(r.info.student_turns for r in rollouts) == sum(r.info.horizon for r in rollouts)
    assert stats["explorer/teacher_failures"] == 2
    if only_batches:
        assert all(t.teacher_logprobs is not None for t in turns) and stats["explorer/unscored_turns"] == 0
    else:
        assert all(t.teacher_logprobs is None and gate.check(t) == "missing_teacher" for t in turns)
        assert stats["explorer/unscored_turns"] == len(turns) == sum(r.info.unscored_turns for r in rollouts)


def test_without_a_teacher_turns_are_unscored_not_lost():
    with make_explorer(teacher=False) as explorer:
        (r,) = explorer.collect(1)
    assert r.turns and all(gate.check(t) == "missing_teacher" for t in r.turns)


def test_env_crash_ends_the_rollout_and_a_fresh_instance_takes_over():
    made = []

    def factory():
        made.append(TinyEnv(crash_prob=0.25, seed=len(made)))
        return made[-1]

    tok = env_tokenizer("tiny")
    cfg = ExplorerConfig(env="tiny", num_envs=2, max_steps=6, generation={"max_new_tokens": 4})
    with Explorer(cfg, tiny_model(tok, 0), tok, tiny_model(tok, 1), env_factory=factory) as explorer:
        rollouts = explorer.collect(8)
        stats = explorer.stats()
    crashed = [r for r in rollouts if r.info.crashed]
    assert crashed and stats["explorer/env_crashes"] >= len(crashed)
    assert len(made) == 2 + stats["explorer/env_crashes"]  # every crash replaced its instance
    assert all(m.closed for m in made[:-2])  # ... and closed the broken one
    for r in crashed:
        # the turn whose step crashed is kept (its response and scores are real), the rollout is not a success
        assert not r.info.success and not r.info.hit_step_limit and len(r.turns) == r.info.horizon + 1


@pytest.mark.parametrize("load_weights", ["rollout", "batch"])
def test_batch_weight_loading_keeps_one_policy_version_per_rollout(load_weights: str) -> None:
    """Crashes at different steps desynchronise the instances' episodes. ``rollout`` loads a new version whenever one
    rollout ends, so rollouts still running mix versions; ``batch`` loads it only once every instance's rollout has
    ended: one version per rollout, and the whole batch of rollouts after it starts on the new version."""
    made: list[TinyEnv] = []

    def factory() -> TinyEnv:
        made.append(TinyEnv(crash_prob=0.2, seed=len(made)))
        return made[-1]

    tok = env_tokenizer("tiny")
    cfg = ExplorerConfig(env="tiny", num_envs=3, max_steps=6, generation={"max_new_tokens": 4},
                         load_weights=load_weights)
    other = tiny_model(tok, 7).state_dict()
    rollouts = []
    with Explorer(cfg, tiny_model(tok, 0), tok, tiny_model(tok, 1), env_factory=factory) as explorer:
        for version in range(1, 13):
            explorer.set_weights(WeightHandle(version=version, state_dict={k: v.clone() for k, v in other.items()}))
            for _ in range(2):
                rollouts += explorer.step_round()[0]
    assert any(r.info.crashed for r in rollouts)
    versions = [{t.policy_version for t in r.turns} for r in rollouts]
    if load_weights == "rollout":
        assert any(len(v) > 1 for v in versions)
    else:
        assert all(len(v) == 1 for v in versions)
        starts = [min(v) for v in versions]
        assert len(set(starts)) > 1  # newer versions were loaded, between batches
        assert explorer.stats()["explorer/weight_loads"] < len(rollouts)


def test_env_that_never_starts_fails_loudly():
    class Dead(TinyEnv):
        def reset(self, task):
            raise EnvCrash("dead")

    tok = env_tokenizer("tiny")
    cfg = ExplorerConfig(env="tiny", num_envs=1, max_env_restarts=2)
    with Explorer(cfg, tiny_model(tok, 0), tok, env_factory=Dead) as explorer:
        with pytest.raises(RuntimeError, match="crashed on 3 consecutive starts"):
            explorer.collect(1)


# ---------------------------------------------------------------------------- weights and evaluation
def test_newer_weights_are_loaded_between_rollouts_and_recorded_per_turn():
    tok = env_tokenizer("tiny")
    other = tiny_model(tok, 7)
    with make_explorer() as explorer:
        before = explorer.collect(2)
        explorer.set_weights(WeightHandle(version=3, state_dict={k: v.clone() for k, v in other.state_dict().items()}))
        explorer.set_weights(WeightHandle(version=2, state_dict=None))  # older than the pending one: ignored
        after = explorer.collect(6)
        assert explorer.policy_version == 3 and explorer.stats()["explorer/weight_loads"] == 1
        for name, p in explorer.student.state_dict().items():
            assert torch.equal(p, other.state_dict()[name])
    assert all(t.policy_version == 0 for r in before for t in r.turns)
    versions = [t.policy_version for r in after for t in r.turns]
    assert set(versions) <= {0, 3} and versions[-1] == 3
    # rollouts started after the load are generated by version 3 only
    assert any(r.info.policy_version_min == 3 for r in after)


def test_evaluate_is_greedy_student_only_and_repeatable():
    with make_explorer(teacher=True, recovery={"enabled": True, "patience": 1, "max_takeover": 1}) as explorer:
        a = explorer.evaluate(num_tasks=4)
        b = explorer.evaluate(tasks=explorer._eval_envs[0].tasks("dev")[:4])
        assert explorer.stats()["explorer/teacher_turns"] == 0
    assert a["eval/episodes"] == 4 and 0.0 <= a["eval/success_rate"] <= 1.0
    assert {k: v for k, v in a.items() if k != "eval/seconds"} == {k: v for k, v in b.items() if k != "eval/seconds"}


def test_evaluate_starts_one_instance_per_task_up_to_num_envs_and_keeps_them():
    """Two held-out tasks with num_envs = 3: two evaluation instances (each twx one is a JVM), not three; a later
    evaluation of more tasks adds the third and reuses the first two."""
    with make_explorer(num_envs=3) as explorer:
        two = explorer.evaluate(num_tasks=2)
        first = list(explorer._eval_envs)
        assert len(first) == 2 and two["eval/episodes"] == 2
        dev = explorer._eval_envs[0].tasks("dev")
        six = explorer.evaluate(tasks=dev[:6])
        assert len(explorer._eval_envs) == 3 and explorer._eval_envs[:2] == first and six["eval/episodes"] == 6
        again = explorer.evaluate(num_tasks=2)
        assert len(explorer._eval_envs) == 3
    assert {k: v for k, v in two.items() if k != "eval/seconds"} == {k: v for k, v in again.items()
                                                                      if k != "eval/seconds"}


def test_evaluate_counts_a_gold_playing_student_as_successful():
    """An oracle 'student' that always emits the gold action wins every held-out task: evaluate can measure success."""
    tok = env_tokenizer("tiny")

    class GoldGenerator:
        def __init__(self, explorer):
            self.explorer = explorer

        def generate(self, prompts, **kw):
            from divopd.explore.generation import Generation
            from divopd.explore.prompting import encode_action

            out = []
            for ids in prompts:
                text = tok.decode(ids)
                room = int(text.split("coin in room ")[1].split(".")[0])
                here = int(text.rsplit("You are in room ", 1)[1].split(".")[0])
                action = "take coin" if room == here else ("move east" if room > here else "move west")
                resp = encode_action(tok, action)
                out.append(Generation(resp, np.zeros(len(resp), np.float32), True))
            return out

    with make_explorer(teacher=False, max_steps=10) as explorer:
        explorer._student_gen = GoldGenerator(explorer)
        result = explorer.evaluate(num_tasks=10)
    assert result["eval/success_rate"] == 1.0 and result["eval/mean_score"] == 1.0


def test_a_teacher_with_another_vocabulary_is_bridged_and_refused_only_with_a_top_k():
    """Another vocabulary makes a cross-tokenizer teacher (tests/test_teacher_vocab.py); a top-k needs a
    shared one."""
    from divopd.explore.vocab_align import CrossTokenizerTeacher

    tok = env_tokenizer("tiny")
    other_tok = env_tokenizer("twx")
    explorer = Explorer(ExplorerConfig(env="tiny"), tiny_model(tok, 0), tok, tiny_model(other_tok, 1), other_tok)
    assert isinstance(explorer._teacher, CrossTokenizerTeacher) and explorer.teacher_tokenizer is tok
    with pytest.raises(ValueError, match="teacher_topk needs"):
        Explorer(ExplorerConfig(env="tiny", teacher_topk=4), tiny_model(tok, 0), tok, tiny_model(other_tok, 1),
                 other_tok)


# ---------------------------------------------------------------------------- generation backend
def test_generator_stops_at_newline_or_eos_and_seeds_without_touching_the_global_rng():
    from divopd.explore.generation import HFGenerator

    tok = env_tokenizer("tiny")
    gen = HFGenerator(tiny_model(tok, 0), tok)
    newline_ids = [i for i in gen.stop_ids if i != tok.eos_token_id]
    assert newline_ids and all("\n" in tok.decode([i]) for i in newline_ids)
    prompts = [tok("You are in room 2 .", add_special_tokens=False)["input_ids"], [tok.eos_token_id]]
    state = torch.random.get_rng_state()
    a = gen.generate(prompts, greedy=False, temperature=1.0, max_new_tokens=12, seed=5)
    assert torch.equal(state, torch.random.get_rng_state())
    b = gen.generate(prompts, greedy=False, temperature=1.0, max_new_tokens=12, seed=5)
    assert [g.response_ids for g in a] == [g.response_ids for g in b]
    for g in a + gen.generate(prompts, greedy=True, max_new_tokens=12):
        stops = [i for i, t in enumerate(g.response_ids) if t in gen.stop_ids]
        assert stops == ([len(g.response_ids) - 1] if g.stopped else [])  # cut right after the first stop token
        assert len(g.logprobs) == len(g.response_ids) and (g.logprobs <= 0).all()
    with pytest.raises(ValueError, match="empty prompt"):
        gen.generate([[]])
