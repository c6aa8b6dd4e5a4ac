-- runs_rule_started (rule_id, started_at DESC) served no query: a rule's latest run is read
-- by id (runs_rule_latest), and the foreign key's cascades use the same index's rule_id
-- prefix. Every run the dispatcher starts paid for its upkeep (issue #9, point 6).
DROP INDEX IF EXISTS runs_rule_started;
