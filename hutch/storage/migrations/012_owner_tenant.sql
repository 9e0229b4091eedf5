-- Whose each owned sandbox is (its organization and project), written with its owner row
-- before the driver makes it: a survivor that ends one no event records (its replica was
-- lost before appending its create: service/takeover.py) files that end, lifecycle:discarded,
-- under the tenant that asked for it, not under no organization (org_local). Rows written
-- before this migration, or by a replica older than it, have none: their end is filed as
-- before.
ALTER TABLE hutch_sandbox_owners ADD COLUMN org_id text, ADD COLUMN project_id text;
