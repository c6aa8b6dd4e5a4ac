-- The circuit's questions, each defined once (the dispatcher and a chain job ask them):
-- whether an open circuit has cooled down, whether it wants a probe, and whether a run may
-- call through it.

-- Open, and its open period over.
CREATE FUNCTION courier_circuit_cooled(c circuits, at timestamptz)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT c.state = 'open' AND c.open_until <= at
$$;

-- Cooled down, or half-open with no active probe run (other than `started`, a run just
-- made its probe in this transaction).
CREATE OR REPLACE FUNCTION courier_circuit_wants_probe(c circuits, at timestamptz, started bigint)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT courier_circuit_cooled(c, at)
        OR (c.state = 'half_open' AND NOT EXISTS (
              SELECT 1 FROM runs p
              WHERE p.id = c.probe_run_id AND p.id IS DISTINCT FROM started AND p.active))
$$;

-- Whether run `run` may call the target through circuit `c` at `at`: closed, cooled down,
-- or half-open with no other run probing it.
CREATE FUNCTION courier_circuit_admits(c circuits, run bigint, at timestamptz)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT c.state = 'closed' OR courier_circuit_cooled(c, at)
        OR (c.state = 'half_open' AND (c.probe_run_id IS NULL OR c.probe_run_id = run))
$$;
