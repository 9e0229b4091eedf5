"""Where a local server keeps its data: one convention shared by server and client.

Reads the environment only (no disk I/O), so it may live in core.
"""

from __future__ import annotations

import os
from pathlib import Path

API_KEY_FILE = "api-key"
LOCK_FILE = "server.lock"  # held (flock) by the server or in-process engine using the data dir
URL_FILE = "server.url"  # where a server on the data dir listens, while it does


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/hutch``, else ``~/.local/share/hutch`` (``HUTCH_DATA_DIR`` is applied by callers)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return Path(base) / "hutch"
