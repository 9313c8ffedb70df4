"""`divopd sft`: gold trajectories through the explorer's prompt builder, a tiny model trained on them, saved as an HF
folder, with its held-out greedy success rate (tiny env here; the TextWorld-Express numbers are in the README)."""

from __future__ import annotations

import json

import pytest
import torch

from divopd.cli import main
from divopd.commands.sft import collect_gold_examples
from divopd.explore.envs import make_env
from divopd.explore.prompting import PromptConfig, build_messages
from divopd.models import load_model


def test_gold_examples_are_the_prompts_the_explorer_would_build():
    env = make_env("tiny")
    task = env.tasks("train")[0]
    records, failed = collect_gold_examples(env, [task])
    gold = env.gold_actions(task)
    assert failed == 0 and [r["action"] for r in records] == gold
    assert [len(r["history"]) for r in records] == list(range(len(gold)))
    assert records[0]["first"].startswith("Your task is to take the coin")
    msgs = build_messages(PromptConfig(), records[-1]["first"], records[-1]["history"], records[-1]["valid"])
    assert msgs[-1]["content"].endswith("take coin")  # the coin room lists the action the gold path takes


# Slow: by default `divopd sft` runs in test_docs_commands.py's own-model guide (a teacher and a warm start)
@pytest.mark.slow
def test_sft_trains_a_tiny_model_that_beats_random_on_held_out_tasks(tmp_path, capsys):
    torch.set_num_threads(1)
    out = tmp_path / "teacher"
    rc = main(["sft", "--env", "tiny", "--out", str(out), "--size", "0.2m", "--train-tasks", "120", "--epochs", "6",
               "--lr", "5e-3", "--batch-size", "16", "--eval-tasks", "30", "--max-steps", "12",
               "--prompt", '{"max_prompt_tokens": 256}'])
    assert rc == 0
    summary = json.loads((out / "sft.json").read_text())
    assert summary["gold_failed"] == 0 and summary["prompt"]["max_prompt_tokens"] == 256
    assert summary["sft"]["final_loss"] < summary["epoch_losses"][0]
    # a random-init model never wins the tiny game in 12 steps (see test_explorer); the SFT model often does
    assert summary["eval"]["eval/success_rate"] >= 0.2, summary["eval"]
    assert "held-out dev: success rate" in capsys.readouterr().out
    model, tok = load_model(str(out))
    assert tok.chat_template and model.config.vocab_size == len(tok)


def test_sft_takes_an_environment_by_import_path(tmp_path, monkeypatch, capsys):
    """``--env module:Class``: an environment of the user's own, not registered anywhere (was "unknown environment")."""
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "divopd_user_sft_env.py").write_text(
        "from divopd.explore.envs.tiny import TinyEnv\n\n\nclass MyCorridor(TinyEnv):\n    name = 'my-corridor'\n")
    monkeypatch.syspath_prepend(str(pkg))
    torch.set_num_threads(1)
    out = tmp_path / "teacher"
    rc = main(["sft", "--env", "divopd_user_sft_env:MyCorridor", "--out", str(out), "--size", "0.2m",
               "--train-tasks", "10", "--epochs", "1", "--eval-tasks", "4", "--max-steps", "4"])
    assert rc == 0
    assert json.loads((out / "sft.json").read_text())["env"] == "divopd_user_sft_env:MyCorridor"
    assert main(["sft", "--env", "no_such_module_x:Env", "--out", str(tmp_path / "t2")]) == 2
    assert "--env: cannot import 'no_such_module_x'" in capsys.readouterr().err
