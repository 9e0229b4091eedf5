-- Tenancy (core.tenancy): organizations, projects and API keys folded from their events,
-- one row per record (kind org | project | key, the cattrs shape in doc). Sandboxes and
-- snapshots get the organization they belong to: rows from before tenancy are org_local's,
-- which is the whole upgrade of an existing store.
CREATE TABLE tenancy (
    kind   text NOT NULL,
    id     text NOT NULL,
    org_id text NOT NULL,
    doc    jsonb NOT NULL,
    PRIMARY KEY (kind, id)
);
ALTER TABLE sandboxes ADD COLUMN org_id text NOT NULL DEFAULT 'org_local';
CREATE INDEX sandboxes_by_org ON sandboxes (org_id, created_at);
ALTER TABLE snapshots ADD COLUMN org_id text NOT NULL DEFAULT 'org_local';
CREATE INDEX snapshots_by_org ON snapshots (org_id, name, tag);
ALTER TABLE audit_trail ADD COLUMN org_id text NOT NULL DEFAULT 'org_local';
ALTER TABLE audit_trail ADD COLUMN project_id text;
CREATE INDEX audit_by_org ON audit_trail (org_id, position);
