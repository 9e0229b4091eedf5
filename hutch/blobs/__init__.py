"""Blob store adapters (the port is ``core.blobs``): files under the data dir
(``blobs.files``) and PostgreSQL large objects (``blobs.postgres``); the output-stream
adapters (``blobs.output_files``, ``blobs.output_postgres``; the port is ``core.output``).

``service.composition.open_blob_store`` picks the adapter from the store setting the server
already has: a PostgreSQL projection store (the production profile) means PostgreSQL large
objects, anything else plain files under the data dir. The helpers callers share (spooling
to a local file before a put, fetching a named local copy) are ``storage.spool``.
"""
