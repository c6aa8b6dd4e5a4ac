-- Every run the dispatcher starts maintains each index on `runs`; a pass that starts 5,000
-- spent a tenth of its time on `runs_job_active` alone (#9's scale point). Its one reader
-- was retention's "no active run names this finished job", which now hashes the job ids
-- of the active runs (at most one per rule) once per batch instead. Every other lookup of
-- a run by its job also has the run's id.
DROP INDEX IF EXISTS runs_job_active;
