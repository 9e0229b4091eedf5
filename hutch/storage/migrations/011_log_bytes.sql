-- What each sandbox's events take in the event log (SandboxState.log_bytes, folded with its
-- state): summed by organization, it counts against the storage quota (service/quotas.py),
-- since the log is kept for ever. Rows folded before this column count from their next
-- event on; a rebuild of the projections counts them whole.
ALTER TABLE sandboxes ADD COLUMN log_bytes bigint NOT NULL DEFAULT 0;
