"""Integration tests run in each framework's own venv (``make test-integrations``); the default suite skips them.

``tests/integrations/<framework>/`` is collected only where that framework imports (``.venv-trinity`` for
``trinity``); under ``.venv`` (``make test``) the folder is left out, and ``pytest -rs`` shows nothing from it.
"""

from __future__ import annotations

import importlib.util

#: framework folder -> the module that must import for its tests to be collected
FRAMEWORKS = {"trinity": "trinity.algorithm.sample_strategy", "verl": "verl"}

collect_ignore = [folder for folder, module in FRAMEWORKS.items()
                  if importlib.util.find_spec(module.split(".")[0]) is None]
