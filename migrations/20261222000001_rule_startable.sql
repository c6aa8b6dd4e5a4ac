-- Whether the dispatcher may start a run of rule `r` (of connection `k`) at `at`, its
-- circuit aside: the rule enabled and neither it nor its connection paused, not set aside
-- as unusable, the budget it spends from (its own or its connection's) not blocked, no run
-- of it active, a delivery due. Both of the dispatcher's passes (rules of closed circuits,
-- and the probe of a cooled-down open circuit) ask this one question.
CREATE FUNCTION courier_rule_startable(r rules, k connections, at timestamptz)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT r.enabled AND NOT r.paused AND NOT k.paused
       AND (r.unusable_until IS NULL OR r.unusable_until <= at)
       AND NOT EXISTS (SELECT 1 FROM connection_blocks b
                       WHERE b.budget_key = courier_rule_budget_key(r, k)
                         AND b.blocked_until > at)
       AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.rule_id = r.id AND x.active)
       AND EXISTS (SELECT 1 FROM deliveries d
                   WHERE d.rule_id = r.id AND d.status = 'pending'
                     AND d.next_attempt_at <= at)
$$;
