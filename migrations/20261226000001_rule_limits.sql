-- A rule's own limits: the vendor's limits of its endpoint (Klaviyo's profile import and
-- event creation allow different rates), kept by the rule's own budget. Empty: the
-- connection's limits.
ALTER TABLE rules ADD COLUMN limits text[] NOT NULL DEFAULT '{}'
    CONSTRAINT rules_limits_valid CHECK (courier_limits_valid(limits)),
    ADD CONSTRAINT rules_limits_own_budget CHECK (cardinality(limits) = 0 OR budget_key IS NOT NULL);
