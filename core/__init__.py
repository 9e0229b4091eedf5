"""hutch's domain: pure models, events, state machines and the event-log port.

Nothing here does I/O except the adapters under ``core.eventlog``.
"""
