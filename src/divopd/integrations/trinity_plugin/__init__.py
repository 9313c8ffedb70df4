"""Trinity-RFT plug-in directory: point ``trinity run --plugin-dir`` (or ``TRINITY_PLUGIN_DIRS``) at this folder.

Trinity loads every ``*.py`` file here whose name does not start with ``__`` (this file is skipped); the one module,
``divopd_sample_strategy.py``, registers DivOPD's sample strategy as ``divopd``. :data:`PLUGIN_DIR` is the folder::

    trinity run --config alfworld-divopd.yaml \\
        --plugin-dir "$(python -c 'from divopd.integrations.trinity_plugin import PLUGIN_DIR; print(PLUGIN_DIR)')"

Importing this package imports nothing else (no Trinity, no torch).
"""

from pathlib import Path

#: This folder, for ``--plugin-dir``.
PLUGIN_DIR = str(Path(__file__).resolve().parent)
