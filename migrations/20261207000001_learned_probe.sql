-- Pacing finds the real limit in fewer 429s (issue #9): a 429 after too few accepted calls
-- to measure (a limiter with no burst) halves the pace, which then probes back up fast
-- towards the pace that was refused, its ceiling. src/learned.rs holds the same formulas
-- (Learned::now; tested to agree).

ALTER TABLE budgets
    -- The rate the fast probe climbs towards (NULL: no fast probe).
    ADD COLUMN ceiling_rpm double precision CHECK (ceiling_rpm > 0),
    -- Whether the last 429 came after too few accepted calls to measure the limit by.
    ADD COLUMN last_429_unmeasured boolean NOT NULL DEFAULT false;

DROP VIEW budget_rates;
DROP FUNCTION courier_effective_rpm(integer, double precision, timestamptz, double precision,
                                    timestamptz, timestamptz);
DROP FUNCTION courier_learned_rpm(double precision, timestamptz, integer, timestamptz);

-- The learned rate at `at`: 1 s after `learned_at` (the end of the block the 429 set) it
-- probes up by 10%/s until the ceiling
-- (learned::FAST_HOLD, FAST_PROBE_PER_SECOND); 30 s after it, by 1%/s (QUIET,
-- PROBE_PER_SECOND); each growth capped at e^40 (MAX_GROWTH). NULL once at the declared rate.
CREATE FUNCTION courier_learned_rpm(learned double precision, learned_at timestamptz,
                                    ceiling double precision, declared integer, at timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN learned IS NULL OR learned_at IS NULL THEN NULL
                WHEN v >= declared THEN NULL ELSE v END
    FROM (SELECT CASE WHEN ceiling > learned
                      THEN least(ceiling, learned * exp(least(40.0, 0.1 * greatest(0.0, s - 1.0))))
                      ELSE learned END
                 * exp(least(40.0, 0.01 * greatest(0.0, s - 30.0))) AS v
          FROM (SELECT extract(epoch FROM at - learned_at)::double precision AS s) y) x
$$;

-- The rate a budget paces at: the least of declared, learned and advertised.
CREATE FUNCTION courier_effective_rpm(declared integer, learned double precision,
                                      learned_at timestamptz, ceiling double precision,
                                      advertised double precision, advertised_at timestamptz,
                                      at timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(1.0, least(declared::double precision,
                               courier_learned_rpm(learned, learned_at, ceiling, declared, at),
                               courier_advertised_rpm(advertised, advertised_at, at)))
$$;

-- Declared, learned, advertised and effective rate per budget, for people and `courier
-- status`; the ceiling the learned rate probes towards.
CREATE VIEW budget_rates AS
SELECT b.budget_key, b.declared_rpm,
       courier_learned_rpm(b.learned_rpm, b.learned_at, b.ceiling_rpm, b.declared_rpm, now())
           AS learned_rpm,
       courier_advertised_rpm(b.advertised_rpm, b.advertised_at, now()) AS advertised_rpm,
       courier_effective_rpm(b.declared_rpm, b.learned_rpm, b.learned_at, b.ceiling_rpm,
                             b.advertised_rpm, b.advertised_at, now()) AS effective_rpm,
       b.learned_at, b.last_429_at, b.ceiling_rpm
FROM budgets b
WHERE b.declared_rpm IS NOT NULL;
