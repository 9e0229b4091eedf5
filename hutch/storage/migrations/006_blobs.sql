-- The production profile's blob store (blobs/postgres.py): snapshot archives and disk
-- checkpoints as PostgreSQL large objects, so every API replica reaches them and they
-- outlive the host that made them. A row names one large object; a put creates the
-- object and swaps the row in one transaction, and unlinks the object it replaced.
CREATE TABLE hutch_blobs (
    key     text COLLATE "C" PRIMARY KEY,
    oid     oid NOT NULL,
    size    bigint NOT NULL,
    sha256  text NOT NULL,
    created timestamptz NOT NULL DEFAULT now()
);
