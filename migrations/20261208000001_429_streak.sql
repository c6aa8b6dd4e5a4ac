-- 429s met again and again at about the pace cut deeper each time (issue #9): the budget
-- counts such cuts in a row, each within 60 s of the one before (learned::Cut::streak).
-- It replaces the flag of the last 429 coming after too few accepted calls: any 429 after
-- too few, within 60 s of another, now halves the pace. The learned rate waits 60 s
-- without a 429 before its slow probe upward (was 30 s; learned::QUIET): each probe ends
-- in a 429, and one every half minute cost 3% of a budget's rate.
ALTER TABLE budgets
    ADD COLUMN streak_429 integer NOT NULL DEFAULT 0 CHECK (streak_429 >= 0),
    DROP COLUMN last_429_unmeasured;

-- As in 20261207000001_learned_probe.sql, with the quiet period of 60 s.
CREATE OR REPLACE FUNCTION courier_learned_rpm(learned double precision, learned_at timestamptz,
                                               ceiling double precision, declared integer,
                                               at timestamptz)
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN learned IS NULL OR learned_at IS NULL THEN NULL
                WHEN v >= declared THEN NULL ELSE v END
    FROM (SELECT CASE WHEN ceiling > learned
                      THEN least(ceiling, learned * exp(least(40.0, 0.1 * greatest(0.0, s - 1.0))))
                      ELSE learned END
                 * exp(least(40.0, 0.01 * greatest(0.0, s - 60.0))) AS v
          FROM (SELECT extract(epoch FROM at - learned_at)::double precision AS s) y) x
$$;
