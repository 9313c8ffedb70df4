"""``make demo``: its config is the one the docs describe, its models follow their recipe, and a short lockstep run of
that config is deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from divopd.suite import demo
from divopd.suite.models import RECIPES, ModelRecipe, prepare_models, recipe_for
from divopd.train import train
from divopd.train.config import load_config
from divopd.train.packaged import CONFIGS, setting_names
from divopd.train.packaged import SHIPPED as PACKAGED_MODELS
from test_lockstep import _log_table, _series

REPO = Path(__file__).resolve().parents[1]
SHIPPED = PACKAGED_MODELS / "coin6-dart"


def test_the_demo_runs_the_documented_methods_on_the_documented_setting() -> None:
    assert demo.CONFIGS == CONFIGS / "coin6-dart.yaml" and demo.SETTING == "coin6-dart"
    recipe = recipe_for(demo.SETTING)  # the demo's models: the setting file plays the same game with the same prompt
    for method in ("vanilla", "divopd"):
        cfg = load_config(demo.SETTING, [f"method={method}"])
        assert cfg.method == method and cfg.runtime.kind == "lockstep" and cfg.updates == 40
        assert cfg.explorer.env == recipe.env and cfg.explorer.env_kwargs == recipe.env_kwargs
        for key, value in recipe.prompt.items():
            assert getattr(cfg.explorer.prompt, key) == value
        assert (cfg.student.path, cfg.teacher.path) == ("cache/coin6-dart/student", "cache/coin6-dart/teacher")


@pytest.mark.parametrize("setting", ["tiny", "coin4", "coin4-dart", "coin6", "coin6-dart", "twc"])
def test_every_cpu_setting_has_a_recipe_and_runs_every_method_row(setting: str) -> None:
    from divopd.sampling import method_names

    recipe = recipe_for(CONFIGS / f"{setting}.yaml")
    assert recipe is recipe_for(setting)
    for method in method_names():
        cfg = load_config(setting, [f"method={method}"])
        assert cfg.explorer.env == recipe.env and cfg.explorer.env_kwargs == recipe.env_kwargs
    assert set(RECIPES) <= set(setting_names())
    with pytest.raises(KeyError, match="no model recipe"):
        recipe_for("nowhere")


def test_the_shipped_models_are_the_recipes_build_and_are_copied_not_trained(tmp_path: Path, monkeypatch) -> None:
    """divopd/shipped/coin6-dart holds the coin6-dart recipe's build into cache/coin6-dart (its recipe-args.json are the
    recipe's arguments for that folder, so a changed recipe fails here until the models are rebuilt and shipped
    again); prepare_models copies them into an empty cache byte for byte, without an SFT, and over a stale build (other
    recipe arguments), never over a build of the same arguments."""
    import divopd.suite.models as models_mod

    recipe = RECIPES["coin6-dart"]
    cache = Path("cache/coin6-dart")
    assert json.loads((SHIPPED / "teacher" / "recipe-args.json").read_text()) == recipe.sft_args(
        cache / "teacher", recipe.teacher)
    assert json.loads((SHIPPED / "student" / "recipe-args.json").read_text()) == recipe.sft_args(
        cache / "student", ("--tokenizer-from", str(cache / "teacher"), *recipe.student))
    monkeypatch.chdir(tmp_path)

    def no_sft(argv: list[str]) -> None:
        raise AssertionError(f"trained instead of copied: {argv}")

    monkeypatch.setattr(models_mod, "_sft", no_sft)
    got = prepare_models(cache, recipe, shipped=SHIPPED)
    assert got == {"teacher": cache / "teacher", "student": cache / "student"}
    for name in ("teacher", "student"):
        assert (cache / name / "model.safetensors").read_bytes() == (SHIPPED / name / "model.safetensors").read_bytes()
    assert models_mod.copy_shipped(cache, recipe, SHIPPED) == []  # complete: nothing copied again
    stale = cache / "student"  # a model an older recipe built: replaced by the shipped one, not trained again
    (stale / "recipe-args.json").write_text(json.dumps(["--older", "recipe"]))
    (stale / "model.safetensors").write_bytes(b"old weights")
    assert models_mod.copy_shipped(cache, recipe, SHIPPED) == ["student"]
    assert (stale / "model.safetensors").read_bytes() == (SHIPPED / "student" / "model.safetensors").read_bytes()
    assert prepare_models(cache, recipe, shipped=SHIPPED) == got
    other = Path("elsewhere")  # another cache folder: the recipe's arguments differ, nothing is copied
    assert models_mod.copy_shipped(other, recipe, SHIPPED) == [] and not other.exists()


# Slow: the demo config twice; by default lockstep determinism: test_lockstep.py::test_same_seed_same_run_bit_for_bit
@pytest.mark.slow
def test_a_short_lockstep_run_of_the_demo_config_is_deterministic(tmp_path: Path) -> None:
    pytest.importorskip("textworld_express")
    models = {"student": SHIPPED / "student", "teacher": SHIPPED / "teacher"}
    runs = []
    for name in ("a", "b"):
        cfg = demo.demo_config(demo.CONFIGS, "divopd", 0, tmp_path / name, models, 2,
                               ["eval.tasks=4", f"run_dir={tmp_path / name / 'run'}"])
        assert cfg.runtime.kind == "lockstep"
        runs.append(train(cfg))
    a, b = runs
    assert a["updates"] == b["updates"] == 2
    assert a["ledger"] == b["ledger"] and a["env_steps"] == b["env_steps"]
    sa, sb = _series(tmp_path / "a" / "run"), _series(tmp_path / "b" / "run")
    assert any(r["kind"] == "update" for r in sa) and any("eval/success_rate" in r for r in sa)
    assert sa == sb
    assert _log_table(tmp_path / "a" / "run") == _log_table(tmp_path / "b" / "run")


@pytest.mark.parametrize(("argv", "message"), [
    (["--configs", "configs/nowhere.yaml"], "no model recipe for setting 'nowhere'"),
    (["--configs", "nowhere"], "no such config file or packaged setting; settings: alfworld"),
    (["--methods", "vanilla", "nosuch"], "nosuch"),
    (["--set", "sampler.kap=3"], "sampler.kap"),
    (["--jobs", "0"], "--jobs must be at least 1"),
])
def test_bad_demo_arguments_are_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main([*argv, "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "cache").exists()  # nothing was built


def test_prepare_models_rebuilds_what_a_changed_recipe_built(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A second call with the same recipe keeps both models (no retraining); a changed student rebuilds the student
    only; a changed teacher rebuilds both (the student takes the teacher's tokenizer); a build interrupted before its
    model was complete (divopd's stamp, no sft.json) is rebuilt."""
    def recipe(teacher_epochs: str, student_tasks: str) -> ModelRecipe:
        return ModelRecipe(env="tiny", env_kwargs={}, prompt={},
                           teacher=("--train-tasks", "8", "--epochs", teacher_epochs, "--eval-tasks", "2"),
                           student=("--train-tasks", student_tasks, "--epochs", "1", "--eval-tasks", "2"))

    def stamps(models: dict[str, Path]) -> tuple[int, int]:
        return tuple((models[k] / "sft.json").stat().st_mtime_ns for k in ("teacher", "student"))  # type: ignore

    models = prepare_models(tmp_path, recipe("1", "4"))
    first = stamps(models)
    assert prepare_models(tmp_path, recipe("1", "4")) == models and stamps(models) == first
    prepare_models(tmp_path, recipe("1", "6"))
    second = stamps(models)
    assert second[0] == first[0] and second[1] != first[1]
    assert json.loads((models["student"] / "sft.json").read_text())["args"]["train_tasks"] == 6
    prepare_models(tmp_path, recipe("2", "6"))
    third = stamps(models)
    assert third[0] != second[0] and third[1] != second[1]
    (models["student"] / "sft.json").unlink()  # as a build killed before its last file
    (models["student"] / "recipe-args.json").write_text(json.dumps({"building": True}))
    prepare_models(tmp_path, recipe("2", "6"))
    assert (models["student"] / "sft.json").is_file() and stamps(models)[0] == third[0]
    assert isinstance(json.loads((models["student"] / "recipe-args.json").read_text()), list)  # its arguments


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_model_folder_divopd_did_not_write_is_refused_and_left_as_it_is(tmp_path: Path, monkeypatch,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """A cache's teacher or student folder that holds files without divopd's recipe-args.json (a user's model, or a
    cache from before the stamp): prepare_models neither writes into it nor deletes it, nor builds the other one, and
    says so in one line (a UsageError naming the folder; the demo exits 2) — also when its files look like a
    complete model (sft.json). An empty folder is built into."""
    import divopd.suite.models as models_mod
    from divopd.errors import UsageError

    def no_sft(argv: list[str]) -> None:
        raise AssertionError(f"built into a folder divopd did not write: {argv}")

    monkeypatch.setattr(models_mod, "_sft", no_sft)
    for name in ("teacher", "student"):
        cache = tmp_path / f"cache-{name}"
        (cache / name).mkdir(parents=True)
        (cache / name / "sft.json").write_text("{}")
        (cache / name / "model.safetensors").write_bytes(b"the user's weights")
        before = _files(cache)
        with pytest.raises(UsageError, match=f"models: {cache / name} exists and was not written by divopd"):
            prepare_models(cache, RECIPES["coin4"])
        assert _files(cache) == before and sorted(p.name for p in cache.iterdir()) == [name]
    cache = tmp_path / "demo-cache"
    (cache / "teacher").mkdir(parents=True)
    (cache / "teacher" / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert demo.main(["--configs", "coin4", "--cache", str(cache), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"demo: models: {cache / 'teacher'} exists and was not")
    assert err.endswith("move it away, or choose another cache folder")
    assert _files(cache) == {"teacher/notes.txt": b"mine"}
    empty = tmp_path / "empty-cache"
    (empty / "teacher").mkdir(parents=True)
    monkeypatch.setattr(models_mod, "_sft", lambda argv: (Path(argv[argv.index("--out") + 1]) / "sft.json").write_text(
        "{}"))
    assert prepare_models(empty, RECIPES["coin4"])["teacher"] == empty / "teacher"
    assert json.loads((empty / "teacher" / "recipe-args.json").read_text()) == RECIPES["coin4"].sft_args(
        empty / "teacher", RECIPES["coin4"].teacher)


def test_a_packaged_setting_copies_its_shipped_models_on_first_use_in_one_line(tmp_path: Path, monkeypatch,
                                                                               capsys) -> None:
    """``divopd train coin6-dart`` from an empty folder: the shipped models are copied to ./cache/coin6-dart with one
    line saying where (the README's install lines; scripts/test-wheel.sh runs them from a wheel)."""
    from divopd.suite.models import use_shipped_models

    monkeypatch.chdir(tmp_path)
    assert use_shipped_models("coin6-dart", "cache/coin6-dart/student", "cache/coin6-dart/teacher") == [
        "teacher", "student"]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("models:")]
    assert len(lines) == 1 and "cache/coin6-dart" in lines[0]
    assert (tmp_path / "cache/coin6-dart/student/sft.json").is_file()
    assert use_shipped_models("coin6-dart", "cache/coin6-dart/student", "cache/coin6-dart/teacher") == []
    assert use_shipped_models("coin6-dart", "my/student", "my/teacher") == [] and not Path("my").exists()


def test_copying_the_shipped_models_never_deletes_a_folder_divopd_did_not_write(tmp_path: Path, monkeypatch) -> None:
    """A user's own folder where the cache's model would go (no recipe-args.json stamp) is left byte for byte."""
    import divopd.suite.models as models_mod

    monkeypatch.chdir(tmp_path)
    mine = Path("cache/coin6-dart/student")
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("my own files")
    (mine / "sft.json").write_text("{}")
    copied = models_mod.copy_shipped(Path("cache/coin6-dart"), RECIPES["coin6-dart"], SHIPPED)
    assert copied == ["teacher"]
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "sft.json"]
    assert (mine / "notes.txt").read_text() == "my own files"
