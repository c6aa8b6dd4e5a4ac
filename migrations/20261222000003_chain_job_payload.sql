-- The payload of a chain job (`queue::ChainJob`): its run and its rule, JSON in the bytes
-- apalis stores. Every chain job courier pushes, one or thousands in a statement, is
-- built by this function.
CREATE FUNCTION courier_chain_job(run_id bigint, rule_id bigint) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT convert_to(json_build_object('run_id', run_id, 'rule_id', rule_id)::text, 'UTF8')
$$;
