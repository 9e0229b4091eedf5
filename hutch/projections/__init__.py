"""Read models folded from the event log, their stores, and the runner that tails the log."""
