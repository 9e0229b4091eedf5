-- Whose output each stream is (blobs/output_postgres.py): an organization's streams count
-- against its storage quota (service/quotas.py), and a sandbox's are dropped together once it
-- has ended long enough (service/retention.py). A row is made with a stream's first chunk and
-- its byte count kept up to date by every chunk after. Streams saved before this table have no
-- row: they are nobody's (counted by no quota, dropped by no retention).
CREATE TABLE hutch_output_streams (
    stream_id  text COLLATE "C" PRIMARY KEY,
    org_id     text NOT NULL,
    sandbox_id text NOT NULL,
    bytes      bigint NOT NULL
);
CREATE INDEX hutch_output_streams_org ON hutch_output_streams (org_id);
CREATE INDEX hutch_output_streams_sandbox ON hutch_output_streams (sandbox_id);
