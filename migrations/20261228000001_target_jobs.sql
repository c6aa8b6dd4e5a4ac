-- Asynchronous jobs: a rule may deliver through a target's bulk job (Klaviyo's profile
-- bulk import, Brevo's contacts import). The submit's records are `accepted` (the target
-- has them, their fate is pending) until the job reports; the job is a row here, written
-- in the same transaction as its records' `accepted` rows, before anything else is done
-- with the submit's answer.
CREATE TABLE target_jobs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule_id       bigint NOT NULL REFERENCES rules (id) ON DELETE CASCADE,
    -- The run whose call submitted it (its records' outcomes are that run's).
    run_id        bigint NOT NULL,
    -- The job's id at the target, as its answer named it.
    target_id     text NOT NULL CHECK (target_id <> '' AND length(target_id) <= 200),
    status        text NOT NULL DEFAULT 'submitted'
        CHECK (status IN ('submitted', 'complete', 'failed', 'overdue')),
    -- The deliveries it carries, in the order submitted: an error naming a record's
    -- position names `delivery_ids[position + 1]`.
    delivery_ids  bigint[] NOT NULL CHECK (cardinality(delivery_ids) > 0),
    submitted_at  timestamptz NOT NULL,
    -- Polling: when next, every how long (it grows), how often so far, what it said last.
    next_poll_at  timestamptz NOT NULL,
    poll_every_ms integer NOT NULL CHECK (poll_every_ms > 0),
    polls         integer NOT NULL DEFAULT 0,
    last_poll_at  timestamptz,
    last_said     text,
    -- The process polling it now, and until when (another takes over after).
    lease_owner   text,
    lease_until   timestamptz,
    finished_at   timestamptz,
    error         text,
    CHECK ((status = 'submitted') = (finished_at IS NULL))
);
CREATE INDEX target_jobs_due ON target_jobs (next_poll_at) WHERE status = 'submitted';
CREATE INDEX target_jobs_rule ON target_jobs (rule_id) WHERE status = 'submitted';

-- A delivery the target has as part of a job whose outcome is pending.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_status_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_status_check CHECK (status IN
    ('pending', 'accepted', 'delivered', 'rejected', 'exhausted', 'suppressed'));

-- The ledger row of an accepted delivery, and of its final outcome, names its job.
ALTER TABLE ledger DROP CONSTRAINT ledger_outcome_check;
ALTER TABLE ledger ADD CONSTRAINT ledger_outcome_check CHECK (outcome IN
    ('delivered', 'accepted', 'failed', 'exhausted', 'rejected', 'suppressed', 'held',
     'retried'));
ALTER TABLE ledger ADD COLUMN target_job bigint;

-- How a rule's job is submitted, polled and read (`writer::job::JobShape`); NULL: its
-- calls are synchronous. A job takes up to 10,000 records.
ALTER TABLE rules ADD COLUMN job jsonb CHECK (job IS NULL OR jsonb_typeof(job) = 'object');
ALTER TABLE rules DROP CONSTRAINT rules_records_per_call;
ALTER TABLE rules ADD CONSTRAINT rules_records_per_call CHECK (records_per_call BETWEEN 1 AND 10000);
DROP TRIGGER rules_changed ON rules;
CREATE TRIGGER rules_changed
    BEFORE UPDATE OF path, connection_id, enabled, batch_size, records_per_call, request, answer,
                     job
    ON rules
    FOR EACH ROW EXECUTE FUNCTION courier_rule_changed();

-- A submitted job wakes the pollers (crate::poller), which sleep until the next one is due.
CREATE FUNCTION courier_notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('courier_jobs', '');
    RETURN NULL;
END $$;
CREATE TRIGGER target_jobs_notify AFTER INSERT ON target_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION courier_notify_jobs();

-- A run counts the records it left accepted, beside those it delivered.
ALTER TABLE runs ADD COLUMN accepted integer NOT NULL DEFAULT 0;
