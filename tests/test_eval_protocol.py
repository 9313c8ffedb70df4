"""Evaluation protocol: evaluation samples at eval.temperature (the paper's 0.4), seeded and reproducible;
greedy stays an option; training rollouts keep explorer.generation.temperature (1.0); the training-side evaluator and
`divopd eval` pass the eval settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from divopd.explore.explorer import Explorer, ExplorerConfig
from divopd.train.config import dump_config, load_config
from explorer_helpers import env_tokenizer, tiny_model
from test_train import tiny_config, tiny_models  # noqa: F401


class Recorder:
    """Wraps the student's generator: records each call's decoding and the responses it produced."""

    def __init__(self, gen):
        self.gen, self.calls = gen, []

    def generate(self, prompts, **kw):
        out = self.gen.generate(prompts, **kw)
        self.calls.append((kw["greedy"], kw["temperature"], kw["seed"], [tuple(g.response_ids) for g in out]))
        return out

    def take(self):
        calls, self.calls = self.calls, []
        return calls


def _explorer(seed: int = 0) -> Explorer:
    tok = env_tokenizer("tiny")
    cfg = ExplorerConfig(env="tiny", num_envs=3, max_steps=6, eval_tasks=6, generation={"max_new_tokens": 6})
    explorer = Explorer(cfg, tiny_model(tok, 0), tok, None, seed=seed)
    explorer._student_gen = Recorder(explorer._student_gen)
    return explorer


def _responses(calls):
    return [r for *_, rs in calls for r in rs]


def test_eval_samples_at_temperature_reproducibly_and_greedy_still_works():
    with _explorer() as explorer:
        explorer.collect(2)  # training rollouts: sampled at generation.temperature (1.0)
        train_calls = explorer._student_gen.take()
        assert train_calls and all(not g and t == 1.0 for g, t, _, _ in train_calls)

        a = explorer.evaluate()  # the default: T = 0.4, seeded by the explorer's seed
        calls_a = explorer._student_gen.take()
        assert all(not g and t == 0.4 for g, t, _, _ in calls_a)
        explorer.collect(2)  # more training generation in between must not change the evaluation's draws
        explorer._student_gen.take()
        b = explorer.evaluate(temperature=0.4, seed=0)
        calls_b = explorer._student_gen.take()
        assert [c[2] for c in calls_a] == [c[2] for c in calls_b]
        assert _responses(calls_a) == _responses(calls_b)
        drop = ("eval/seconds",)
        assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}

        explorer.evaluate(temperature=0.4, seed=1)
        assert _responses(explorer._student_gen.take()) != _responses(calls_a)  # another seed, other draws

        explorer.evaluate(greedy=True)
        greedy_1 = explorer._student_gen.take()
        explorer.evaluate(greedy=True, seed=5)
        greedy_2 = explorer._student_gen.take()
        assert all(g for g, *_ in greedy_1)
        assert _responses(greedy_1) == _responses(greedy_2)  # greedy ignores the seed
        assert _responses(greedy_1) != _responses(calls_a)  # T = 0.4 sampling is not greedy decoding

        with pytest.raises(ValueError, match="temperature"):
            explorer.evaluate(temperature=0.0)


def test_eval_settings_default_to_the_paper_and_validate():
    cfg = load_config("tiny")
    assert cfg.eval.temperature == 0.4 and cfg.eval.greedy is False
    assert cfg.explorer.generation.temperature == 1.0
    assert cfg.eval.sampling(7) == {"temperature": 0.4, "greedy": False, "seed": 7}
    assert load_config("tiny", ["eval.greedy=true"]).eval.sampling(0)["greedy"] is True
    with pytest.raises(ValueError, match="temperature"):
        load_config("tiny", ["eval.temperature=0"])


@pytest.fixture
def eval_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    calls: list[dict] = []
    original = Explorer.evaluate

    def recording(self, *args, **kwargs):
        calls.append(kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Explorer, "evaluate", recording)
    return calls


@pytest.mark.parametrize("kind", ["lockstep", "threads"])
def test_training_evaluator_passes_the_eval_settings(tiny_models: dict[str, str], tmp_path: Path,  # noqa: F811
                                                     eval_calls: list[dict], kind: str) -> None:
    from divopd.train import train

    cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", updates=3, seed=3, **{
        "runtime.kind": kind, "eval.every": 3, "eval.temperature": 0.7})
    train(cfg)
    assert eval_calls and all(c == {"num_tasks": 3, "temperature": 0.7, "greedy": False, "seed": 3}
                              for c in eval_calls)


def test_divopd_eval_passes_the_eval_settings(tiny_models: dict[str, str], tmp_path: Path,  # noqa: F811
                                              eval_calls: list[dict]) -> None:
    from divopd.train.evaluate import evaluate_checkpoint

    config = tmp_path / "config.yaml"
    config.write_text(dump_config(tiny_config(tiny_models, tmp_path / "run", "divopd", seed=2)))
    sampled = evaluate_checkpoint(tiny_models["student"], config, tasks=3)
    again = evaluate_checkpoint(tiny_models["student"], config, tasks=3)
    evaluate_checkpoint(tiny_models["student"], config, ["eval.greedy=true"], tasks=3)
    assert eval_calls[0] == {"num_tasks": 3, "temperature": 0.4, "greedy": False, "seed": 2}
    assert eval_calls[2]["greedy"] is True
    drop = ("eval/seconds",)
    assert {k: v for k, v in sampled.items() if k not in drop} == {k: v for k, v in again.items() if k not in drop}
