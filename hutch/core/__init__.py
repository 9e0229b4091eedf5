"""hutch's domain: pure models, events, state machines and the event-log port.

Nothing here does I/O: the event-log adapters live in the top-level ``eventlog`` package
and are chosen by ``api.composition`` (``tests/unit/test_core_is_pure.py`` keeps it so).
"""
