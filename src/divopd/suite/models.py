"""The offline models of the CPU settings (the packaged ``tiny``, ``coin4``, ...): one :class:`ModelRecipe` per
setting (:data:`RECIPES`, the ``divopd sft`` arguments of its teacher and student), which :func:`prepare_models` builds
once into a cache folder for ``make demo`` and ``divopd bench paper``."""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from divopd.errors import UsageError
from divopd.train.packaged import SHIPPED as PACKAGED_MODELS

__all__ = ["RECIPES", "SHIPPED", "ModelRecipe", "build_command", "copy_shipped", "default_cache", "prepare_models",
           "recipe_for", "shipped_models_for", "use_shipped_models"]

#: Prebuilt models that the package ships, ``divopd/shipped/<setting>/{teacher,student}``: the recipe's build into
#: ``cache/<setting>`` (their ``recipe-args.json`` says so), copied there instead of trained again.
SHIPPED = PACKAGED_MODELS


@dataclass(frozen=True)
class ModelRecipe:
    """How one setting's teacher and student are built (``divopd sft`` arguments beyond the game and prompt)."""

    env: str
    env_kwargs: dict[str, Any]
    prompt: dict[str, Any]
    teacher: tuple[str, ...]
    student: tuple[str, ...] | None  # None: a random-init model on the teacher's tokenizer
    note: str = ""
    size: str = "0.2m"

    def sft_args(self, out: Path, extra: tuple[str, ...]) -> list[str]:
        """``divopd sft`` arguments: the recipe's game, prompt and size, one torch thread, ``out``, then ``extra``."""
        return ["--env", self.env, "--env-kwargs", json.dumps(self.env_kwargs), "--prompt", json.dumps(self.prompt),
                "--size", self.size, "--threads", "1", "--out", str(out), *extra]


_COIN_PROMPT = {"past_observation_max_words": 8}
_TWC_PARAMS = "numLocations=1,numItemsToPutAway=1,includeDoors=0,limitInventorySize=0"

def _coin_search_recipe(rooms: int, max_steps: int, teacher_eval_tasks: int, student_tasks: int,
                        student_epochs: int, note: str) -> ModelRecipe:
    """A *coin* setting without doors or distractors whose teacher (600 tasks x 8 epochs) and short-SFT student both
    clone the observable-state search (``--expert explore``): the ``coin4`` and ``coin6`` recipes."""
    def search(tasks: int, epochs: int, eval_tasks: int, seed: int) -> tuple[str, ...]:
        return ("--expert", "explore", "--train-tasks", str(tasks), "--epochs", str(epochs), "--max-steps",
                str(max_steps), "--eval-tasks", str(eval_tasks), "--seed", str(seed))

    return ModelRecipe(
        env="twx", env_kwargs={"game": "coin", "params": f"numLocations={rooms},numDistractorItems=0,includeDoors=0"},
        prompt=_COIN_PROMPT, teacher=search(600, 8, teacher_eval_tasks, 0),
        student=search(student_tasks, student_epochs, 10, 1), note=note)


def _coin_dart_recipe(rooms: int, max_steps: int, miss: str | None, note: str) -> ModelRecipe:
    """A *coin* setting whose teacher clones the search from DART-style data (``--expert-noise 0.2``) and whose student
    clones an epsilon-greedy searcher (``--expert-epsilon 0.8``, 300 tasks x 3 epochs) that, with ``miss``, also walks
    past the coin it sees (``--expert-miss``): the ``coin4-dart`` and ``coin6-dart`` recipes."""
    steps = str(max_steps)
    walk_past = ("--expert-miss", miss) if miss is not None else ()
    return ModelRecipe(
        env="twx", env_kwargs={"game": "coin", "params": f"numLocations={rooms},numDistractorItems=0,includeDoors=0"},
        prompt=_COIN_PROMPT,
        teacher=("--expert", "explore", "--expert-noise", "0.2", "--train-tasks", "600", "--epochs", "8",
                 "--max-steps", steps, "--eval-tasks", "64", "--seed", "0"),
        student=("--expert", "explore", "--expert-epsilon", "0.8", *walk_past, "--expert-max-steps", steps,
                 "--train-tasks", "300", "--epochs", "3", "--max-steps", steps, "--eval-tasks", "64", "--seed", "1"),
        note=note)


RECIPES: dict[str, ModelRecipe] = {
    "tiny": ModelRecipe(
        env="twx", env_kwargs={"game": "coin", "params": "numLocations=2,numDistractorItems=0,includeDoors=0"},
        prompt=_COIN_PROMPT,
        teacher=("--train-tasks", "300", "--epochs", "4", "--seed", "0", "--eval-tasks", "100"),
        student=None, note="gold-path teacher, random-init student, ~1 min"),
    "coin4": _coin_search_recipe(rooms=4, max_steps=10, teacher_eval_tasks=10, student_tasks=150, student_epochs=1,
                                 note="search-expert teacher (600 tasks x 8 epochs, ~3 min), 150-task one-epoch "
                                      "student"),
    "coin6": _coin_search_recipe(rooms=6, max_steps=14, teacher_eval_tasks=64, student_tasks=112, student_epochs=2,
                                 note="search-expert teacher (600 tasks x 8 epochs, ~6.5 min), 112-task two-epoch "
                                      "student"),
    "coin4-dart": _coin_dart_recipe(rooms=4, max_steps=10, miss=None,
                                    note="DART-style search teacher (600 tasks x 8 epochs, ~4 min), epsilon-greedy "
                                         "searcher student (300 x 3)"),
    "coin6-dart": _coin_dart_recipe(rooms=6, max_steps=14, miss="0.5",
                                    note="DART-style search teacher on 6 rooms (600 tasks x 8 epochs, ~8 min), "
                                         "epsilon-greedy searcher student that walks past half the coins it sees "
                                         "(300 x 3)"),
    "twc": ModelRecipe(
        env="twx", env_kwargs={"game": "twc", "params": _TWC_PARAMS, "dev_from_train": 200},
        prompt=_COIN_PROMPT,
        teacher=("--train-tasks", "600", "--epochs", "8", "--max-steps", "5", "--eval-tasks", "10", "--seed", "0"),
        student=("--train-tasks", "550", "--epochs", "3", "--max-steps", "5", "--eval-tasks", "10", "--seed", "1"),
        note="gold-path teacher (600 tasks x 8 epochs, ~3 min), shorter gold-path student"),
}


def default_cache(setting: str) -> Path:
    """Where the demo builds a setting's models and its packaged config reads them: ``cache/demo`` for ``tiny``,
    else ``cache/<setting>``."""
    return Path("cache/demo" if setting == "tiny" else f"cache/{setting}")


def build_command(setting: str, folder: str) -> str | None:
    """The command that builds model folder ``folder`` of packaged setting ``setting`` (the demo, which builds them
    into :func:`default_cache` first), ``None`` when no recipe builds that folder or it holds files (never built
    into)."""
    path = Path(folder)
    if setting not in RECIPES or path.parent != default_cache(setting) or (path.is_dir() and any(path.iterdir())):
        return None
    return f"python -m divopd.suite.demo --configs {setting}"


def recipe_for(configs: str | Path) -> ModelRecipe:
    """The recipe of a setting: its name, or a path whose file stem (``coin4.yaml``) or folder name is the name."""
    name = Path(configs).name.removesuffix(".yaml")
    if name not in RECIPES:
        raise KeyError(f"no model recipe for setting {name!r}; known: {', '.join(RECIPES)}")
    return RECIPES[name]


def _sft(argv: list[str]) -> None:
    from divopd.commands import sft as sft_cli

    parser = argparse.ArgumentParser(prog="divopd sft")
    sft_cli.add_arguments(parser)
    code = sft_cli.run(parser.parse_args(argv))
    if code:
        raise RuntimeError(f"divopd sft {' '.join(argv)} failed with exit code {code}")


#: Beside each built model: the arguments it was built with, so a changed recipe rebuilds it instead of reusing it.
BUILT_WITH = "recipe-args.json"


def _stamped_with(folder: Path, argv: list[str], marker: str) -> bool:
    """Whether ``folder`` holds a complete model (its ``marker`` file) whose stamp says it was built from ``argv``."""
    stamp = folder / BUILT_WITH
    return (folder / marker).is_file() and stamp.is_file() and json.loads(stamp.read_text()) == argv


def _built_with(folder: Path, argv: list[str], marker: str) -> bool:
    """:func:`_stamped_with`, saying so when a complete model was built from other arguments (it will be rebuilt)."""
    if not (folder / marker).is_file():
        return False
    if _stamped_with(folder, argv, marker):
        return True
    print(f"models: {folder} was built from other recipe arguments: rebuilding it", flush=True)
    return False


def _stamp(folder: Path, argv: list[str]) -> None:
    """Record beside a model just built the arguments it was built from (read back by :func:`_built_with`)."""
    (folder / BUILT_WITH).write_text(json.dumps(argv))


def _claim(folder: Path) -> None:
    """Mark ``folder`` as divopd's before a build writes into it: a stamp that matches no arguments (so an interrupted
    build is not taken for a complete one), which lets the next call rebuild it as divopd's own."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / BUILT_WITH).write_text(json.dumps({"building": True}))


def _refuse_foreign(folder: Path) -> None:
    """Raise :class:`~divopd.errors.UsageError` when ``folder`` exists and divopd did not write it (no
    ``recipe-args.json``, not an empty folder): a model build never writes into it nor deletes it."""
    if not folder.exists() or (folder / BUILT_WITH).is_file():
        return
    if folder.is_dir() and not any(folder.iterdir()):
        return  # an empty folder: nothing in it to overwrite
    raise UsageError(f"models: {folder} exists and was not written by divopd (no {BUILT_WITH}): divopd neither "
                     "builds into it nor deletes it; move it away, or choose another cache folder")


def _sft_argvs(cache: Path, recipe: ModelRecipe) -> dict[str, list[str]]:
    """The ``divopd sft`` arguments of the recipe's SFT models in ``cache``: the teacher's, and the student's (on the
    teacher's tokenizer) unless the student is a random init."""
    teacher = cache / "teacher"
    argvs = {"teacher": recipe.sft_args(teacher, recipe.teacher)}
    if recipe.student is not None:
        argvs["student"] = recipe.sft_args(cache / "student", ("--tokenizer-from", str(teacher), *recipe.student))
    return argvs


def _shipped_to_copy(cache: Path, recipe: ModelRecipe, shipped: Path, say: bool = False) -> list[str]:
    """The names (``teacher``, ``student``) that :func:`copy_shipped` would copy; with ``say``, one line for each
    folder left alone because divopd did not write it."""
    names = []
    for name, argv in _sft_argvs(cache, recipe).items():
        src, dst = shipped / name, cache / name
        if not (src / "sft.json").is_file() or not (src / BUILT_WITH).is_file():
            continue
        if json.loads((src / BUILT_WITH).read_text()) != argv or _stamped_with(dst, argv, "sft.json"):
            continue
        if dst.exists() and not (dst / BUILT_WITH).is_file():
            if say:
                print(f"models: {dst} exists and was not written by divopd (no {BUILT_WITH}): left as it is, the "
                      "shipped model not copied", flush=True)
            continue
        names.append(name)
    return names


def copy_shipped(cache: Path, recipe: ModelRecipe, shipped: Path) -> list[str]:
    """Copy ``shipped/teacher`` and ``shipped/student`` into ``cache`` where the shipped model was built from exactly
    the recipe's arguments for ``cache`` and ``cache`` has no complete model built from them; a stale build of divopd's
    is replaced, a folder without divopd's stamp is left as it is. Each copy is renamed into place from a
    ``<name>.partial-copy`` folder (no half model). Returns the names copied."""
    copied = []
    for name in _shipped_to_copy(cache, recipe, shipped, say=True):
        src, dst = shipped / name, cache / name
        partial = dst.with_name(f"{name}.partial-copy")  # only divopd writes this name
        if partial.exists():
            shutil.rmtree(partial)
        shutil.copytree(src, partial)
        if dst.exists():
            shutil.rmtree(dst)  # a stale or partial build of divopd's own (stamped above)
        partial.rename(dst)
        copied.append(name)
    if copied:
        print(f"models: copied the shipped {' and '.join(copied)} into {cache} (from {shipped}; not trained again)",
              flush=True)
    return copied


def _shipped_folders(setting: str, student_path: str, teacher_path: str) -> tuple[Path, ModelRecipe, Path] | None:
    """``(cache/<setting>, its recipe, its shipped folder)`` when the package ships the setting's models and the
    config reads them from that cache (not elsewhere, as with ``--set student.path``); else ``None``."""
    cache, shipped = Path("cache") / setting, SHIPPED / setting
    if setting not in RECIPES or not shipped.is_dir():
        return None
    if Path(student_path) != cache / "student" or Path(teacher_path) != cache / "teacher":
        return None
    return cache, RECIPES[setting], shipped


def shipped_models_for(setting: str, student_path: str, teacher_path: str) -> dict[str, Path]:
    """What :func:`use_shipped_models` would copy, without copying: ``{"student": <shipped folder>, ...}``; ``divopd
    doctor`` checks those folders in place of the ones not there yet."""
    folders = _shipped_folders(setting, student_path, teacher_path)
    if folders is None:
        return {}
    cache, recipe, shipped = folders
    return {name: shipped / name for name in _shipped_to_copy(cache, recipe, shipped)}


def use_shipped_models(setting: str, student_path: str, teacher_path: str) -> list[str]:
    """On the first ``divopd train <setting>``, copy the shipped models to where the setting reads them
    (``cache/<setting>``, relative to the working directory; :func:`copy_shipped`). Returns the names copied."""
    folders = _shipped_folders(setting, student_path, teacher_path)
    return [] if folders is None else copy_shipped(*folders)


def prepare_models(cache: Path, recipe: ModelRecipe | str = "tiny", shipped: Path | None = None) -> dict[str, Path]:
    """Build (once) the recipe's teacher and student in ``cache``; returns ``{"teacher": ..., "student": ...}``. A
    folder divopd did not write is refused (:class:`UsageError`); a complete one built from the same recipe arguments
    is kept, otherwise rebuilt, and a rebuilt teacher rebuilds the student (they share its tokenizer). ``shipped``: a
    folder of prebuilt models copied in first where they match (:func:`copy_shipped`)."""
    recipe = RECIPES[recipe] if isinstance(recipe, str) else recipe
    teacher, student = cache / "teacher", cache / "student"
    for folder in (teacher, student):  # before anything is copied or built
        _refuse_foreign(folder)
    if shipped is not None and shipped.is_dir():
        copy_shipped(cache, recipe, shipped)
    argvs = _sft_argvs(cache, recipe)
    teacher_argv = argvs["teacher"]
    rebuilt = not _built_with(teacher, teacher_argv, "sft.json")
    if rebuilt:
        print(f"models: training the teacher into {teacher} (once; {recipe.note})", flush=True)
        _claim(teacher)
        _sft(teacher_argv)
        _stamp(teacher, teacher_argv)
    if recipe.student is not None:
        student_argv = argvs["student"]
        if rebuilt or not _built_with(student, student_argv, "sft.json"):
            print(f"models: training the student into {student} (once)", flush=True)
            _claim(student)
            _sft(student_argv)
            _stamp(student, student_argv)
    else:
        student_argv = ["random-init", "--size", recipe.size, "--seed", "1", "--tokenizer-from", str(teacher)]
        if rebuilt or not _built_with(student, student_argv, "config.json"):
            from divopd.models import load_model
            from divopd.models.tiny import build_model

            _, tokenizer = load_model(str(teacher))
            model = build_model(tokenizer, size=recipe.size, seed=1)
            _claim(student)
            model.save_pretrained(student)
            tokenizer.save_pretrained(student)
            _stamp(student, student_argv)
    return {"teacher": teacher, "student": student}
