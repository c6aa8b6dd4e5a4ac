-- How an http_json rule's requests are shaped (see src/writer/request.rs): method,
-- content type, a template for each record and one for a bulk call's body; NULL sends
-- each payload as it is, by POST. Checked when the rule is saved through courier.
ALTER TABLE rules ADD COLUMN request jsonb
    CONSTRAINT rules_request_object CHECK (request IS NULL OR jsonb_typeof(request) = 'object');
