"""What the adapters share below them: the PostgreSQL pool (``storage.pg``), the one numbered
schema and its migrations (``storage.schema``, ``storage/migrations/``), and local spool files
(``storage.spool``: a stream in a temporary file before it goes to a blob store).

It sits between ``core`` and the adapter packages (projections, blobs, drivers, eventlog), so
an adapter that needs one of these imports downward, never a sibling. This module imports
nothing: the nomad driver and the engine import ``storage.spool`` on servers without asyncpg.
"""
