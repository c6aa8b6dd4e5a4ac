-- A connection's rate signals (courier::ratelimit::signals): the headers of its target's
-- own names that state a quota, what is left and when it resets, a usage header, and the
-- answers other than 429 that mean "rate limited". Vendor knowledge as data; NULL: the
-- standard headers only.
ALTER TABLE connections ADD COLUMN rate_signals jsonb
    CONSTRAINT connections_rate_signals_object
    CHECK (rate_signals IS NULL OR jsonb_typeof(rate_signals) = 'object');
