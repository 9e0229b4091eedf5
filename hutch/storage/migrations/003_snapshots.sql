-- The snapshots read model, folded by core.snapshots.evolve_snapshot from the snapshot
-- events (keyed by snapshot id). Kept as JSON like the others; the columns are what lists
-- and reference lookups (name:tag, content hash) filter and sort by.
CREATE TABLE snapshots (
    snapshot_id       text PRIMARY KEY,
    status            text NOT NULL,
    name              text COLLATE "C" NOT NULL,
    tag               text COLLATE "C",
    public            boolean NOT NULL,
    source_sandbox_id text,
    content_hash      text,
    size_bytes        bigint NOT NULL,
    file_count        bigint NOT NULL,
    created_at        text COLLATE "C" NOT NULL,
    doc               jsonb NOT NULL
);
CREATE INDEX snapshots_by_name ON snapshots (name, tag);
CREATE INDEX snapshots_by_tag ON snapshots (tag);
CREATE INDEX snapshots_by_created ON snapshots (created_at, snapshot_id);
