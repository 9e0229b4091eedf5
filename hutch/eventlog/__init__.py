"""The EventLog adapters that do I/O: SQLite (``eventlog.sqlite``, the embedded default) and
Apache Kafka (``eventlog.kafka``, the production profile). The port they implement lives in
``core.eventlog``; ``api.composition`` picks one from the configuration."""
