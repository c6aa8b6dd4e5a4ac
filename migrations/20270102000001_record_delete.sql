-- A delivery's kind: `upsert` (the record as it is, the default) or `delete` (the record
-- removed at the shop, to be removed at the target as its rule's `request.delete` says).
-- Supersession is the same for both: the newest delivery of a (rule, key) wins, so a
-- delete supersedes the pending upserts before it, and an upsert a pending delete.
ALTER TABLE deliveries ADD COLUMN op text NOT NULL DEFAULT 'upsert'
    CONSTRAINT deliveries_op CHECK (op IN ('upsert', 'delete'));
