-- Erasure: a person forgotten in every target and in courier itself.
--
-- `SELECT courier_erase('{"email": "...", "phone": "...", "external_id": "...", "keys":
-- ["customer:123"]}'::jsonb)` opens an erasure and returns its id. The worker then, per
-- connection, waits for what may still carry the person there (a run that began before the
-- erasure, a target job holding one of their records), sends the connection's erase
-- operation (`connections.erase`) and records the target's answer; once every target has
-- answered it deletes the person's deliveries (their ledger rows go with them) and
-- delivered records, scrubs their identities from stored texts, and forgets the identities
-- in clear. What stays is the audit (`erasures`, `erasure_targets`) and the person's keyed
-- hashes (`erased_identities`): HMAC-SHA-256 under a key the worker holds, never stored,
-- by which every later delivery naming them is suppressed before any call.

-- Where a rule's payloads hold a person's identities: kind -> JSON pointer.
ALTER TABLE rules ADD COLUMN identities jsonb
    CONSTRAINT rules_identities_object CHECK (identities IS NULL OR jsonb_typeof(identities) = 'object');
-- How a connection's target is told to erase a person (checked by the catalog).
ALTER TABLE connections ADD COLUMN erase jsonb
    CONSTRAINT connections_erase_object CHECK (erase IS NULL OR jsonb_typeof(erase) = 'object');
-- The erasure a delivery belongs to, once swept: its person is being forgotten.
ALTER TABLE deliveries ADD COLUMN erasure_id bigint;
CREATE INDEX deliveries_erasure ON deliveries (erasure_id) WHERE erasure_id IS NOT NULL;

CREATE TABLE erasures (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    asked_at    timestamptz NOT NULL DEFAULT now(),
    asked_by    text NOT NULL,
    -- The identities in clear (normalized), only while the erasure is open.
    identities  jsonb,
    -- Their keyed hashes are in erased_identities (the worker computes them).
    hashed      boolean NOT NULL DEFAULT false,
    -- The person's deliveries are marked (and the pending ones suppressed).
    swept       boolean NOT NULL DEFAULT false,
    status      text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'done')),
    finished_at timestamptz,
    -- An operator lifted the suppression (the person consented again).
    lifted_at   timestamptz,
    lifted_by   text,
    CHECK ((status = 'open') = (finished_at IS NULL)),
    CHECK (status = 'open' OR identities IS NULL),
    CHECK (identities IS NULL OR jsonb_typeof(identities) = 'object')
);
CREATE INDEX erasures_open ON erasures (asked_at) WHERE status = 'open';

-- The keyed hashes of erased identities (`kind:value`), hex.
CREATE TABLE erased_identities (
    hash       text PRIMARY KEY CHECK (hash ~ '^[0-9a-f]{64}$'),
    erasure_id bigint NOT NULL REFERENCES erasures (id) ON DELETE CASCADE
);

-- What each connection's target was told and answered.
CREATE TABLE erasure_targets (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    erasure_id      bigint NOT NULL REFERENCES erasures (id) ON DELETE CASCADE,
    connection_id   bigint REFERENCES connections (id) ON DELETE SET NULL,
    connection      text NOT NULL,
    outcome         text NOT NULL DEFAULT 'pending' CHECK (outcome IN (
        'pending', 'erased', 'unknown', 'queued', 'no_operation', 'no_identity', 'failed')),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- The runs of the connection's rules active when the erasure was swept: they may have
    -- claimed the person's records before the gate knew of them, so the erase waits for
    -- each to end.
    waits_for_runs  bigint[] NOT NULL DEFAULT '{}',
    -- What the erase waits for before it is sent (a run, a target job), if anything.
    waiting_for     text,
    http_status     smallint,
    error           text,
    answered_at     timestamptz,
    lease_owner     text,
    lease_until     timestamptz,
    CHECK ((outcome = 'pending') = (answered_at IS NULL)),
    UNIQUE (erasure_id, connection_id)
);
CREATE INDEX erasure_targets_due ON erasure_targets (next_attempt_at) WHERE outcome = 'pending';

-- An identity as courier compares it: an e-mail trimmed and lower-cased, a phone number as
-- `+` and its digits, anything else as given.
CREATE FUNCTION courier_identity(kind text, value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE kind
        WHEN 'email' THEN lower(btrim(value))
        WHEN 'phone' THEN CASE WHEN btrim(value) LIKE '+%' THEN '+' ELSE '' END
                          || regexp_replace(value, '[^0-9]', '', 'g')
        ELSE value END
$$;

-- A JSON pointer (`/a/b`, RFC 6901) as a path for `#>>`.
CREATE FUNCTION courier_pointer(p text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p = '' THEN '{}'::text[]
        ELSE ARRAY(SELECT replace(replace(s, '~1', '/'), '~0', '~')
                   FROM unnest((string_to_array(p, '/'))[2:]) WITH ORDINALITY AS t(s, n)
                   ORDER BY n) END
$$;

-- The identities of one delivery, as its rule says where they sit, and its record key.
CREATE FUNCTION courier_delivery_identities(identities jsonb, record_key text, payload jsonb)
RETURNS TABLE (kind text, value text)
LANGUAGE sql IMMUTABLE AS $$
    SELECT i.key, courier_identity(i.key, payload #>> courier_pointer(i.value))
    FROM jsonb_each_text(coalesce(identities, '{}')) AS i
    WHERE payload #>> courier_pointer(i.value) IS NOT NULL
    UNION ALL
    SELECT 'key', record_key
$$;

-- The identities of a person as an erasure names them.
CREATE FUNCTION courier_person_identities(person jsonb)
RETURNS TABLE (kind text, value text)
LANGUAGE sql IMMUTABLE AS $$
    SELECT i.key, i.value FROM jsonb_each_text(person - 'keys') AS i
    UNION ALL
    SELECT 'key', k FROM jsonb_array_elements_text(coalesce(person -> 'keys', '[]')) AS k
$$;

-- Opens an erasure of the person `person` names (or finds the open one of the same
-- identities) and returns its id. Bad input is refused naming the field.
CREATE FUNCTION courier_erase(person jsonb, asked_by text DEFAULT current_user) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    kind text;
    normal jsonb := '{}';
    found bigint;
    v text;
BEGIN
    IF person IS NULL OR jsonb_typeof(person) <> 'object' THEN
        RAISE EXCEPTION 'courier_erase: the person must be a JSON object of identities (email, phone, external_id, keys)'
            USING ERRCODE = '22023';
    END IF;
    FOR kind IN SELECT jsonb_object_keys(person) LOOP
        IF kind NOT IN ('email', 'phone', 'external_id', 'keys') THEN
            RAISE EXCEPTION 'courier_erase: unknown identity kind "%" (email, phone, external_id, keys)', kind
                USING ERRCODE = '22023';
        END IF;
    END LOOP;
    IF person ? 'email' THEN
        v := courier_identity('email', person ->> 'email');
        IF jsonb_typeof(person -> 'email') <> 'string' OR v !~ '^[^@[:space:]]+@[^@[:space:]]+\.[^@[:space:]]+$' THEN
            RAISE EXCEPTION 'courier_erase: email is not an e-mail address' USING ERRCODE = '22023';
        END IF;
        normal := normal || jsonb_build_object('email', v);
    END IF;
    IF person ? 'phone' THEN
        v := courier_identity('phone', person ->> 'phone');
        IF jsonb_typeof(person -> 'phone') <> 'string' OR person ->> 'phone' !~ '^[[:space:]]*\+?[0-9 ().-]+$'
           OR length(regexp_replace(v, '[^0-9]', '', 'g')) NOT BETWEEN 6 AND 15 THEN
            RAISE EXCEPTION 'courier_erase: phone is not a phone number (6 to 15 digits, an optional leading +)'
                USING ERRCODE = '22023';
        END IF;
        normal := normal || jsonb_build_object('phone', v);
    END IF;
    IF person ? 'external_id' THEN
        IF jsonb_typeof(person -> 'external_id') NOT IN ('string', 'number')
           OR btrim(person ->> 'external_id') = '' THEN
            RAISE EXCEPTION 'courier_erase: external_id is blank' USING ERRCODE = '22023';
        END IF;
        normal := normal || jsonb_build_object('external_id', person ->> 'external_id');
    END IF;
    IF person ? 'keys' THEN
        IF jsonb_typeof(person -> 'keys') <> 'array'
           OR EXISTS (SELECT 1 FROM jsonb_array_elements(person -> 'keys') k
                      WHERE jsonb_typeof(k) <> 'string' OR btrim(k #>> '{}') = '') THEN
            RAISE EXCEPTION 'courier_erase: keys must be a list of record keys that are not blank'
                USING ERRCODE = '22023';
        END IF;
        IF jsonb_array_length(person -> 'keys') > 0 THEN
            normal := normal || jsonb_build_object('keys', (
                SELECT jsonb_agg(DISTINCT k) FROM jsonb_array_elements_text(person -> 'keys') k));
        END IF;
    END IF;
    IF normal = '{}' THEN
        RAISE EXCEPTION 'courier_erase: no identity (give email, phone, external_id or keys)'
            USING ERRCODE = '22023';
    END IF;
    -- The same person asked again while their erasure is open: that erasure.
    SELECT e.id INTO found FROM erasures e WHERE e.status = 'open' AND e.identities = normal;
    IF found IS NOT NULL THEN
        RETURN found;
    END IF;
    INSERT INTO erasures (asked_by, identities) VALUES (asked_by, normal) RETURNING id INTO found;
    INSERT INTO erasure_targets (erasure_id, connection_id, connection, outcome, answered_at, error)
    SELECT found, c.id, c.name,
           CASE WHEN c.erase IS NULL THEN 'no_operation' ELSE 'pending' END,
           CASE WHEN c.erase IS NULL THEN now() END,
           CASE WHEN c.erase IS NULL THEN 'the connection states no erase operation: its target was not told' END
    FROM connections c;
    PERFORM pg_notify('courier_erasures', found::text);
    RETURN found;
END $$;

-- A stored text with each of `values` replaced by a mark (case-insensitively).
CREATE FUNCTION courier_scrub(t text, vals text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v text;
BEGIN
    IF t IS NULL THEN
        RETURN NULL;
    END IF;
    FOREACH v IN ARRAY vals LOOP
        IF v <> '' THEN
            t := regexp_replace(t, regexp_replace(v, '([.*+?^${}()|\[\]\\])', '\\\1', 'g'), '[erased]', 'gi');
        END IF;
    END LOOP;
    RETURN t;
END $$;

-- The ledger stays append-only, but an erasure may scrub a person's values from its error
-- texts (nothing else in a row changes).
CREATE OR REPLACE FUNCTION courier_ledger_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('courier.scrubbing', true) = 'on'
       AND (to_jsonb(NEW) - 'error') = (to_jsonb(OLD) - 'error') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'ledger is append-only';
END $$;
