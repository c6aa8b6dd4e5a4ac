-- The erasure gate's look at new deliveries: every delivery enqueued after this id has not
-- yet been checked against the erased by keyed hash (the worker checks, since the database
-- never holds the key). One row.
CREATE TABLE erasure_gate (
    one      boolean PRIMARY KEY DEFAULT true CHECK (one),
    swept_to bigint NOT NULL
);
INSERT INTO erasure_gate (swept_to) SELECT COALESCE(max(id), 0) FROM deliveries;
