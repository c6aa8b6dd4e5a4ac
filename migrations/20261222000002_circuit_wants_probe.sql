-- Whether circuit `c` wants a probe at `at`: open and cooled down, or half-open with no
-- active probe run (other than `started`, a run just made its probe in this transaction).
-- The dispatcher looks for such circuits and claims one with the same question.
CREATE FUNCTION courier_circuit_wants_probe(c circuits, at timestamptz, started bigint)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT (c.state = 'open' AND c.open_until <= at)
        OR (c.state = 'half_open' AND NOT EXISTS (
              SELECT 1 FROM runs p
              WHERE p.id = c.probe_run_id AND p.id IS DISTINCT FROM started AND p.active))
$$;
