-- courier_ts(NULL) returned year 1 (GREATEST ignores NULLs), so "no time" read as
-- "long past": status showed 0001-01-01 for empty times, and the dispatcher took an idle
-- database's "nothing due" for "due now" and passed in a hot loop. STRICT: NULL in,
-- NULL out.
CREATE OR REPLACE FUNCTION courier_ts(t timestamptz) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT LEAST(GREATEST(t, '0001-01-01 00:00:00+00'), '9999-12-31 23:59:59+00')
$$;
