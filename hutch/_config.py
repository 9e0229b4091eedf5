"""Where a client finds its server and its key, without importing the server.

The data-dir convention itself is ``core.paths``, shared with the server.
"""

from __future__ import annotations

import os
from pathlib import Path

from hutch.core.paths import API_KEY_FILE, default_data_dir

__all__ = [
    "API_KEY_FILE",
    "DEFAULT_URL",
    "data_dir",
    "default_data_dir",
    "resolve_api_key",
    "resolve_url",
]

DEFAULT_URL = "http://127.0.0.1:8700"


def data_dir() -> Path:
    """The local server's data dir as a client sees it: ``HUTCH_DATA_DIR`` wins over the default."""
    explicit = os.environ.get("HUTCH_DATA_DIR")
    return Path(explicit) if explicit else default_data_dir()


def resolve_url(url: str | None = None) -> str:
    return (url or os.environ.get("HUTCH_URL") or DEFAULT_URL).rstrip("/")


def resolve_api_key(api_key: str | None = None) -> str | None:
    """Argument, then ``HUTCH_API_KEY``, then ``<data_dir>/api-key`` of a local server, else None."""
    if api_key:
        return api_key
    from_env = os.environ.get("HUTCH_API_KEY")
    if from_env:
        return from_env
    try:
        text = (data_dir() / API_KEY_FILE).read_text().strip()
    except OSError:
        return None
    return text or None
