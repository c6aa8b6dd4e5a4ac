-- Which run states hold their rule is said once, here: `active`. Every statement that asks
-- "does this rule have a run under way?" reads this column instead of repeating the list
-- (the Rust side mirrors it in `RunStatus::is_active`, and a test checks they agree).
ALTER TABLE runs ADD COLUMN active boolean
    GENERATED ALWAYS AS (status IN ('running', 'waiting')) STORED NOT NULL;

ALTER TABLE runs DROP CONSTRAINT runs_check;
ALTER TABLE runs ADD CONSTRAINT runs_finished_when_inactive CHECK (active = (finished_at IS NULL));

DROP INDEX runs_one_active_per_rule;
CREATE UNIQUE INDEX runs_one_active_per_rule ON runs (rule_id) WHERE active;
DROP INDEX runs_active_heartbeat;
CREATE INDEX runs_active_heartbeat ON runs (heartbeat_at) WHERE active;

-- rule_states reads the column too, and a disabled rule reads `disabled`, never
-- `throttled` or `idle`.
CREATE OR REPLACE VIEW rule_states AS
SELECT r.id AS rule_id, r.name AS rule, c.id AS connection_id, c.name AS connection,
       courier_budget_key(c) AS budget_key, r.enabled,
       CASE WHEN lr.active THEN lr.status
            WHEN NOT r.enabled THEN 'disabled'
            WHEN b.blocked_until > now() THEN 'throttled'
            WHEN lr.status = 'stale' THEN 'stale'
            ELSE 'idle' END AS state,
       lr.id AS last_run_id, lr.status AS last_run_status, lr.resume_at,
       CASE WHEN b.blocked_until > now() THEN b.blocked_until END AS blocked_until,
       CASE WHEN b.blocked_until > now() THEN br.name END AS blocked_by_rule,
       CASE WHEN b.blocked_until > now() THEN b.retry_after_raw END AS retry_after_raw
FROM rules r
JOIN connections c ON c.id = r.connection_id
LEFT JOIN connection_blocks b ON b.budget_key = courier_budget_key(c)
LEFT JOIN rules br ON br.id = b.rule_id
LEFT JOIN LATERAL (SELECT x.id, x.status, x.active, x.resume_at FROM runs x WHERE x.rule_id = r.id
                   ORDER BY x.id DESC LIMIT 1) lr ON true;

-- Every process keeps an in-memory copy of the blocks; a written block tells them all.
CREATE FUNCTION courier_notify_blocks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('courier_blocks', NEW.budget_key);
    RETURN NULL;
END $$;
CREATE TRIGGER connection_blocks_notify AFTER INSERT OR UPDATE ON connection_blocks
    FOR EACH ROW EXECUTE FUNCTION courier_notify_blocks();

-- Timestamps a user may write by SQL range from 4713 BC to 294276 AD and ±infinity;
-- courier reads them through this clamp into years 1..9999, which every part of it can
-- add durations to without overflowing.
CREATE FUNCTION courier_ts(t timestamptz) RETURNS timestamptz LANGUAGE sql IMMUTABLE AS $$
    SELECT LEAST(GREATEST(t, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59+00')
$$;
