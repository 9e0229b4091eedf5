"""``hutch node``: the agent on every machine of a cluster (docs/node.md).

One ``LocalDriver`` behind a signed HTTPS API (``hutch/drivers/node/wire.py``): the node driver
in the API places sandboxes here and sends every driver call to the agent that runs the
sandbox. The agent holds no record: the event log stays the API's (an import-linter contract
keeps the service, the API, projections, event logs and blob stores out of this package).
"""
