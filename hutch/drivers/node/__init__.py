"""The node driver: sandboxes placed on ``hutch node`` agents, one per machine (docs/node.md)."""
