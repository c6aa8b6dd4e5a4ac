-- Retention removes a finished target job once no ledger row names it any more (its
-- records' rows went first): the ledger is searched by job, the jobs by their end.
CREATE INDEX ledger_target_job ON ledger (target_job) WHERE target_job IS NOT NULL;
CREATE INDEX target_jobs_finished ON target_jobs (finished_at) WHERE status <> 'submitted';
