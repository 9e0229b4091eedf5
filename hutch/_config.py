"""Where a client finds its server and its key, without importing the server.

The data-dir convention itself is ``core.paths``, shared with the server.
"""

from __future__ import annotations

import os
from pathlib import Path

from hutch.core.paths import API_KEY_FILE, LOCK_FILE, URL_FILE, default_data_dir

__all__ = [
    "API_KEY_FILE",
    "DEFAULT_URL",
    "data_dir",
    "data_dir_in_use",
    "default_data_dir",
    "local_server_url",
    "resolve_api_key",
    "resolve_url",
]

DEFAULT_URL = "http://127.0.0.1:8700"


def data_dir() -> Path:
    """The local server's data dir as a client sees it: ``HUTCH_DATA_DIR`` wins over the default."""
    explicit = os.environ.get("HUTCH_DATA_DIR")
    return Path(explicit) if explicit else default_data_dir()


def resolve_url(url: str | None = None) -> str | None:
    """Where a client's server is, one rule for every entry point (SDK, CLI, Workspace):
    the argument, then ``HUTCH_URL``, then the server running on this machine's data dir
    (``hutch serve`` writes its address there); None: no server, use the embedded engine
    (the engine inside this process, on the data dir)."""
    found = url or os.environ.get("HUTCH_URL") or local_server_url()
    return found.rstrip("/") if found else None


def local_server_url() -> str | None:
    """The address of the ``hutch serve`` using the data dir, if one runs now."""
    where = data_dir()
    try:
        text = (where / URL_FILE).read_text().strip()
    except OSError:
        return None
    return text if text and data_dir_in_use(where) else None


def data_dir_in_use(where: Path) -> bool:
    """Whether a server (or an in-process engine) holds the data dir's lock."""
    import fcntl

    try:
        fd = os.open(where / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock taken here
    return False


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
