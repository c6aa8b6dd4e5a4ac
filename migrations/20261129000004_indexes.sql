-- The dispatcher sleeps until the earliest moment something becomes due; this index
-- answers "the next pending delivery's next_attempt_at" without a scan.
CREATE INDEX deliveries_next_due ON deliveries (next_attempt_at) WHERE status = 'pending';

-- The reaper's pruning of old call counts.
CREATE INDEX budget_calls_at ON budget_calls (at);
-- A rule's latest run (rule_states, status).
CREATE INDEX runs_rule_latest ON runs (rule_id, id DESC);
