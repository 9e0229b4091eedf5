-- The audit trail kept by `hutch audit`: one row per event, append-only (a trigger refuses
-- UPDATE and DELETE). source_* say where in Kafka the row came from, so a restarted auditor
-- resumes after the last row it wrote instead of trusting only its group's committed offsets.
CREATE TABLE audit_trail (
    event_id         text PRIMARY KEY,
    position         bigint NOT NULL,
    sandbox_id       text NOT NULL,
    type             text NOT NULL,
    actor            text,
    at               text NOT NULL,
    detail           jsonb NOT NULL,
    recorded_at      timestamptz NOT NULL DEFAULT now(),
    source           text NOT NULL,  -- the log (topic, or 'log' for a non-Kafka log)
    source_partition integer NOT NULL,
    source_offset    bigint NOT NULL
);
CREATE INDEX audit_by_sandbox ON audit_trail (sandbox_id, position);
CREATE INDEX audit_by_actor ON audit_trail (actor, position);
CREATE INDEX audit_by_source ON audit_trail (source, source_partition, source_offset);

CREATE FUNCTION audit_trail_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_trail is append-only';
END $$;
CREATE TRIGGER audit_trail_append_only BEFORE UPDATE OR DELETE ON audit_trail
    FOR EACH ROW EXECUTE FUNCTION audit_trail_is_append_only();
