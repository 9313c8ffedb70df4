"""explorer.task_order: a seeded shuffle per pass (default), or the split's own order cycled (the paper's ScienceWorld
protocol: the training list is shuffled once with seed 42, then training cycles through it)."""

from __future__ import annotations

from itertools import islice

from divopd.explore.envs import make_env
from divopd.explore.explorer import Explorer
from divopd.explore.settings import ExplorerConfig
from explorer_helpers import env_tokenizer, tiny_model


def _stream(order: str, explorer_id: int = 0, seed: int = 0) -> tuple[list[str], list[str]]:
    tok = env_tokenizer("tiny")
    explorer = Explorer(ExplorerConfig(env="tiny", num_envs=1, task_order=order), tiny_model(tok), tok,
                        seed=seed, explorer_id=explorer_id)
    explorer._envs = [make_env("tiny")]
    tasks = explorer._envs[0].tasks("train")
    return tasks, list(islice(explorer._train_task_stream(), 2 * len(tasks) + 3))


def test_cycle_goes_through_the_split_in_its_order_again_and_again() -> None:
    tasks, got = _stream("cycle")
    assert got == (tasks * 3)[: len(got)]
    tasks, got = _stream("cycle", explorer_id=2)
    assert got == (tasks[2:] + tasks[:2]) * 2 + tasks[2:5]


def test_shuffle_reorders_every_pass_and_is_seeded() -> None:
    tasks, got = _stream("shuffle")
    n = len(tasks)
    assert sorted(got[:n]) == sorted(tasks) and got[:n] != tasks and got[:n] != got[n:2 * n]
    assert _stream("shuffle")[1] == got and _stream("shuffle", seed=1)[1] != got
