-- Events the projector stepped over because the store refused them on their own (a value
-- PostgreSQL cannot hold, a fold that raised on a malformed event): one row per event,
-- keyed by its log position. The position moves past them in the same statement that
-- writes the row (projections/postgres_sql.py SKIP); a reset empties the table and a
-- rebuild records the same events again.
CREATE TABLE projection_skipped (
    position   bigint PRIMARY KEY,
    event_id   text NOT NULL,
    sandbox_id text NOT NULL,
    type       text NOT NULL,
    error      text NOT NULL,
    skipped_at timestamptz NOT NULL
);
