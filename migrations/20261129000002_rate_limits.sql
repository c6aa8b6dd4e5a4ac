-- Rate limits as a signal (ADR-0036 and beyond): budgets, blocks, waiting/throttled runs.

-- Connections naming the same budget key (e.g. the workspace) share one budget and one
-- block; without one, a connection is its own budget (`connection:<id>`).
ALTER TABLE connections ADD COLUMN budget_key text CHECK (budget_key <> '');

-- A rule's share of its connection's budget when several rules have a backlog.
ALTER TABLE rules ADD COLUMN weight integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000);

-- The effective budget key of a connection.
CREATE FUNCTION courier_budget_key(c connections) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT COALESCE(c.budget_key, 'connection:' || c.id)
$$;

-- A 429 blocks its whole budget until `blocked_until`; every worker process sees it.
CREATE TABLE connection_blocks (
    budget_key      text PRIMARY KEY,
    blocked_until   timestamptz NOT NULL,
    -- The connection, rule and run whose call met the 429, and its raw header value.
    connection_id   bigint REFERENCES connections (id) ON DELETE CASCADE,
    rule_id         bigint REFERENCES rules (id) ON DELETE SET NULL,
    run_id          bigint REFERENCES runs (id) ON DELETE SET NULL,
    retry_after_raw text,
    set_at          timestamptz NOT NULL
);

-- Shared pacing state per budget key (GCRA): the theoretical arrival time of the next
-- request. Worker processes lease slices of request slots by moving it forward.
CREATE TABLE budgets (
    budget_key text PRIMARY KEY,
    tat        timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

-- Calls made per budget and job (429s included), for "used in the last minute".
CREATE TABLE budget_calls (
    budget_key text NOT NULL,
    at         timestamptz NOT NULL,
    calls      integer NOT NULL CHECK (calls > 0)
);
CREATE INDEX budget_calls_key_at ON budget_calls (budget_key, at);

-- A waiting run resumes at `resume_at`; a throttled run records when the block ends.
ALTER TABLE runs ADD COLUMN resume_at timestamptz, ADD COLUMN throttled_until timestamptz;

-- How each rule stands, for people and for `courier status`: a rule on a blocked budget
-- reads `throttled` (unless its own run is waiting it out), whether or not it had a run.
CREATE VIEW rule_states AS
SELECT r.id AS rule_id, r.name AS rule, c.id AS connection_id, c.name AS connection,
       courier_budget_key(c) AS budget_key, r.enabled,
       CASE WHEN lr.status IN ('running', 'waiting') THEN lr.status
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
LEFT JOIN LATERAL (SELECT x.id, x.status, x.resume_at FROM runs x WHERE x.rule_id = r.id
                   ORDER BY x.id DESC LIMIT 1) lr ON true;
