-- User.com is a preset (presets/usercom.json) of the generic http_json writer, whose
-- request shapes group records by a value and name the fields a record needs; the writer
-- `usercom` is gone. A connection that named it becomes an http_json connection presenting
-- its key as `Authorization: Token <key>` with `Accept: */*; version=2` (its base URL, key
-- variable, limits and every other setting kept), and each of its rules takes the shape of
-- the preset's rule for the operation its path named (its records per call and every other
-- setting kept): the path, request and answer below are the preset's (tests/it/usercom.rs
-- holds them equal). A mass update's rule takes the custom ids' form (`custom_ids`; the
-- preset's usercom-mass-update-by-id sends User.com's own ids). A rule whose path named no
-- operation (only SQL past the catalog could store one) is paused, its backlog kept, so
-- nothing is sent to a path that never was one.
UPDATE rules r
   SET paused = true
  FROM connections c
 WHERE r.connection_id = c.id AND c.writer = 'usercom'
   AND btrim(btrim(r.path, E' \t\n\r'), '/') NOT IN
       ('user_upsert', 'user_attributes', 'mass_update_custom_attributes', 'event',
        'product_event', 'deal_upsert');

WITH shapes(operation, path, request, answer) AS (VALUES
    ('user_upsert', 'users/update_or_create/',
     '{"require": ["custom_id"]}'::jsonb,
     NULL::jsonb),
    ('user_attributes', 'users-by-id/{payload/custom_id}/set_multiple_attributes/',
     '{"require": ["custom_id", "attributes"], "item": "{{payload/attributes}}", "group": {"key": "{{payload/attributes | entry}}", "path": "users-by-id/mass_update_custom_attributes/", "method": "PUT", "item": "{{payload/custom_id}}", "body": {"ids": "{{records}}", "attribute": "{{group/name}}", "value": "{{group/value}}"}}}'::jsonb,
     '{"kind": "keyed", "errors": "/not_found", "key": "", "record": {"payload": "/custom_id"}, "status": 404}'::jsonb),
    ('mass_update_custom_attributes', 'users-by-id/mass_update_custom_attributes/',
     '{"method": "PUT", "require": ["custom_ids", "attribute"], "item": {"ids": "{{payload/custom_ids}}", "attribute": "{{payload/attribute}}", "value": "{{payload/value}}"}}'::jsonb,
     NULL::jsonb),
    ('event', 'events/',
     '{"require": ["name", ["user_custom_id", "user_id"]], "item": {"...": "{{payload}}", "data": {"...": "{{payload/data?}}", "courier_delivery_id": "{{delivery_id | number}}"}}}'::jsonb,
     NULL::jsonb),
    ('product_event', 'products-by-id/{payload/product_custom_id}/product_event/',
     '{"require": ["product_custom_id", "event_type", ["user_custom_id", "user_id"]], "item": {"...": "{{payload | omit product_custom_id}}", "data": {"...": "{{payload/data?}}", "courier_delivery_id": "{{delivery_id | number}}"}}}'::jsonb,
     NULL::jsonb),
    ('deal_upsert', 'deals/update_or_create/',
     '{"require": ["custom_id"]}'::jsonb,
     NULL::jsonb)
)
UPDATE rules r
   SET path = s.path, request = s.request, answer = s.answer
  FROM connections c, shapes s
 WHERE r.connection_id = c.id AND c.writer = 'usercom'
   AND btrim(btrim(r.path, E' \t\n\r'), '/') = s.operation;

UPDATE connections
   SET writer = 'http_json',
       auth = '{"kind": "header", "name": "Authorization", "scheme": "Token"}'::jsonb,
       headers = COALESCE((SELECT jsonb_object_agg(h.key, h.value) FROM jsonb_each(headers) h
                            WHERE lower(h.key) <> 'accept'), '{}'::jsonb)
                 || '{"Accept": "*/*; version=2"}'::jsonb
 WHERE writer = 'usercom';

ALTER TABLE connections DROP CONSTRAINT connections_writer_check;
ALTER TABLE connections ADD CONSTRAINT connections_writer_check CHECK (writer IN ('http_json'));
