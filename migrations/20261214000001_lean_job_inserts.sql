-- Inserting chain jobs costs less: a dispatcher pass that starts 5,000 runs inserts 5,000
-- rows into apalis.jobs in one statement (#9's scale point).
--
-- 1. apalis' migrations leave two pairs of identical indexes: `unique_job_id` repeats the
--    primary key on `id`, `lidx` repeats `idx_apalis_jobs_lock_by` on `lock_by`. Every
--    insert and every status change kept both copies up to date.
-- 2. apalis' notify trigger runs once per row and sends one notification per job, each with
--    its own payload (id, run_at), so PostgreSQL cannot fold them. courier's queue listener
--    reads only the queue's name (`job_type`) and rings its fetcher once per burst
--    (src/queue/listener.rs). The trigger now runs once per statement and sends one
--    notification per queue among the rows already due, as apalis' first version of it did.
--    apalis' own pubsub listener, which courier does not use, ignores a payload without an
--    id and finds such jobs by its poll.
DROP INDEX IF EXISTS apalis.unique_job_id;
DROP INDEX IF EXISTS apalis.lidx;

DROP TRIGGER IF EXISTS notify_workers ON apalis.jobs;
CREATE OR REPLACE FUNCTION apalis.notify_new_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('apalis::job::insert', json_build_object('job_type', q.job_type)::text)
    FROM (SELECT DISTINCT job_type FROM new_jobs WHERE run_at <= now()) AS q;
    RETURN NULL;
END;
$$;
CREATE TRIGGER notify_workers AFTER INSERT ON apalis.jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION apalis.notify_new_jobs();
