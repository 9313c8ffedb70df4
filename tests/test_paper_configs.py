"""The six paper settings (PAPER-APPENDIX Tables 3-6): the packaged setting <env> (divopd/configs/<env>.yaml) is the
smaller student, the `--set` line in its header comment the larger one; every method row of the three environments
carries the shared values."""

from __future__ import annotations

import re

import pytest

from divopd.train.config import load_config
from divopd.train.packaged import CONFIGS

#: setting -> (env, student, teacher, k, horizon, updates)
SETTINGS = {
    "alfworld-1.7b": ("alfworld", "Qwen/Qwen3-1.7B", "langfeng01/GiGPO-Qwen2.5-7B-Instruct-ALFWorld", 4, 30, 250),
    "alfworld-4b": ("alfworld", "Qwen/Qwen3-4B", "langfeng01/GiGPO-Qwen2.5-7B-Instruct-ALFWorld", 4, 30, 250),
    "webshop-3b": ("webshop", "Qwen/Qwen2.5-3B-Instruct", "langfeng01/GiGPO-Qwen2.5-7B-Instruct-WebShop", 5, 15, 150),
    "webshop-7b": ("webshop", "Qwen/Qwen2.5-7B-Instruct", "langfeng01/GiGPO-Qwen2.5-7B-Instruct-WebShop", 4, 15, 150),
    "scienceworld-1.5b": ("scienceworld", "Qwen/Qwen2.5-1.5B-Instruct", "fnlp/Embodied_R1-ScienceWorld", 4, 30, 250),
    "scienceworld-3b": ("scienceworld", "Qwen/Qwen2.5-3B-Instruct", "fnlp/Embodied_R1-ScienceWorld", 5, 30, 250),
}
METHODS = ["vanilla", "vanilla-pool", "nocap", "divopd-base", "divopd", "divopd-focus", "top-b", "divopd-r",
           "tcod-f2b", "turnopd"]


def larger_student_overrides(env: str) -> list[str]:
    """The `--set` items of the `divopd train <env> --method divopd --set ...` line in the header comment of the
    setting (the larger student; any method row takes the same items)."""
    lines = [line for line in (CONFIGS / f"{env}.yaml").read_text().splitlines()
             if line.startswith("#") and f"divopd train {env} --method divopd --set" in line]
    assert len(lines) == 1, lines
    return re.findall(r"--set (\S+)", lines[0])


def setting_config(setting: str, method: str = "divopd"):
    env = SETTINGS[setting][0]
    base = load_config(env, [f"method={method}"])
    if base.setting == setting:
        return base
    return load_config(env, [f"method={method}", *larger_student_overrides(env)])


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("method", METHODS)
def test_paper_setting_values(setting: str, method: str) -> None:
    env, student, teacher, k, horizon, updates = SETTINGS[setting]
    cfg = setting_config(setting, method)
    assert cfg.setting == setting and cfg.method == method and cfg.explorer.env == env
    assert cfg.student.path == student
    assert cfg.teacher.path == teacher
    s = cfg.sampler
    assert (s.batch_size, s.pool_factor, s.cap, s.max_staleness) == (64, 4, k, 2)
    assert s.max_pending_age == 8 and s.group_order == "first-seen"  # W and Algorithm 1's group order
    lr = cfg.learner
    assert (lr.lr, tuple(lr.betas), lr.weight_decay, lr.grad_clip) == (1e-6, (0.9, 0.999), 0.01, 1.0)
    assert (lr.beta, lr.reduction) == (1.0, "seq-mean-token-mean")
    assert cfg.explorer.max_steps == horizon and cfg.updates == updates
    assert cfg.explorer.generation.temperature == 1.0 and not cfg.explorer.generation.greedy
    assert cfg.eval.temperature == 0.4 and not cfg.eval.greedy
    assert cfg.eval.tasks == cfg.explorer.eval_tasks


def test_paper_configs_set_the_pending_age() -> None:
    for env in ("alfworld", "webshop", "scienceworld"):
        text = (CONFIGS / f"{env}.yaml").read_text()
        assert "max_pending_age: 8" in text


def test_scienceworld_configs_use_the_paper_split() -> None:
    for setting in ("scienceworld-1.5b", "scienceworld-3b"):
        ex = setting_config(setting).explorer
        assert ex.env_kwargs == {"split_scheme": "paper", "split_seed": 42}
        assert (ex.split, ex.eval_split, ex.eval_tasks, ex.task_order) == ("train", "test", 256, "cycle")


@pytest.mark.parametrize("env", ["alfworld", "webshop", "scienceworld"])
def test_the_recovery_lines_of_the_larger_students_load(env: str) -> None:
    """The +R settings of the larger student (Appendix G), the `divopd train <env> --method divopd-r` comment line."""
    lines = [line for line in (CONFIGS / f"{env}.yaml").read_text().splitlines()
             if f"divopd train {env} --method divopd-r" in line]
    assert len(lines) == 1, lines
    cfg = load_config(env, ["method=divopd-r", *re.findall(r"--set (\S+)", lines[0])])
    assert cfg.explorer.recovery.enabled and cfg.setting != load_config(env).setting


@pytest.mark.parametrize("env", ["alfworld", "webshop", "scienceworld"])
def test_method_rows_of_the_new_readings(env: str) -> None:
    top_b = load_config(env, ["method=top-b"])
    assert top_b.sampler_config().method == "top-b"
    focus = load_config(env, ["method=divopd-focus"])
    assert focus.sampler_config().method == "divopd-focus"
    turnopd = load_config(env, ["method=turnopd"])
    assert turnopd.sampler_config().method == "vanilla" and turnopd.turnopd.enabled
    assert turnopd.learner.depth_stats and turnopd.learner.turn_balance_updates == turnopd.updates
    assert not turnopd.tcod.enabled and not turnopd.explorer.recovery.enabled


def test_eval_tasks_is_the_one_key_for_the_tasks_per_evaluation() -> None:
    """``eval.tasks`` sets the held-out tasks per evaluation; ``explorer.eval_tasks`` set to another number in a run
    config is refused with one line; a run's config.yaml (both keys, equal) reloads."""
    from divopd.errors import ConfigError
    from divopd.train.config import load_config

    base = {"setting": "t", "method": "vanilla", "student": {"path": "s"}, "teacher": {"path": "t"},
            "explorer": {"env": "tiny"}}
    cfg = load_config(data={**base, "eval": {"tasks": 7}})
    assert (cfg.eval.tasks, cfg.explorer.eval_tasks) == (7, 7)
    with pytest.raises(ConfigError, match="explorer.eval_tasks: not a run-config key"):
        load_config(data={**base, "explorer": {"env": "tiny", "eval_tasks": 9}})
    again = load_config(data=cfg.model_dump())
    assert (again.eval.tasks, again.explorer.eval_tasks) == (7, 7)
