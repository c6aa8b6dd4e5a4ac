-- A connection whose writer cannot be built (API key variable unset, a header value that is
-- not a header value), or a rule whose path its writer cannot serve, fails one run with the
-- reason and is then left alone until the catalog changes or the cooldown passes.
ALTER TABLE circuits ADD COLUMN unusable_error text, ADD COLUMN unusable_until timestamptz;
ALTER TABLE rules ADD COLUMN unusable_error text, ADD COLUMN unusable_until timestamptz;

-- Any change to a connection may have fixed it (and its rules).
CREATE FUNCTION courier_connection_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE circuits SET unusable_error = NULL, unusable_until = NULL
    WHERE connection_id = NEW.id AND unusable_until IS NOT NULL;
    UPDATE rules SET unusable_error = NULL, unusable_until = NULL
    WHERE connection_id = NEW.id AND unusable_until IS NOT NULL;
    RETURN NULL;
END $$;
CREATE TRIGGER connections_changed AFTER UPDATE ON connections
    FOR EACH ROW EXECUTE FUNCTION courier_connection_changed();

-- A rule's own settings changing may have fixed it (leases and marks do not count).
CREATE FUNCTION courier_rule_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.unusable_error := NULL;
    NEW.unusable_until := NULL;
    RETURN NEW;
END $$;
CREATE TRIGGER rules_changed BEFORE UPDATE OF path, connection_id, enabled, batch_size ON rules
    FOR EACH ROW EXECUTE FUNCTION courier_rule_changed();
