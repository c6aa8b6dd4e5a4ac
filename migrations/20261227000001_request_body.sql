-- One way to say a bulk call's body: a rule's `batch_envelope` (the field of an object
-- wrapping the records) becomes its request shape's `body`, `{"<field>": "{{records}}"}`.
-- A rule that states both keeps its body, which is what it sent.
UPDATE rules
SET request = jsonb_set(COALESCE(request, '{}'::jsonb), '{body}',
                        jsonb_build_object(batch_envelope, '{{records}}'))
WHERE batch_envelope IS NOT NULL AND NOT COALESCE(request ? 'body', false);

-- A change of a rule's request or answer may fix a rule left alone as unusable, as a
-- change of its path or bulk settings does.
DROP TRIGGER rules_changed ON rules;
ALTER TABLE rules DROP COLUMN batch_envelope;
CREATE TRIGGER rules_changed
    BEFORE UPDATE OF path, connection_id, enabled, batch_size, records_per_call, request, answer
    ON rules
    FOR EACH ROW EXECUTE FUNCTION courier_rule_changed();
