-- How far each worker process's host clock is off the database's (milliseconds; positive:
-- ahead), measured at its every beat. courier keeps time by the database's clock, so this
-- is for the operator (`courier status`), not for any decision.
ALTER TABLE workers ADD COLUMN clock_offset_ms double precision;
