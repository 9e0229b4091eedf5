"""The EventLog port (``core.eventlog.base``). Its adapters do I/O and live in the top-level
``eventlog`` package; ``api.composition`` chooses one from the configuration."""

from hutch.core.eventlog.base import EventLog, LogCapabilities

__all__ = ["EventLog", "LogCapabilities"]
