-- Liveness by process: every worker process beats here every few seconds. A process whose
-- beat has lapsed is dead; the chain job it held resumes elsewhere, in the same run.
CREATE TABLE workers (
    name         text PRIMARY KEY,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL
);

-- The apalis job carrying a run's chain now. Only that job may move the run on (record
-- outcomes, continue, finish); a job the run has moved past does nothing.
ALTER TABLE runs ADD COLUMN job_id text;
