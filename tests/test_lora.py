"""LoRA students (``student.lora.rank > 0``): only the adapter trains, is published, checkpointed and exported.

A lockstep LoRA run killed with SIGKILL and resumed equals the uninterrupted one (every untimed metric and log row, as
for full fine-tuning in test_faults_resume); its checkpoints hold the adapter only (PEFT's files, AdamW state for the
adapter's tensors only, size ∝ rank); ``divopd eval`` of the last checkpoint equals the run's own last evaluation;
``divopd export --merged`` is a plain transformers model with the adapter's greedy actions; an HF explorer generates
with the published version's adapter; each bad LoRA input is one line and exit 2, before a run directory is made.
Tiny random-init models on the tiny environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("peft")

from divopd import cli  # noqa: E402
from divopd.learn.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoraSettings  # noqa: E402
from test_faults_resume import (  # noqa: E402
    _check_resumed_equals,
    _config,
    _kill_spec,
    _killed_run,
    _log_table,
    _reference,
    _series,
)
from test_train import read_metrics, tiny_models  # noqa: E402, F401

LORA = {"student.lora.rank": 4}


@pytest.fixture(scope="module")
def lora_run(tiny_models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    """The uninterrupted lockstep LoRA run (6 updates, evaluations and checkpoints every 2)."""
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    summary, visits = _reference(tiny_models, run_dir, **LORA)
    return {"summary": summary, "visits": visits, "series": _series(run_dir), "log": _log_table(run_dir),
            "run_dir": run_dir}


@pytest.mark.parametrize("phase", ["update", pytest.param("checkpoint", marks=pytest.mark.slow),
                                   pytest.param("publish", marks=pytest.mark.slow)])
def test_a_killed_lora_run_resumes_to_the_uninterrupted_run(phase: str, lora_run: dict, tiny_models: dict[str, str],  # noqa: F811
                                                            tmp_path: Path) -> None:
    from test_faults_resume import KILLS

    run_dir = tmp_path / "run"
    spec = _kill_spec(lora_run["visits"], phase, KILLS[phase])
    assert _killed_run(_config(tiny_models, run_dir, **LORA), tmp_path, spec) == -9, f"not killed at {spec}"
    _check_resumed_equals(run_dir, lora_run)
    losses = [r["learner/loss"] for r in lora_run["series"] if r["kind"] == "update"]
    assert len(set(losses)) > 1, "the adapter trains: the loss moves"


def _tensor_names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return list(fh.keys())  # noqa: SIM118


def test_a_lora_checkpoint_holds_the_adapter_only(lora_run: dict, tiny_models: dict[str, str],  # noqa: F811
                                                  tmp_path: Path) -> None:
    ckpt = lora_run["run_dir"] / "checkpoints" / "update-000006"
    names = _tensor_names(ckpt / ADAPTER_WEIGHTS)
    assert not list(ckpt.glob("model*.safetensors")) and not (ckpt / "config.json").exists()
    assert names and all(n.startswith("base_model.model.") and (".lora_A." in n or ".lora_B." in n) for n in names)
    config = json.loads((ckpt / ADAPTER_CONFIG).read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    assert Path(config["base_model_name_or_path"]) == Path(tiny_models["student"]).resolve()
    optim = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert len(optim["state"]) == len(names), "AdamW state for the adapter's tensors only"
    # the adapter's size grows with the rank (the base model is never written)
    from divopd.learn.learner import Learner, LearnerConfig
    from divopd.learn.lora import add_adapter
    from divopd.models import load_model

    sizes = {}
    for rank in (2, 8):
        model, tok = load_model(tiny_models["student"])
        add_adapter(model, LoraSettings(rank=rank), base=tiny_models["student"])
        Learner(model, LearnerConfig(), tok).save_checkpoint(tmp_path / f"r{rank}")
        sizes[rank] = {f: (tmp_path / f"r{rank}" / f).stat().st_size for f in (ADAPTER_WEIGHTS, "optimizer.pt")}
    base = sum(f.stat().st_size for f in Path(tiny_models["student"]).glob("*.safetensors"))
    print(f"checkpoint bytes by rank: {sizes}; the base model's weights: {base}")
    assert 3.0 < sizes[8][ADAPTER_WEIGHTS] / sizes[2][ADAPTER_WEIGHTS] < 4.2
    assert sizes[2][ADAPTER_WEIGHTS] < base / 5


def test_divopd_eval_of_a_lora_checkpoint_equals_the_runs_last_evaluation(lora_run: dict) -> None:
    from divopd.train.evaluate import evaluate_checkpoint

    last = [r for r in read_metrics(lora_run["run_dir"]) if r["kind"] == "eval"][-1]
    assert last["update"] == 6
    got = evaluate_checkpoint(lora_run["run_dir"] / "checkpoints" / "update-000006")
    keys = [k for k in last if k.startswith("eval/") and k != "eval/seconds"]
    assert keys and {k: got[k] for k in keys} == {k: last[k] for k in keys}


def test_divopd_report_reads_a_lora_run(lora_run: dict, tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert cli.main(["report", str(lora_run["run_dir"]), "--out", str(out), "--no-plots"]) == 0
    report = json.loads((out / "report.json").read_text())
    seeds = report["settings"]["test-tiny"]["methods"]["divopd"]["seeds"]
    assert seeds[0]["finished"] and seeds[0]["last_update"] == 6


def _greedy(model: torch.nn.Module, prompts: list[list[int]], n: int = 6) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)
        out.append(gen[0, len(p):].tolist())
    return out


def test_export_merged_loads_in_transformers_with_the_adapters_greedy_actions(lora_run: dict,
                                                                              tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from divopd.learn.lora import load_adapter_model

    ckpt = lora_run["run_dir"] / "checkpoints" / "update-000006"
    assert cli.main(["export", str(ckpt), "--out", str(tmp_path / "merged"), "--merged"]) == 0
    assert cli.main(["export", str(ckpt), "--out", str(tmp_path / "adapter")]) == 0
    assert sorted(p.name for p in (tmp_path / "adapter").glob("adapter_*")) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
    assert not (tmp_path / "adapter" / "optimizer.pt").exists()
    adapted, tok = load_adapter_model(ckpt)
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    assert not any("lora" in k for k in merged.state_dict())
    prompts = [tok.encode(t) for t in ("you are in a room", "go north", "take the key")]
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapted(ids).logits, atol=1e-5, rtol=1e-5)
    assert _greedy(merged, prompts) == _greedy(adapted, prompts)
    # the adapter folder: transformers (with PEFT installed) loads it on its base
    peft_loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "adapter")).eval()
    assert _greedy(peft_loaded, prompts) == _greedy(adapted, prompts)
    # an existing folder is never overwritten
    assert cli.main(["export", str(ckpt), "--out", str(tmp_path / "merged")]) == 2


def test_export_of_a_full_fine_tuning_checkpoint(tiny_models: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    from transformers import AutoModelForCausalLM

    from divopd.learn.learner import Learner, LearnerConfig
    from divopd.models import load_model

    model, tok = load_model(tiny_models["student"])
    Learner(model, LearnerConfig(), tok).save_checkpoint(tmp_path / "ckpt")
    assert cli.main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"), "--merged"]) == 0
    assert not (tmp_path / "out" / "optimizer.pt").exists() and not (tmp_path / "out" / "state.json").exists()
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    for k, v in model.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k


def _turns(vocab: int, n: int = 6, seed: int = 0) -> list:
    """``n`` turns of random token ids with random teacher log probs (what the learner's loss reads)."""
    import numpy as np

    from divopd import Turn

    rng = np.random.default_rng(seed)
    turns = []
    for i in range(n):
        prompt, response = rng.integers(3, vocab, size=8).tolist(), rng.integers(3, vocab, size=4).tolist()
        turns.append(Turn(f"r{i}", 0, 0, prompt, response, teacher_logprobs=(-rng.random(4) * 3).tolist()))
    return turns


def test_an_hf_explorer_generates_with_the_published_versions_adapter(tiny_models: dict[str, str],  # noqa: F811
                                                                      tmp_path: Path) -> None:
    """After publish v the explorer's student is the learner's student at v: the same logits as the learner's model
    and as the merged model; the published handle holds the adapter's tensors only; the base never moves."""
    from divopd.learn.lora import merged_model
    from divopd.train.assemble import build_explorer, make_learner

    cfg = _config(tiny_models, tmp_path / "unused", **LORA)
    learner, _ = make_learner(cfg, None)
    base = {k: v.clone() for k, v in learner.model.state_dict().items() if ".lora_" not in k}
    vocab = learner.model.get_input_embeddings().num_embeddings
    explorer = build_explorer(cfg, 0, 0, learner.publish(), None, evaluation=True)
    ids = torch.as_tensor(_turns(vocab, 1, seed=9)[0].prompt_ids).long()[None]
    for v in (1, 2):
        learner.step(_turns(vocab, seed=v))
        handle = learner.publish()
        assert handle.version == v and handle.adapter is not None
        assert handle.state_dict and all(".lora_" in k for k in handle.state_dict)
        explorer.set_weights(handle)
        explorer._apply_pending_weights()
        assert explorer.policy_version == v
        with torch.no_grad():
            torch.testing.assert_close(explorer.student(ids).logits, learner.model(ids).logits)
    assert all(torch.equal(learner.model.state_dict()[k], t) for k, t in base.items()), "the base is frozen"
    assert any(p.abs().max() > 0 for k, p in learner.model.named_parameters() if "lora_B" in k), "the adapter trains"
    merged = merged_model(learner.model)
    with torch.no_grad():
        torch.testing.assert_close(explorer.student(ids).logits, merged(ids).logits, atol=1e-5, rtol=1e-5)
    explorer.close()


def test_a_bf16_lora_learner_steps(tiny_models: dict[str, str]) -> None:  # noqa: F811
    import math

    from divopd.learn.learner import LearnerConfig
    from divopd.learn.sharded import build_learner

    learner = build_learner(tiny_models["student"], LearnerConfig(dtype="bfloat16", lr=1e-2), lora=LoraSettings(rank=4))
    vocab = learner.model.get_input_embeddings().num_embeddings
    metrics = [learner.step(_turns(vocab, seed=s)) for s in range(2)]
    assert all(math.isfinite(m["learner/loss"]) for m in metrics)
    trained = {id(p) for group in learner.optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for k, p in learner.model.named_parameters() if ".lora_" in k}
    assert all(p.dtype == torch.bfloat16 for p in learner.model.parameters())


#: The Ray runs' resources: one process learner; or 2 learner ranks (Ray actors, FSDP2) beside one explorer.
RAY_LEARNERS = {1: {"runtime.ray_num_cpus": 2},
                2: {"learner.world_size": 2, "runtime.ray_num_cpus": 4, "runtime.learner_cpus": 1,
                    "runtime.explorer_cpus": 1, "runtime.num_explorers": 1}}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_the_ray_runtime_ships_adapters_not_models(world_size: int, tiny_models: dict[str, str],  # noqa: F811
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A short Ray LoRA run (one learner process, or 2 learner ranks): every handle put into the object store holds
    the adapter's tensors only."""
    pytest.importorskip("ray")
    from divopd.train import train
    from divopd.train.runtime import ray as ray_runtime
    from test_train import tiny_config

    shipped: list[list[str]] = []
    real = ray_runtime.RayRuntime.publish

    def spy(self: object, handle: object) -> None:
        shipped.append(sorted(handle.state_dict))  # type: ignore[attr-defined]
        real(self, handle)  # type: ignore[arg-type]

    monkeypatch.setattr(ray_runtime.RayRuntime, "publish", spy)
    cfg = tiny_config(tiny_models, tmp_path / "ray", "divopd", **{"runtime.kind": "ray", **RAY_LEARNERS[world_size],
                                                                   **LORA})
    summary = train(cfg)
    assert summary["updates"] == 3 and len(shipped) >= 3
    assert all(keys and all(".lora_" in k for k in keys) for keys in shipped)


# ---------------------------------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def adapter_folder(tiny_models: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    from divopd.learn.lora import add_adapter, save_weights
    from divopd.models import load_model

    out = tmp_path_factory.mktemp("adapter") / "adapter"
    model, _ = load_model(tiny_models["student"])
    save_weights(add_adapter(model, LoraSettings(rank=2), base=tiny_models["student"]), out)
    return out


BAD = [
    ({"student.lora.rank": -1}, "student.lora.rank: Input should be greater than or equal to 0"),
    ({"student.lora.rank": 4, "student.lora.alpha": 0}, "student.lora.alpha: Input should be greater than 0"),
    ({"student.lora.rank": 4, "student.lora.dropout": 0.1}, "student.lora.dropout: only 0.0 is supported"),
    ({"student.lora.rank": 4, "student.lora.target_modules": "[qkv_proj]"},
     "student.lora.target_modules: qkv_proj not in"),
    ({"student.lora.rank": 4, "student.path": "ADAPTER"}, "is a PEFT adapter without its base model"),
]


@pytest.mark.parametrize(("over", "line"), BAD, ids=[str(i) for i in range(len(BAD))])
@pytest.mark.parametrize("command", ["train", "doctor"])
def test_each_bad_lora_input_is_one_line_and_exit_2(over: dict, line: str, command: str, adapter_folder: Path,
                                                    tiny_models: dict[str, str], tmp_path: Path,  # noqa: F811
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    over = {k: (str(adapter_folder) if v == "ADAPTER" else v) for k, v in over.items()}
    data = {"setting": "lora-bad", "method": "vanilla", "updates": 2, "run_dir": str(tmp_path / "run"),
            "student": {"path": tiny_models["student"]}, "teacher": {"path": tiny_models["teacher"]},
            "explorer": {"env": "tiny", "num_envs": 2, "max_steps": 3}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(data))
    argv = [command, str(tmp_path / "cfg.yaml")] + [a for k, v in over.items() for a in ("--set", f"{k}={v}")]
    capsys.readouterr()
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    if command == "train":
        err = captured.err.strip()
        assert "\n" not in err and line in err and "Traceback" not in err, err
        assert not (tmp_path / "run").exists(), "no run directory is made"
    else:
        assert line in captured.out + captured.err


def test_the_doctor_shows_the_lora_row(tiny_models: dict[str, str]) -> None:  # noqa: F811
    from divopd.train.config import load_config
    from divopd.train.preflight import lora_check

    data = {"setting": "s", "method": "vanilla", "student": {"path": tiny_models["student"], "lora": {"rank": 8}},
            "teacher": {"path": tiny_models["teacher"]}, "explorer": {"env": "tiny"}}
    row = lora_check(load_config(data=data))
    assert row.status == "ok" and "rank 8, alpha 16 on down_proj, gate_proj, k_proj, o_proj" in row.detail, row
    assert "trainable" in row.detail
    data["student"]["lora"] = {"rank": 0}
    assert "full fine-tuning" in lora_check(load_config(data=data)).detail
