"""Shutdown with real vLLM engines: a run under the lockstep and threads runtimes shuts down every engine it started,
the teacher's included (the teacher engine used to stay up after the run)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm_helpers import RUN_ENGINE, tiny_llama_pair  # noqa: E402

from divopd.explore import vllm_engine  # noqa: E402
from divopd.train import train  # noqa: E402
from test_train import assert_ledger_identity, tiny_config  # noqa: E402


@pytest.fixture(scope="module")
def llama_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return tiny_llama_pair(tmp_path_factory.mktemp("vllm-faults"))


@pytest.mark.parametrize("kind", ["lockstep", "threads"])
def test_a_run_closes_its_teacher_engine(llama_models: dict[str, str], tmp_path: Path, kind: str) -> None:
    assert not vllm_engine._LIVE  # no engine of an earlier test left running
    cfg = tiny_config(llama_models, tmp_path / kind, "divopd", updates=2, **{
        "teacher.backend": "vllm", "teacher.vllm": RUN_ENGINE, "explorer.prompt.max_prompt_tokens": 1000,
        "runtime.kind": kind, "runtime.lockstep.env_steps_per_update": 6, "eval.every": 100})
    summary = train(cfg)
    assert summary["updates"] == 2
    assert_ledger_identity(summary["ledger"])
    assert not vllm_engine._LIVE  # the teacher engine was shut down with the run
