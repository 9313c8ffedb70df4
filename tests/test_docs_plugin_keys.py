"""The config reference lists every key the framework plug-ins accept, from the tables they validate with."""

from __future__ import annotations

from pathlib import Path

import pytest

from divopd.integrations.plugin_keys import TRINITY_ARGS, VERL_KWARGS, plugin_key_reference

CONFIG_PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "config.md"


@pytest.mark.parametrize("defaults", [TRINITY_ARGS, VERL_KWARGS], ids=["trinity", "verl"])
def test_every_plugin_key_has_a_meaning_and_a_row_on_the_config_page(defaults: dict) -> None:
    page = CONFIG_PAGE.read_text()
    section = page[page.index("## Plug-in keys"):]
    rows = plugin_key_reference(defaults)
    assert [key for key, _, _ in rows] == list(defaults)
    for key, _, meaning in rows:
        assert meaning.strip()
        assert f"| `{key}` |" in section, key


def test_a_key_without_a_meaning_is_refused_by_the_generator() -> None:
    with pytest.raises(KeyError, match="no_such_key"):
        plugin_key_reference({"no_such_key": 1})


def test_the_plugin_tables_hold_the_sampler_settings_and_the_dispatch_keys() -> None:
    for defaults in (TRINITY_ARGS, VERL_KWARGS):
        assert {"method", "pool_factor", "cap", "max_pending_age", "target_arrival_ratio", "experience_dir"} <= set(
            defaults)
    assert VERL_KWARGS["dispatch"] == "matched" and "dispatch" not in TRINITY_ARGS
