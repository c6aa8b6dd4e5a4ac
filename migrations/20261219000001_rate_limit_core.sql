-- The rate-limit core (src/ratelimit): several limits per budget, a rule's own budget, and
-- a budget's state kept as one JSON document that only Rust computes on.

-- A connection declares any number of `N/window` limits (`10/s`, `100/10s`, `100000/day`);
-- empty: `requests_per_minute` (or the writer's declaration) is the one limit. Each is
-- checked for shape here; src/ratelimit/limits.rs checks the rest and names the problem.
CREATE FUNCTION courier_limits_valid(limits text[]) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(bool_and(l ~ '^[1-9][0-9]{0,9}/[0-9]*(s|min|h|day)$'), true)
    FROM unnest(limits) AS l
$$;
ALTER TABLE connections
    ADD COLUMN limits text[] NOT NULL DEFAULT '{}'
        CONSTRAINT connections_limits_valid CHECK (courier_limits_valid(limits)),
    -- Percent of each window of a minute or longer kept for other clients of the account.
    ADD COLUMN reserve_percent smallint NOT NULL DEFAULT 0
        CONSTRAINT connections_reserve_range CHECK (reserve_percent BETWEEN 0 AND 90);

-- A rule may spend from a budget of its own (an endpoint the target limits apart).
ALTER TABLE rules ADD COLUMN budget_key text CHECK (budget_key <> '');

-- The budget a rule spends from: its own key, else its connection's.
CREATE FUNCTION courier_rule_budget_key(r rules, c connections) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT COALESCE(r.budget_key, courier_budget_key(c))
$$;

-- The budget's state (ratelimit::budget::BudgetState): the pace, each long window's
-- spending, what 429s taught. No formula on it lives in SQL.
DROP VIEW budget_rates;
DROP FUNCTION courier_effective_rpm(integer, double precision, timestamptz, double precision,
                                    double precision, timestamptz, timestamptz);
DROP FUNCTION courier_learned_rpm(double precision, timestamptz, double precision, integer, timestamptz);
DROP FUNCTION courier_advertised_rpm(double precision, timestamptz, timestamptz);
DROP FUNCTION courier_slice_span(double precision);
DROP FUNCTION courier_slice_len(double precision);
DROP FUNCTION courier_slot_interval(double precision);
ALTER TABLE budgets
    DROP COLUMN tat, DROP COLUMN declared_rpm, DROP COLUMN learned_rpm, DROP COLUMN learned_at,
    DROP COLUMN advertised_rpm, DROP COLUMN advertised_at, DROP COLUMN last_429_at,
    DROP COLUMN accepted, DROP COLUMN accepted_since, DROP COLUMN ceiling_rpm,
    DROP COLUMN streak_429, DROP COLUMN learned_by,
    ADD COLUMN state jsonb NOT NULL DEFAULT '{}',
    -- The limits the last lease paced by (as `N/window`), and the reserve, for status.
    ADD COLUMN limits text[] NOT NULL DEFAULT '{}',
    ADD COLUMN reserve_percent smallint NOT NULL DEFAULT 0;

-- How each rule stands: a rule on a blocked budget (its own or its connection's) reads
-- `throttled` unless its own run is waiting it out.
CREATE OR REPLACE VIEW rule_states AS
SELECT r.id AS rule_id, r.name AS rule, c.id AS connection_id, c.name AS connection,
       courier_rule_budget_key(r, c) AS budget_key, r.enabled,
       CASE WHEN lr.active THEN lr.status
            WHEN NOT r.enabled THEN 'disabled'
            WHEN r.paused OR c.paused THEN 'paused'
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
