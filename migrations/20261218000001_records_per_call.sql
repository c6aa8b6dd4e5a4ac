-- Bulk delivery: a rule may send several of its deliveries in one call (a target's bulk
-- endpoint). `records_per_call` is the most one call carries (1: one record per call);
-- the writer may allow less (checked when the rule is saved, and by the chain job for a
-- rule written by plain SQL). `batch_envelope` names the field of an object that wraps
-- the records of an `http_json` call (`{"<envelope>": [...]}`); NULL sends a bare array.
ALTER TABLE rules
    ADD COLUMN records_per_call integer NOT NULL DEFAULT 1
        CONSTRAINT rules_records_per_call CHECK (records_per_call BETWEEN 1 AND 1000),
    ADD COLUMN batch_envelope text
        CONSTRAINT rules_batch_envelope CHECK (batch_envelope <> '' AND length(batch_envelope) <= 100);

-- A change of either may fix a rule left alone as unusable.
DROP TRIGGER rules_changed ON rules;
CREATE TRIGGER rules_changed
    BEFORE UPDATE OF path, connection_id, enabled, batch_size, records_per_call, batch_envelope ON rules
    FOR EACH ROW EXECUTE FUNCTION courier_rule_changed();
