"""The application: what hutch does, apart from how it is asked (HTTP in api/, SSH, the CLI).

A command goes route -> service -> decide -> log -> projection -> driver: the engine
(engine.py) holds the collaborators (provisioning, reads, control, executions, snapshots,
checkpoints, archives, quotas, tenancy …). Nothing here imports aiohttp's server or asyncssh.
"""
