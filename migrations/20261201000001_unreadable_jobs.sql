-- Why apalis (and so courier) cannot read a row of apalis.jobs, or NULL when it can. A row
-- apalis cannot read fails the whole batch it was fetched in, and the worker with it, every
-- time it is fetched again; courier sets such rows of its queue aside (status Killed, this
-- reason in last_result) instead. What apalis-postgres 1.0.0 cannot read:
--   * an id that is not a ULID as apalis writes them (26 upper-case Crockford base32
--     characters): another id fails the fetch; a lower-case one is read but never
--     acknowledged, because apalis writes the id back upper-case;
--   * a payload that is not UTF-8 JSON (its JSON codec fails the worker);
--   * a metadata value that is NULL (apalis unwraps every value);
--   * a run_at or done_at before 1970 (its timestamp type holds Unix seconds only).
-- PostgreSQL 15 has no pg_input_is_valid: the JSON check is a cast in an EXCEPTION block.
-- serde_json refuses a few texts PostgreSQL's json accepts (a lone surrogate escape,
-- nesting deeper than 128); the worker sets those aside when it meets them.
CREATE FUNCTION courier_job_unreadable(j apalis.jobs) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    null_key text;
    detail text;
BEGIN
    IF j.id !~ '^[0-9A-HJKMNP-TV-Z]{26}$' THEN
        RETURN format('id %s is not a ULID', quote_literal(left(j.id, 80)));
    END IF;
    IF j.run_at < timestamptz '1970-01-01 00:00:00+00' THEN
        RETURN format('run_at %s is before 1970', j.run_at);
    END IF;
    IF j.done_at < timestamptz '1970-01-01 00:00:00+00' THEN
        RETURN format('done_at %s is before 1970', j.done_at);
    END IF;
    IF j.metadata IS NOT NULL THEN
        SELECT key INTO null_key FROM each(j.metadata) WHERE value IS NULL LIMIT 1;
        IF FOUND THEN
            RETURN format('metadata key %s is NULL', quote_literal(left(null_key, 80)));
        END IF;
    END IF;
    BEGIN
        PERFORM convert_from(j.job, 'UTF8')::json;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
        RETURN 'payload is not UTF-8 JSON: ' || SQLERRM || coalesce(' (' || nullif(detail, '') || ')', '');
    END;
    RETURN NULL;
END $$;
