"""The README stays true: the two commands first, every CLI command and every config key documented."""

from __future__ import annotations

from pathlib import Path

from divopd.cli import COMMANDS
from divopd.config import config_reference

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_the_two_commands_come_first() -> None:
    first_block = README.split("```")[1]
    assert "make demo" in first_block and "make test" in first_block


def test_every_cli_command_is_documented() -> None:
    for name in COMMANDS:
        assert f"divopd {name}" in README, name


def test_every_config_key_is_documented() -> None:
    for key, *_ in config_reference():
        assert f"`{key}`" in README, key
