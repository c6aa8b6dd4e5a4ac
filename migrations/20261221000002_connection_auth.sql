-- How a connection presents its key (see src/writer/auth.rs): NULL is a bearer token; a
-- header with or without a scheme (Klaviyo-API-Key, api-key); HTTP Basic with the key as
-- the password. The key itself is never stored: api_key_env names its variable.
ALTER TABLE connections ADD COLUMN auth jsonb
    CONSTRAINT connections_auth_object CHECK (auth IS NULL OR jsonb_typeof(auth) = 'object');
