"""Integration tests run in each framework's own venv (``make test-integrations``); the default suite skips them.

``tests/integrations/<framework>/`` is collected only where that framework imports (``.venv-trinity`` for
``trinity``); under ``.venv`` (``make test``) the folder is left out, and ``pytest -rs`` shows nothing from it.
"""

from __future__ import annotations

import importlib.util

import pytest

#: framework folder -> a module of the installed framework (not the bare name: this folder's ``trinity/`` would
#: itself be found as a namespace package ``trinity`` where the framework is not installed)
FRAMEWORKS = {"trinity": "trinity.algorithm.sample_strategy", "verl": "verl.trainer"}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent is missing, or is not a package
        return False


collect_ignore = [folder for folder, module in FRAMEWORKS.items() if not _installed(module)]


@pytest.fixture
def jvms_closed():
    """After the test (passed or failed), every JVM its env instances started has ended (their ``close()`` ran)."""
    from real_envs import java_descendants, wait_jvms_closed

    before = java_descendants()
    yield
    left = wait_jvms_closed(before)
    # not killed here: a killed JVM leaves its env's gateway blocking at interpreter exit; a JVM ends with the test
    # process anyway (py4j's --die-on-broken-pipe)
    assert not left, f"JVM processes left running after the test: {sorted(left)}"
