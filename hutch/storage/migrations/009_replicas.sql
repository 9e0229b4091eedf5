-- API replicas on one log and one database (core/replicas.py, projections/replicas.py).
-- A replica's lease runs until expires_at (the database's clock, so replicas on hosts with
-- skewed clocks agree); claimed_by is the survivor that took its sandboxes over.
CREATE TABLE hutch_replicas (
    replica_id text PRIMARY KEY,
    url        text NOT NULL,
    expires_at timestamptz NOT NULL,
    claimed_by text
);

-- One owner per live sandbox: the replica whose driver runs it and that alone appends its
-- lifecycle events. handle: what the owner's driver needs to adopt the sandbox elsewhere
-- (the nomad driver: its job and allocation ids), null until the sandbox is placed.
CREATE TABLE hutch_sandbox_owners (
    sandbox_id text PRIMARY KEY,
    replica_id text NOT NULL,
    handle     jsonb
);
CREATE INDEX hutch_sandbox_owners_replica ON hutch_sandbox_owners (replica_id);
