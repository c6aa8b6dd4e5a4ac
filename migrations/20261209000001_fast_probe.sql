-- The fast probe after a halving (a limiter with no burst) holds the halved pace 0.5 s
-- (was 1 s) and then climbs 20% per second (was 10%) towards its ceiling (issue #9): a
-- rate declared 10× too high is halved four times to 62% of the limit, and the climb back
-- took 5 s of the 10 s the budget has to converge in. A 429 cuts the rate of the refused
-- call's slice (learned::FAST_HOLD, learned::FAST_PROBE_PER_SECOND).
-- As in 20261208000001_429_streak.sql, with the new hold and growth.
CREATE OR REPLACE FUNCTION courier_learned_rpm(learned double precision, learned_at timestamptz,
                                               ceiling double precision, declared integer,
                                               at timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN learned IS NULL OR learned_at IS NULL THEN NULL
                WHEN v >= declared THEN NULL ELSE v END
    FROM (SELECT CASE WHEN ceiling > learned
                      THEN least(ceiling, learned * exp(least(40.0, 0.2 * greatest(0.0, s - 0.5))))
                      ELSE learned END
                 * exp(least(40.0, 0.01 * greatest(0.0, s - 60.0))) AS v
          FROM (SELECT extract(epoch FROM at - learned_at)::double precision AS s) y) x
$$;
