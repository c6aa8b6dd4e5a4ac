-- Slots a process leases at once on a budget paced at `rpm` requests per minute: a
-- quarter second's worth, 1 to 50 (pacer::slice_len). Computed in the lease statement
-- from the rate it books at, so a process whose last lease was long ago (or that never
-- leased on the budget) books no seconds of slots at a rate cut since (issue #9: a process
-- taking over a run after a 429 leased 25 slots, 4 s at the halved pace, while the pace
-- climbed back).
CREATE FUNCTION courier_slice_len(rpm double precision)
RETURNS int LANGUAGE sql IMMUTABLE AS $$
    SELECT least(greatest(floor(greatest(rpm, 0.0) / 240.0), 1), 50)::int
$$;

-- The time a slice of slots at `rpm` spans: its slots, one slot interval each.
CREATE FUNCTION courier_slice_span(rpm double precision)
RETURNS interval LANGUAGE sql IMMUTABLE AS $$
    SELECT courier_slice_len(rpm) * courier_slot_interval(rpm)
$$;
