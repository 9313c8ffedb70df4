"""Trinity-RFT plug-in directory: point ``trinity run --plugin-dir`` (or ``TRINITY_PLUGIN_DIRS``) at :data:`PLUGIN_DIR`.

Trinity loads every ``*.py`` file here not starting with ``__``; importing this package imports no Trinity or torch.
"""

from pathlib import Path

#: This folder, for ``--plugin-dir``.
PLUGIN_DIR = str(Path(__file__).resolve().parent)
