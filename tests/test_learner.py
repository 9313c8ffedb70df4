"""Learner.step, its counters, checkpoints (kill-and-resume), weight publication, and the SFT helper."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from divopd import Turn
from divopd.learn.diagnostics import full_reverse_kl
from divopd.learn.learner import Learner, LearnerConfig
from divopd.learn.sft import train_sft
from divopd.models.scoring import response_logprobs
from divopd.models.tiny import build_model, build_tokenizer
from divopd.sampling import SamplerConfig, make_sampler

torch.set_num_threads(1)

WORDS = "go north south east west take open close the red blue apple fridge door key look inventory eat slice"
METRICS = ["learner/loss", "learner/reverse_kl", "learner/valid_tokens", "learner/dead_rows", "learner/grad_norm",
           "learner/tokens", "learner/tokens_total", "learner/compute_s", "learner/compute_s_total",
           "learner/version"]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer([WORDS], kind="word")


@pytest.fixture(scope="module")
def teacher(tok):
    model = build_model(tok, "0.2m", seed=100)
    with torch.no_grad():  # a peaked teacher, far from the near-uniform random student
        model.model.embed_tokens.weight.mul_(4.0)
    return model


def student(tok, seed=0):
    return build_model(tok, "0.2m", seed=seed)


def make_turns(tok, teacher, n=16, seed=0, resp_len=6, topk=0, version=0, n_rollouts=4):
    """Responses sampled from the seed-0 student (on-policy), scored by the teacher."""
    gen = student(tok)
    rng = np.random.default_rng(seed)
    v = len(tok)
    prompts = [rng.integers(6, v, size=int(rng.integers(3, 15))).tolist() for _ in range(n)]
    torch.manual_seed(seed)
    responses = []
    with torch.no_grad():
        for p in prompts:
            out = gen.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                               do_sample=True, max_new_tokens=resp_len, min_new_tokens=resp_len)
            responses.append(out[0, len(p):].tolist())
    s_lp = response_logprobs(gen, prompts, responses)
    t_sc = response_logprobs(teacher, prompts, responses, topk=max(topk, 1))
    turns = []
    for i, (p, r, s, t) in enumerate(zip(prompts, responses, s_lp, t_sc, strict=True)):
        extra = {"teacher_topk_ids": t.topk_ids, "teacher_topk_logprobs": t.topk_logprobs} if topk else {}
        turns.append(Turn(f"r{i % n_rollouts}", i // n_rollouts, version, p, r, student_logprobs=s,
                          teacher_logprobs=t.logprobs, **extra))
    return turns


@pytest.fixture(scope="module")
def turns(tok, teacher):
    return make_turns(tok, teacher, topk=8)


def params_equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_config_forbids_unknown_keys_and_documents_every_field():
    with pytest.raises(ValidationError):
        LearnerConfig(learning_rate=1e-3)
    with pytest.raises(ValidationError):
        LearnerConfig(estimator="full")
    for name, field in LearnerConfig.model_fields.items():
        assert field.description, name


@pytest.mark.parametrize("estimator", ["sampled", "topk"])
def test_one_step_lowers_reverse_kl_on_the_batch(tok, teacher, turns, estimator):
    learner = Learner(student(tok), LearnerConfig(lr=1e-3, estimator=estimator), tok)
    before = full_reverse_kl(learner.model, teacher, turns)
    m = learner.step(turns)
    after = full_reverse_kl(learner.model, teacher, turns)
    assert after < before - 1e-3, (before, after)
    assert set(METRICS) <= set(m) and all(math.isfinite(m[k]) for k in METRICS)
    assert m["learner/version"] == 1 and learner.version == 1
    assert m["learner/valid_tokens"] == sum(t.n_valid for t in turns) and m["learner/dead_rows"] == 0
    assert m["learner/tokens"] == sum(t.prompt_len + t.response_len for t in turns) == m["learner/tokens_total"]
    # the sampled-token estimate (mean of logπ_θold − logπ_T on valid tokens) uses the same positions
    assert m["learner/reverse_kl"] > 0
    m2 = learner.step(turns)
    assert m2["learner/version"] == 2 and m2["learner/tokens_total"] == 2 * m["learner/tokens"]
    assert m2["learner/compute_s_total"] == pytest.approx(m["learner/compute_s"] + m2["learner/compute_s"])


def test_layouts_microbatches_and_recompute_agree(tok, turns):
    ref = Learner(student(tok), LearnerConfig(lr=1e-3, packing="packed"), tok)
    m_ref = ref.step(turns)
    for cfg in (dict(packing="padded"), dict(micro_batch_tokens=60), dict(old_logprobs="recompute"),
                dict(micro_batch_tokens=60, reduction="token-mean")):
        other = Learner(student(tok), LearnerConfig(lr=1e-3, **cfg), tok)
        m = other.step(turns)
        if cfg.get("reduction") == "token-mean":
            single = Learner(student(tok), LearnerConfig(lr=1e-3, reduction="token-mean"), tok)
            single.step(turns)
            pairs = zip(other.model.parameters(), single.model.parameters(), strict=True)
        else:
            assert m["learner/loss"] == pytest.approx(m_ref["learner/loss"], rel=1e-4, abs=1e-6), cfg
            assert m["learner/grad_norm"] == pytest.approx(m_ref["learner/grad_norm"], rel=1e-4), cfg
            pairs = zip(other.model.parameters(), ref.model.parameters(), strict=True)
        for a, b in pairs:
            # Adam's first step is ≈ lr·sign(g): equal up to float rounding (a real difference would be ~lr = 1e-3)
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_all_dead_batch_is_one_finite_noop_update(tok, teacher, turns):
    dead = [Turn(t.rollout_id, t.turn_index, 0, t.prompt_ids, t.response_ids, student_logprobs=t.student_logprobs,
                 teacher_logprobs=np.full(t.response_len, np.nan)) for t in turns[:4]]
    dead.append(Turn("x", 0, 0, [5, 6], [], teacher_logprobs=[]))  # empty response
    dead.append(Turn("y", 0, 0, [5, 6], [7, 8], teacher_logprobs=[-1.0, -1.0], action_mask=[False, False]))
    learner = Learner(student(tok), LearnerConfig(lr=1e-2), tok)
    m = learner.step(dead)
    assert m["learner/loss"] == 0.0 and m["learner/grad_norm"] == 0.0
    assert m["learner/dead_rows"] == len(dead) and m["learner/valid_tokens"] == 0
    assert m["learner/version"] == 1 and m["learner/skipped_update"] == 0
    assert params_equal(learner.model, student(tok))  # zero gradient and no weight decay: weights unchanged


def test_mixed_dead_rows_count_and_match_the_loss_denominator(tok, turns):
    half = [Turn(t.rollout_id, t.turn_index, 0, t.prompt_ids, t.response_ids, teacher_logprobs=t.teacher_logprobs,
                 action_mask=np.zeros(t.response_len, bool) if i % 2 else None) for i, t in enumerate(turns)]
    a = Learner(student(tok), LearnerConfig(lr=1e-3), tok).step(half)
    live = Learner(student(tok), LearnerConfig(lr=1e-3), tok).step(half[::2])
    assert a["learner/dead_rows"] == len(turns) // 2
    assert a["learner/loss"] == pytest.approx(live["learner/loss"] / 2, rel=1e-5)


def test_prompt_truncation_only_for_unflagged_turns(tok, turns):
    prompt = [6 + i % 10 for i in range(20)]
    long = Turn("a", 0, 0, prompt, [7, 8], teacher_logprobs=[-1.0, -2.0])
    flagged = Turn("b", 0, 0, prompt, [7, 8], teacher_logprobs=[-1.0, -2.0], prompt_truncated=True)
    m = Learner(student(tok), LearnerConfig(max_prompt_len=5), tok).step([long, flagged])
    assert m["learner/truncated_prompts"] == 1
    assert m["learner/tokens"] == (5 + 2) + (20 + 2)


def test_bad_batches_get_errors_naming_the_turn(tok, turns):
    bare = [Turn("z", 3, 0, [5, 6], [7], teacher_logprobs=[-1.0])]
    with pytest.raises(ValueError, match=r"\('z', 3\)"):
        Learner(student(tok), LearnerConfig(estimator="topk"), tok).step(bare)
    with pytest.raises(ValueError, match="empty batch"):
        Learner(student(tok), LearnerConfig(), tok).step([])
    with pytest.raises(ValueError, match="not ready"):
        Learner(student(tok), LearnerConfig(), tok).step(None)
    with pytest.raises(ValueError, match=r"\('w', 1\) has response_ids outside"):
        bad = Turn("w", 1, 0, [5], [len(tok) + 3], teacher_logprobs=[-1.0])
        Learner(student(tok), LearnerConfig(), tok).step([bad])


def test_qwen2_bf16_step_is_finite(tok, turns):
    model = build_model(tok, "0.2m", arch="qwen2")
    m = Learner(model, LearnerConfig(lr=1e-3, dtype="bfloat16"), tok).step(turns[:4])
    assert all(math.isfinite(m[k]) for k in METRICS)
    assert next(model.parameters()).dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------- checkpoints
def test_kill_and_resume_reproduces_the_next_update_bit_for_bit(tok, teacher, tmp_path):
    turns = make_turns(tok, teacher, n=24, seed=5, n_rollouts=6)
    cfg = SamplerConfig("divopd", batch_size=4, pool_factor=2, cap=1, max_staleness=10, seed=3)

    def run(learner, sampler, steps):
        out = []
        for _ in range(steps):
            batch = sampler.next_batch(learner.version)
            out.append((learner.step(batch), [t.key for t in batch.payloads]))
        return out

    learner = Learner(student(tok), LearnerConfig(lr=1e-3, weight_decay=0.01), tok)
    sampler = make_sampler(cfg)
    sampler.add(turns)
    run(learner, sampler, 2)
    ckpt = learner.save_checkpoint(tmp_path / "update-000002", extra_state={"sampler": sampler.state_dict()})
    uninterrupted = run(learner, sampler, 2)

    # "kill": drop everything in memory, rebuild from disk only
    resumed, extra = Learner.from_checkpoint(ckpt)
    assert resumed.version == 2 and resumed.tokens_total == uninterrupted[0][0]["learner/tokens_total"] - \
        uninterrupted[0][0]["learner/tokens"]
    sampler2 = make_sampler(cfg)
    sampler2.load_state_dict(extra["sampler"])
    replay = run(resumed, sampler2, 2)
    for (m1, keys1), (m2, keys2) in zip(uninterrupted, replay, strict=True):
        assert keys1 == keys2
        assert m1["learner/loss"] == m2["learner/loss"] and m1["learner/grad_norm"] == m2["learner/grad_norm"]
    assert params_equal(learner.model, resumed.model)
    state = json.loads((ckpt / "state.json").read_text())
    assert state["learner"]["version"] == 2 and (ckpt / "model.safetensors").is_file()
    assert (ckpt / "optimizer.pt").is_file() and not list(tmp_path.glob(".*tmp*"))


def test_publish_handles(tok, turns, tmp_path):
    learner = Learner(student(tok), LearnerConfig(lr=1e-2), tok)
    learner.step(turns[:4])
    handle = learner.publish()
    assert handle.version == 1
    explorer = student(tok, seed=9)
    handle.load_into(explorer)
    assert params_equal(explorer, learner.model)
    learner.step(turns[:4])  # the published copy does not move with the learner
    assert params_equal(explorer, student(tok, seed=9)) is False and not params_equal(explorer, learner.model)
    on_disk = learner.publish(tmp_path / "weights")
    assert on_disk.version == 2 and on_disk.state_dict is None
    on_disk.load_into(explorer)
    assert params_equal(explorer, learner.model)


# ---------------------------------------------------------------------------------------------- SFT
def test_sft_clones_a_fixed_mapping(tok):
    model = student(tok, seed=1)
    words = WORDS.split()
    examples = []
    for i in range(6):
        prompt = tok.apply_chat_template([{"role": "user", "content": f"{words[i]} {words[i + 6]}"}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)
        response = tok(f"{words[i + 1]} {words[i + 2]}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        examples.append((prompt, response))
    # lr 3e-3 converges on every model seed and thread count tried (12 seeds × 1/2 threads: final loss 0.0018-0.0019
    # from ~3.3); the old lr 3e-2 was chaotic (final 1e-4 to 0.8 by seed, and by CPU model). The assertions are the
    # guarantees of fitting six examples: the loss falls by two orders of magnitude and greedy decoding reproduces them.
    out = train_sft(model, tok, examples, epochs=150, lr=3e-3, batch_size=6, seed=0)
    assert out["steps"] == 150 and out["epoch_losses"][0] > 1.0
    assert out["final_loss"] < out["epoch_losses"][0] / 100
    for prompt, response in examples:
        with torch.no_grad():
            gen = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=5)
        assert gen[0, len(prompt):].tolist() == response
