-- The state read models: sandboxes and executions, folded from the event log by
-- projections.base.fold. The whole object is kept as JSON (doc, the cattrs shape); the
-- columns beside it are what lists filter and sort by.
CREATE TABLE projection_position (
    projection text PRIMARY KEY,
    position   bigint NOT NULL
);
INSERT INTO projection_position (projection, position) VALUES ('state', 0);

CREATE TABLE sandboxes (
    sandbox_id text PRIMARY KEY,
    status     text NOT NULL,
    is_final   boolean NOT NULL,
    name       text COLLATE "C",
    mode       text NOT NULL,
    project_id text,
    created_at text COLLATE "C" NOT NULL,  -- ISO-8601 UTC, fixed width: sorts as time
    updated_at text COLLATE "C" NOT NULL,
    doc        jsonb NOT NULL
);
CREATE INDEX sandboxes_by_created ON sandboxes (created_at, sandbox_id);
CREATE INDEX sandboxes_by_status ON sandboxes (status);
CREATE INDEX sandboxes_by_name ON sandboxes (name);

CREATE TABLE executions (
    execution_id text PRIMARY KEY,
    sandbox_id   text NOT NULL,
    seq          bigint NOT NULL,  -- log position of the event that started it: newest first
    status       text NOT NULL,
    is_final     boolean NOT NULL,
    doc          jsonb NOT NULL
);
CREATE INDEX executions_by_sandbox ON executions (sandbox_id, seq DESC);
CREATE INDEX executions_open ON executions (sandbox_id) WHERE NOT is_final;
