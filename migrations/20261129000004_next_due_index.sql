-- The dispatcher sleeps until the earliest moment something becomes due; this index
-- answers "the next pending delivery's next_attempt_at" without a scan.
CREATE INDEX deliveries_next_due ON deliveries (next_attempt_at) WHERE status = 'pending';
