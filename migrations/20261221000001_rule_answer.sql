-- How an http_json rule's batch answers name each record's fate (positionally, by key or
-- by index: see src/writer/answer.rs); NULL reads the generic per-item array. Checked
-- when the rule is saved through courier; a map written by plain SQL that courier cannot
-- read leaves the rule unusable, with the reason, until it changes.
ALTER TABLE rules ADD COLUMN answer jsonb
    CONSTRAINT rules_answer_object CHECK (answer IS NULL OR jsonb_typeof(answer) = 'object');
