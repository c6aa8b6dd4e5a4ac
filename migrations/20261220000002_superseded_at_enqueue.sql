-- Supersession is decided when the newer delivery is enqueued, not at every claim (#40).
--
-- The claim used to ask, for each delivery it took, "is there a newer pending delivery of
-- the same rule and key?": a correlated subquery whose plan flipped on a fresh table
-- (partial indexes built on an empty table look like one page to the planner until an
-- ANALYZE): it walked `deliveries_pending` backwards for every claimed row, 1.3 ms each,
-- and the first bulk import drained at a quarter of the engine's speed. The answer is
-- known when the newer delivery arrives, so it is written then, and the claim reads it
-- from the row it claims anyway.
--
-- `superseded`: a newer delivery of the same rule and key was enqueued while this one was
-- pending. A superseded delivery is never sent: its claim records it `suppressed`.
ALTER TABLE deliveries ADD COLUMN superseded boolean NOT NULL DEFAULT false;

-- Any delivery already pending with a newer one of its key (enqueued before this
-- migration) is marked likewise.
UPDATE deliveries o SET superseded = true
WHERE o.status = 'pending'
  AND EXISTS (SELECT 1 FROM deliveries n
              WHERE n.rule_id = o.rule_id AND n.record_key = o.record_key AND n.id > o.id);

-- One statement per INSERT into deliveries, whichever door it came through (plain SQL,
-- `enqueue`, `courier enqueue`): the older pending deliveries of every (rule, key) among
-- the new rows, including older ones inserted by the same statement, are marked.
--
-- Its cost must not depend on the planner's beliefs either, so its shape leaves one plan:
-- for each distinct key of the new rows, one probe of `deliveries_record_key` (the
-- key's deliveries, every rule and status: a few per key), filtered outside the probe.
-- The probe is a LATERAL subquery with OFFSET 0, which the planner can neither turn into
-- a join (a hash join read every pending delivery per statement, so a load in chunks
-- took quadratic time) nor push the filter into (with `rule_id` and `id` inside it, a
-- fresh table's planner walked `deliveries_pending` per key, the claim's old fault).
-- The marked rows are then updated by id. The statement is dynamic SQL, planned for each
-- insert, so the first insert of a session does not fix the plan of all that follow.
CREATE FUNCTION courier_supersede_older() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE $q$
        UPDATE deliveries o SET superseded = true
        WHERE o.id = ANY (ARRAY(
            SELECT x.id
            FROM (SELECT n.rule_id, n.record_key, max(n.id) AS newest
                  FROM new_deliveries n GROUP BY n.rule_id, n.record_key) k
            CROSS JOIN LATERAL (SELECT d.id, d.rule_id, d.status, d.superseded
                                FROM deliveries d WHERE d.record_key = k.record_key
                                OFFSET 0) x
            WHERE x.rule_id = k.rule_id AND x.id < k.newest
              AND x.status = 'pending' AND NOT x.superseded))
    $q$;
    RETURN NULL;
END $$;
CREATE TRIGGER deliveries_supersede AFTER INSERT ON deliveries
    REFERENCING NEW TABLE AS new_deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION courier_supersede_older();

-- A delivery made pending again (`courier retry`, or an UPDATE of your own) is superseded
-- if a newer delivery of its key exists by then: the newer record wins. `courier retry`
-- takes only the newest delivery of a key, so for it this finds nothing. One probe of
-- `deliveries_record_key`, shaped as above; only such updates call the function.
CREATE FUNCTION courier_supersede_again() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.superseded := NEW.superseded OR EXISTS (
        SELECT 1 FROM (SELECT d.id, d.rule_id FROM deliveries d
                       WHERE d.record_key = NEW.record_key OFFSET 0) x
        WHERE x.rule_id = NEW.rule_id AND x.id > NEW.id);
    RETURN NEW;
END $$;
CREATE TRIGGER deliveries_supersede_again BEFORE UPDATE OF status ON deliveries
    FOR EACH ROW WHEN (OLD.status <> 'pending' AND NEW.status = 'pending')
    EXECUTE FUNCTION courier_supersede_again();

-- Nothing reads it any more: the claim's subquery and the retry's check were its users.
-- One index fewer to write on every insert.
DROP INDEX deliveries_pending_key;
