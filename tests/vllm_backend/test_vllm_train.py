"""A few `divopd train` updates with vLLM engines for the student (explorer.generation.backend: vllm) and the teacher
(teacher.backend: vllm), under the lockstep and threads runtimes; config errors of the vLLM sections."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm_helpers import RUN_ENGINE, tiny_llama_pair  # noqa: E402

from divopd.experience.log import read_log  # noqa: E402
from divopd.train import train  # noqa: E402
from divopd.train.config import load_config  # noqa: E402
from explorer_helpers import env_tokenizer  # noqa: E402
from test_train import assert_ledger_identity, read_metrics, tiny_config  # noqa: E402


@pytest.fixture(scope="module")
def llama_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return tiny_llama_pair(tmp_path_factory.mktemp("vllm-train"))


def _vllm_overrides(**over: object) -> dict[str, object]:
    return {"explorer.generation.backend": "vllm", "explorer.generation.vllm": RUN_ENGINE, "teacher.backend": "vllm",
            "teacher.vllm": RUN_ENGINE, "explorer.prompt.max_prompt_tokens": 1000, **over}


@pytest.mark.parametrize("kind", ["lockstep", "threads"])
def test_a_few_updates_with_vllm_student_and_teacher(llama_models: dict[str, str], tmp_path: Path, kind: str) -> None:
    run_dir = tmp_path / kind
    cfg = tiny_config(llama_models, run_dir, "divopd", **_vllm_overrides(
        **{"runtime.kind": kind, "updates": 5, "runtime.lockstep.env_steps_per_update": 6}))
    summary = train(cfg)
    assert summary["updates"] == 5 and not summary["interrupted"]
    assert_ledger_identity(summary["ledger"])
    updates = [r for r in read_metrics(run_dir) if r["kind"] == "update"]
    assert [r["update"] for r in updates] == [1, 2, 3, 4, 5]
    assert all(r["time/weight_load_s"] >= 0 and r["time/publish_s"] >= 0 for r in updates)
    turns = list(read_log(run_dir / "experience"))
    assert len(turns) == summary["ledger"]["received"]
    if kind == "lockstep":  # deterministic: rollouts started after a push into the engine carry its version
        assert max(t.turn.policy_version for t in turns) >= 1 and updates[-1]["time/weight_load_s"] > 0


def test_vllm_sections_are_validated(llama_models: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="explorer.generation.vllm.max_model_len: 64 cannot hold"):
        tiny_config(llama_models, tmp_path / "a", "divopd", **{"explorer.generation.backend": "vllm",
                                                               "explorer.generation.vllm.max_model_len": 64})
    with pytest.raises(ValueError, match="backend"):
        tiny_config(llama_models, tmp_path / "b", "divopd", **{"teacher.backend": "sglang"})
    cfg = load_config(data={"setting": "x", "method": "divopd", "student": {"path": "s"},
                            "teacher": {"path": "t", "backend": "vllm", "vllm": {"engine_kwargs": {"swap_space": 0}}}})
    assert cfg.teacher.vllm.generator_kwargs()["swap_space"] == 0
    assert cfg.teacher.vllm.generator_kwargs()["enable_prefix_caching"] is True


def test_ray_with_vllm_engines_and_one_shared_teacher(llama_models: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("ray")
    run_dir = tmp_path / "ray"
    cfg = tiny_config(llama_models, run_dir, "divopd", **_vllm_overrides(
        **{"runtime.kind": "ray", "runtime.ray_num_cpus": 2, "teacher.shared": True, "updates": 3}))
    summary = train(cfg)
    assert summary["updates"] == 3 and not summary["interrupted"]
    assert_ledger_identity(summary["ledger"])
    assert summary["teacher/calls"] >= 1  # the one teacher engine scored the explorer's rollouts
    turns = [t.turn for t in read_log(run_dir / "experience")]
    assert turns and all(t.teacher_logprobs is not None for t in turns)


@pytest.mark.parametrize("kind", ["lockstep", "threads"])
def test_a_model_the_cpu_kernel_rejects_is_one_line_and_exit_2(tmp_path: Path, kind: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from divopd.cli import main
    from divopd.models.tiny import build_model

    tok = env_tokenizer("tiny")
    for name in ("student", "teacher"):  # the project's tiny models: head_dim 16
        build_model(tok, size="0.2m").save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    cfg = tiny_config({n: str(tmp_path / n) for n in ("student", "teacher")}, tmp_path / "run", "divopd",
                      **_vllm_overrides(**{"runtime.kind": kind, "teacher.backend": "hf"}))
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    capsys.readouterr()
    assert main(["train", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "head_dim 16 is not supported by vLLM's CPU attention kernel" in err and "\n" not in err


def test_an_engine_that_dies_mid_run_is_rebuilt_and_the_ledger_stays_whole(llama_models: dict[str, str],
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from divopd.explore.vllm_engine import VLLMGenerator

    real, seen = VLLMGenerator.generate, {"calls": 0, "gens": []}

    def dying(self: VLLMGenerator, *args: object, **kwargs: object) -> object:
        seen["calls"] += 1
        if seen["calls"] == 5:  # the student engine dies in the middle of the run
            seen["gens"].append(self)
            self._llm.llm_engine.engine_core.shutdown()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(VLLMGenerator, "generate", dying)
    run_dir = tmp_path / "dies"
    cfg = tiny_config(llama_models, run_dir, "divopd", **_vllm_overrides(
        **{"runtime.kind": "lockstep", "updates": 4, "runtime.lockstep.env_steps_per_update": 6}))
    summary = train(cfg)
    assert summary["updates"] == 4 and seen["gens"] and seen["gens"][0].restarts == 1
    assert_ledger_identity(summary["ledger"])
    assert len(list(read_log(run_dir / "experience"))) == summary["ledger"]["received"]


def test_a_sharded_learner_publishes_into_the_vllm_explorer(llama_models: dict[str, str], tmp_path: Path) -> None:
    """The sharded learner with vLLM generation: rank 0's gathered full state dict reaches the explorer's vLLM engine
    once per version."""
    run_dir = tmp_path / "ws2"
    cfg = tiny_config(llama_models, run_dir, "divopd", **_vllm_overrides(
        **{"runtime.kind": "lockstep", "updates": 5, "runtime.lockstep.env_steps_per_update": 6,
           "learner.world_size": 2, "teacher.backend": "hf"}))
    summary = train(cfg)
    assert summary["updates"] == 5 and not summary["interrupted"]
    assert_ledger_identity(summary["ledger"])
    updates = [r for r in read_metrics(run_dir) if r["kind"] == "update"]
    assert all(r["time/publish_s"] > 0 for r in updates)  # the rank-0 gather, timed
    assert updates[-1]["time/weight_load_s"] > 0  # pushed into the engine
    turns = list(read_log(run_dir / "experience"))
    assert max(t.turn.policy_version for t in turns) >= 1
