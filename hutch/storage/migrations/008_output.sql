-- The production profile's output streams (blobs/output_postgres.py): executions'
-- stdout/stderr as chunks, so any API replica serves a stream and it outlives the host
-- that ran the command. A chunk covers [start_pos, end_pos) of its stream; a writer saves
-- them in order. Whether a stream is still open is its writer's session advisory lock,
-- not a column. Chunks are never deleted (as output files are kept).
CREATE TABLE hutch_output_chunks (
    stream_id text COLLATE "C" NOT NULL,
    start_pos bigint NOT NULL,
    end_pos   bigint NOT NULL,
    data      bytea NOT NULL,
    PRIMARY KEY (stream_id, end_pos)
);

-- Secrets every replica must share, made once by the first (stream ids are signed with
-- "stream-ids": api/stream_ids.py).
CREATE TABLE hutch_secrets (
    name  text PRIMARY KEY,
    value bytea NOT NULL
);
