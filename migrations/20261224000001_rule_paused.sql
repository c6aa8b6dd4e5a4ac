-- Whether rule `r` (of connection `k`) is held by a pause, its own or its connection's:
-- the catalog's condition, defined once. The dispatcher starts no run of a paused rule
-- (courier_rule_startable), a chain job's claim takes no batch of it, and rule_states
-- shows it `paused`.
CREATE FUNCTION courier_rule_paused(r rules, k connections)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT r.paused OR k.paused
$$;

CREATE OR REPLACE FUNCTION courier_rule_startable(r rules, k connections, at timestamptz)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT r.enabled AND NOT courier_rule_paused(r, k)
       AND (r.unusable_until IS NULL OR r.unusable_until <= at)
       AND NOT EXISTS (SELECT 1 FROM connection_blocks b
                       WHERE b.budget_key = courier_rule_budget_key(r, k)
                         AND b.blocked_until > at)
       AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.rule_id = r.id AND x.active)
       AND EXISTS (SELECT 1 FROM deliveries d
                   WHERE d.rule_id = r.id AND d.status = 'pending'
                     AND d.next_attempt_at <= at)
$$;

CREATE OR REPLACE VIEW rule_states AS
SELECT r.id AS rule_id, r.name AS rule, c.id AS connection_id, c.name AS connection,
       courier_rule_budget_key(r, c) AS budget_key, r.enabled,
       CASE WHEN lr.active THEN lr.status
            WHEN NOT r.enabled THEN 'disabled'
            WHEN courier_rule_paused(r, c) THEN 'paused'
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
LEFT JOIN connection_blocks b ON b.budget_key = courier_rule_budget_key(r, c)
LEFT JOIN rules br ON br.id = b.rule_id
LEFT JOIN LATERAL (SELECT x.id, x.status, x.active, x.resume_at FROM runs x WHERE x.rule_id = r.id
                   ORDER BY x.id DESC LIMIT 1) lr ON true;
