-- Operating courier (issue #10): pausing rules and connections, retrying failed deliveries
-- by hand, lifting blocks, and removing old rows (retention).

-- A pause is a column, not memory: it survives restarts and is seen by every process. The
-- dispatcher starts no run for a paused rule, nor for a rule on a paused connection; a run
-- under way stops at its next batch and ends `paused`, its backlog left pending.
ALTER TABLE rules ADD COLUMN paused boolean NOT NULL DEFAULT false;
ALTER TABLE connections ADD COLUMN paused boolean NOT NULL DEFAULT false;

ALTER TABLE runs DROP CONSTRAINT runs_status_check;
ALTER TABLE runs ADD CONSTRAINT runs_status_check CHECK (status IN
    ('running', 'waiting', 'completed', 'circuit_open', 'throttled', 'stale', 'failed', 'paused'));

-- `courier retry` makes exhausted and rejected deliveries pending again and says so in the
-- ledger: outcome `retried`, no run, and who asked in `actor`.
ALTER TABLE ledger ALTER COLUMN run_id DROP NOT NULL;
ALTER TABLE ledger ADD COLUMN actor text;
ALTER TABLE ledger DROP CONSTRAINT ledger_outcome_check;
ALTER TABLE ledger ADD CONSTRAINT ledger_outcome_check CHECK (outcome IN
    ('delivered', 'failed', 'exhausted', 'rejected', 'suppressed', 'held', 'retried'));
ALTER TABLE ledger ADD CONSTRAINT ledger_run_unless_retried
    CHECK ((run_id IS NULL) = (outcome = 'retried'));
-- `courier history KEY`: a record key's deliveries across rules.
CREATE INDEX deliveries_record_key ON deliveries (record_key);

-- A lifted block (a deleted row) must reach every process's in-memory copy too.
CREATE OR REPLACE FUNCTION courier_notify_blocks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('courier_blocks', OLD.budget_key);
    ELSE
        PERFORM pg_notify('courier_blocks', NEW.budget_key);
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER connection_blocks_notify ON connection_blocks;
CREATE TRIGGER connection_blocks_notify AFTER INSERT OR UPDATE OR DELETE ON connection_blocks
    FOR EACH ROW EXECUTE FUNCTION courier_notify_blocks();

-- Retention finds old finished rows by index, a bounded batch at a time.
CREATE INDEX deliveries_finished ON deliveries (finished_at)
    WHERE status IN ('delivered', 'suppressed');
CREATE INDEX runs_finished ON runs (finished_at) WHERE NOT active;
CREATE INDEX runs_job_active ON runs (job_id) WHERE active;
CREATE INDEX apalis_jobs_done_at ON apalis.jobs (done_at) WHERE status IN ('Done', 'Killed');

-- rule_states tells a paused rule (or a rule on a paused connection) apart.
CREATE OR REPLACE VIEW rule_states AS
SELECT r.id AS rule_id, r.name AS rule, c.id AS connection_id, c.name AS connection,
       courier_budget_key(c) AS budget_key, r.enabled,
       CASE WHEN lr.active THEN lr.status
            WHEN NOT r.enabled THEN 'disabled'
            WHEN r.paused OR c.paused THEN 'paused'
            WHEN b.blocked_until > now() THEN 'throttled'
            WHEN lr.status = 'stale' THEN 'stale'
            ELSE 'idle' END AS state,
       lr.id AS last_run_id, lr.status AS last_run_status, lr.resume_at,
       CASE WHEN b.blocked_until > now() THEN b.blocked_until END AS blocked_until,
       CASE WHEN b.blocked_until > now() THEN br.name END AS blocked_by_rule,
       CASE WHEN b.blocked_until > now() THEN b.retry_after_raw END AS retry_after_raw,
       r.paused AS rule_paused, c.paused AS connection_paused
FROM rules r
JOIN connections c ON c.id = r.connection_id
LEFT JOIN connection_blocks b ON b.budget_key = courier_budget_key(c)
LEFT JOIN rules br ON br.id = b.rule_id
LEFT JOIN LATERAL (SELECT x.id, x.status, x.active, x.resume_at FROM runs x WHERE x.rule_id = r.id
                   ORDER BY x.id DESC LIMIT 1) lr ON true;
