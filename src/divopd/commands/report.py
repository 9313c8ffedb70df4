"""``divopd report``: the flags and the entry point live with the library code in :mod:`divopd.analysis.report`."""

from __future__ import annotations

import argparse

from divopd.analysis import report as _lib

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _lib.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return int(_lib.run(args) or 0)
