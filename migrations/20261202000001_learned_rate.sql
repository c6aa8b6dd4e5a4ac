-- Pacing that learns the real limit (issue #9): what a budget learned about the target's
-- real rate lives with the budget, so every worker process paces at it and a process
-- started later begins there. src/learned.rs holds the same formulas (tested to agree).

ALTER TABLE budgets
    -- The rate the connection declares, as the last lease stated it.
    ADD COLUMN declared_rpm   integer CHECK (declared_rpm > 0),
    -- The rate learned from 429s (NULL: nothing learned), as of `learned_at`; it probes
    -- back up towards the declared rate after a quiet period (courier_learned_rpm).
    ADD COLUMN learned_rpm    double precision CHECK (learned_rpm > 0),
    ADD COLUMN learned_at     timestamptz,
    -- The rate the target's own rate-limit headers state (quota ÷ window), as of when.
    ADD COLUMN advertised_rpm double precision CHECK (advertised_rpm > 0),
    ADD COLUMN advertised_at  timestamptz,
    -- The last 429 any process met on the budget.
    ADD COLUMN last_429_at    timestamptz,
    -- Calls the target accepted (answered other than 429) since `accepted_since`: the last
    -- 429, or the start of the current busy stretch. A 429 estimates the real rate from it.
    ADD COLUMN accepted       bigint NOT NULL DEFAULT 0,
    ADD COLUMN accepted_since timestamptz;

-- Quiet seconds after a 429 before the learned rate probes upward, and the probe's growth
-- per second (multiplicative): see learned::QUIET and learned::PROBE_PER_SECOND.
CREATE FUNCTION courier_learned_rpm(learned double precision, learned_at timestamptz,
                                    declared integer, at timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN learned IS NULL OR learned_at IS NULL THEN NULL
                WHEN v >= declared THEN NULL ELSE v END
    FROM (SELECT learned * exp(0.01 * greatest(0.0,
                 extract(epoch FROM at - learned_at)::double precision - 30.0)) AS v) x
$$;

-- A statement from the target's headers holds this long unless restated.
CREATE FUNCTION courier_advertised_rpm(advertised double precision, advertised_at timestamptz,
                                       at timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN advertised_at > at - interval '10 minutes' THEN advertised END
$$;

-- The rate a budget paces at: the least of declared, learned and advertised.
CREATE FUNCTION courier_effective_rpm(declared integer, learned double precision,
                                      learned_at timestamptz, advertised double precision,
                                      advertised_at timestamptz, at timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(1.0, least(declared::double precision,
                               courier_learned_rpm(learned, learned_at, declared, at),
                               courier_advertised_rpm(advertised, advertised_at, at)))
$$;

-- The time between two slots at an effective rate, 2% wider (pacer::HEADROOM), in whole
-- microseconds rounded up (pacer::interval_for).
CREATE FUNCTION courier_slot_interval(rpm double precision)
RETURNS interval LANGUAGE sql IMMUTABLE AS $$
    SELECT make_interval(secs => ceil(60e6 / (greatest(rpm, 1.0) * 0.98)) / 1e6)
$$;

-- Declared, learned, advertised and effective rate per budget, for people and `courier
-- status`.
CREATE VIEW budget_rates AS
SELECT b.budget_key, b.declared_rpm,
       courier_learned_rpm(b.learned_rpm, b.learned_at, b.declared_rpm, now()) AS learned_rpm,
       courier_advertised_rpm(b.advertised_rpm, b.advertised_at, now()) AS advertised_rpm,
       courier_effective_rpm(b.declared_rpm, b.learned_rpm, b.learned_at, b.advertised_rpm,
                             b.advertised_at, now()) AS effective_rpm,
       b.learned_at, b.last_429_at
FROM budgets b
WHERE b.declared_rpm IS NOT NULL;
