"""``divopd tasks --for verl``: the parquet file verl's own ``RLHFDataset`` reads gives divopd's agent loop back the
rows ``task_rows`` built; bad input is one line and exit 2; an existing file is never overwritten."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402

from divopd.commands.tasks import task_rows  # noqa: E402
from divopd.integrations.verl_env_agent import AGENT_NAME, task_row  # noqa: E402
from divopd.train.config import load_config  # noqa: E402
from tiny_models import build_tiny_models  # noqa: E402

ARGS = ["tiny", "--set", "explorer.env=tiny", "--set", "explorer.env_kwargs={}", "--set", "explorer.max_steps=6"]


def _divopd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "divopd.cli", "tasks", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_verls_dataset_reads_back_the_rows_for_divopds_agent_loop(tmp_path: Path) -> None:
    out = tmp_path / "train.parquet"
    done = _divopd(*ARGS, "--for", "verl", "--split", "train", "--out", str(out), "--limit", "5")
    assert done.returncode == 0, done.stderr
    tokenizer = PreTrainedTokenizerFast.from_pretrained(build_tiny_models(tmp_path / "models")["student"])
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 512, "filter_overlong_prompts": True,
                               "filter_overlong_prompts_workers": 1, "cache_dir": str(tmp_path / "cache")})
    dataset = RLHFDataset(str(out), tokenizer, config)
    assert len(dataset) == 5
    cfg = load_config("tiny", ["explorer.env=tiny", "explorer.env_kwargs={}", "explorer.max_steps=6"])
    expected = task_rows(cfg, "train", 5)
    for i in range(5):
        item = dataset[i]  # what verl's agent-loop worker passes to the loop as keyword arguments
        assert item["agent_name"] == AGENT_NAME and item["index"] == i
        assert task_row(item) == expected[i]
    assert expected[0]["max_steps"] == 6


@pytest.mark.parametrize(("name", "message"), [("train.jsonl", "verl's dataset files are parquet")])
def test_bad_input_is_one_line(tmp_path: Path, name: str, message: str) -> None:
    done = _divopd(*ARGS, "--for", "verl", "--split", "train", "--out", str(tmp_path / name))
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not list(tmp_path.iterdir())


def test_an_existing_file_is_never_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "train.parquet"
    out.write_text("mine")
    done = _divopd(*ARGS, "--for", "verl", "--split", "train", "--out", str(out))
    assert done.returncode == 2 and out.read_text() == "mine"
