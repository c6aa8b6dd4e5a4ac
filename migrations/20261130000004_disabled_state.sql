-- A disabled rule reads `disabled` in rule_states (and courier status), never `throttled`
-- or `idle`.
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
