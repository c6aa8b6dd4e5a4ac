-- Validation at the door, for plain SQL too: what `catalog::upsert_connection` and
-- `enqueue::enqueue_many` refuse with a readable message, these checks refuse for INSERT
-- and UPDATE. (A rule path its writer cannot serve is not checked here: the operations are
-- known to the Rust side only. Such a rule fails its run once with the reason and its
-- backlog stays pending.)
--
-- The checks are added NOT VALID: rows written before keep their history, and a database
-- holding an old mistake still migrates. Every row written from now on is checked, and so
-- is every update of an old row; courier updates only pending deliveries, so pending ones
-- that break the new rules are ended here, with the reason.

-- A record key holds a character that is not blank; a delivery cannot wait for itself, nor
-- for a blank key.
UPDATE deliveries
SET status = 'rejected', finished_at = now(), updated_at = now(),
    last_error = CASE
        WHEN record_key !~ '\S' THEN 'record_key is blank (ended by the migration that began refusing it)'
        WHEN depends_on !~ '\S' THEN 'depends_on is blank (ended by the migration that began refusing it)'
        ELSE 'depends_on names the delivery''s own key (ended by the migration that began refusing it)'
    END
WHERE status = 'pending'
  AND (record_key !~ '\S' OR depends_on !~ '\S' OR depends_on = record_key);

ALTER TABLE deliveries
    ADD CONSTRAINT deliveries_record_key_not_blank CHECK (record_key ~ '\S') NOT VALID,
    ADD CONSTRAINT deliveries_depends_on_not_blank CHECK (depends_on ~ '\S') NOT VALID,
    ADD CONSTRAINT deliveries_depends_on_not_self
        CHECK (depends_on IS DISTINCT FROM record_key) NOT VALID;

-- A base URL is an absolute http(s) URL with a host (after an optional user@), and holds
-- no blank, line break or control character.
ALTER TABLE connections
    ADD CONSTRAINT connections_base_url_host
        CHECK (base_url ~ '^https?://([^/?#@]*@)?[^/?#@:]'
               AND base_url !~ '[[:space:][:cntrl:]]') NOT VALID;

-- Headers are HTTP headers: names are tokens (RFC 9110), values strings without a line
-- break or a control character other than tab (what the writers' HTTP library sends).
CREATE FUNCTION courier_headers_valid(h jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_typeof(h) = 'object' AND NOT EXISTS (
        SELECT 1 FROM jsonb_each(h) AS e(name, value)
        WHERE e.name !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$'
           OR jsonb_typeof(e.value) <> 'string'
           OR (e.value #>> '{}') ~ '[\x01-\x08\x0a-\x1f\x7f]')
$$;
ALTER TABLE connections
    ADD CONSTRAINT connections_headers_valid CHECK (courier_headers_valid(headers)) NOT VALID;
