"""Where ``local_client`` used to live; it is :func:`hutch.client.local_client` now, and the
engine it runs is hutch/_embedded.py (which only the connection imports)."""

from hutch.client import local_client

__all__ = ["local_client"]
