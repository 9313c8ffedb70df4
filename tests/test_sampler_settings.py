"""One sampler-settings table (divopd.sampling.settings) behind the sampler, the training config, replay, tune-cap
and their CLI flags."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from divopd.analysis.replay import ReplayConfig
from divopd.analysis.replay import add_arguments as replay_flags
from divopd.analysis.tune_cap import add_arguments as tune_cap_flags
from divopd.sampling import SamplerConfig
from divopd.sampling.settings import SAMPLER_SETTINGS, add_sampler_flags, sampler_kwargs, settings_from_args
from divopd.train.config import TrainConfig

NAMES = [s.name for s in SAMPLER_SETTINGS]


def test_every_holder_has_exactly_the_table_s_settings_and_defaults() -> None:
    for cls in (SamplerConfig, ReplayConfig):
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        for s in SAMPLER_SETTINGS:
            if cls is SamplerConfig and s.name == "batch_size":
                continue  # required in SamplerConfig
            expected = 256 if (cls is ReplayConfig and s.name == "batch_size") else s.default
            assert fields[s.name] == expected, (cls.__name__, s.name)
    section = TrainConfig.model_fields["sampler"].annotation
    assert list(section.model_fields) == NAMES
    for s in SAMPLER_SETTINGS:
        assert section.model_fields[s.name].default == s.default
        assert section.model_fields[s.name].description == s.description


def test_the_training_config_hands_every_setting_to_the_sampler() -> None:
    cfg = TrainConfig.model_validate({
        "setting": "x", "method": "divopd-r", "seed": 3, "student": {"path": "s"}, "teacher": {"path": "t"},
        "explorer": {"recovery": {"enabled": True}},
        "sampler": {"batch_size": 7, "pool_factor": 2.5, "cap": 3, "max_staleness": 1, "max_pending": 9,
                    "cap_unit": "tokens", "max_pending_age": None, "group_order": "first-seen"}})
    sc = cfg.sampler_config()
    assert (sc.method, sc.seed) == ("divopd", 3)
    assert sampler_kwargs(sc) == {"batch_size": 7, "pool_factor": 2.5, "cap": 3, "max_staleness": 1,
                                  "max_pending": 9, "cap_unit": "tokens", "max_pending_age": None,
                                  "group_order": "first-seen"}


@pytest.mark.parametrize("name,bad", [("batch_size", 0), ("pool_factor", 0.5), ("cap", 0), ("max_staleness", -1),
                                      ("max_pending", -1), ("cap_unit", "bytes"), ("max_pending_age", -1),
                                      ("group_order", "random"), ("group_order", "arrival")])
def test_every_holder_rejects_the_same_bad_values(name: str, bad: object) -> None:
    with pytest.raises(ValueError, match=f"SamplerConfig.{name}"):
        SamplerConfig("divopd", **{"batch_size": 4, name: bad})
    with pytest.raises(ValueError, match=name):
        ReplayConfig(methods=["divopd"], **{name: bad})
    with pytest.raises(ValueError, match=name):
        TrainConfig.model_fields["sampler"].annotation.model_validate({name: bad})


def test_cli_flags_are_generated_from_the_table() -> None:
    for add, skip in ((replay_flags, ()), (tune_cap_flags, ("cap",))):
        parser = argparse.ArgumentParser()
        add(parser)
        flags = {a.dest for a in parser._actions}
        assert {n for n in NAMES if n not in skip} <= flags
    parser = argparse.ArgumentParser()
    add_sampler_flags(parser, defaults={"batch_size": 256})
    args = parser.parse_args(["--pool-factor", "3", "--max-pending", "none", "--cap-unit", "tokens"])
    assert settings_from_args(args) == {"batch_size": 256, "pool_factor": 3, "cap": 4, "max_staleness": 2,
                                        "max_pending": None, "cap_unit": "tokens", "max_pending_age": 8,
                                        "group_order": "first-seen"}
