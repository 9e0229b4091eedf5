-- The identity of the event log this store folds (EventLog.identity): a store refuses
-- to follow any other log (projections.runner). NULL: not bound yet (a new store, or one
-- made before identities existed: it binds to the first log it meets that holds at
-- least as much as the store has applied).
ALTER TABLE projection_position ADD COLUMN log_identity text;
