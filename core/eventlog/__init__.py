"""The EventLog port and its adapters. The only I/O in ``core``."""

from core.eventlog.base import EventLog, open_event_log

__all__ = ["EventLog", "open_event_log"]
