-- courier's delivery engine: connections, rules, deliveries, runs, ledger, circuit breakers.
-- apalis keeps its own tables in schema `apalis` (applied by PostgresStorage::setup).

-- One configured link to one target account. The credential itself is never stored:
-- `api_key_env` names the environment variable the worker reads it from.
CREATE TABLE connections (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                text NOT NULL UNIQUE CHECK (name <> ''),
    writer              text NOT NULL CHECK (writer IN ('http_json')),
    base_url            text NOT NULL CHECK (base_url ~ '^https?://'),
    api_key_env         text CHECK (api_key_env ~ '^[A-Za-z_][A-Za-z0-9_]*$'),
    headers             jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    requests_per_minute integer CHECK (requests_per_minute > 0),
    max_in_flight       integer NOT NULL DEFAULT 8 CHECK (max_in_flight BETWEEN 1 AND 1000),
    timeout_ms          integer NOT NULL DEFAULT 10000 CHECK (timeout_ms BETWEEN 1 AND 600000),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- The circuit breaker of a connection, shared by every worker process.
CREATE TABLE circuits (
    connection_id        bigint PRIMARY KEY REFERENCES connections (id) ON DELETE CASCADE,
    state                text NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open', 'half_open')),
    consecutive_failures integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    times_opened         integer NOT NULL DEFAULT 0 CHECK (times_opened >= 0),
    open_until           timestamptz,
    probe_run_id         bigint,
    last_error           text,
    updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION courier_connection_circuit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO circuits (connection_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
    RETURN NEW;
END $$;
CREATE TRIGGER connections_circuit AFTER INSERT ON connections
    FOR EACH ROW EXECUTE FUNCTION courier_connection_circuit();

-- One stream of records delivered into one connection.
CREATE TABLE rules (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name            text NOT NULL UNIQUE CHECK (name <> ''),
    connection_id   bigint NOT NULL REFERENCES connections (id) ON DELETE CASCADE,
    -- Appended to the connection's base URL by the HTTP writer; the operation for User.com.
    path            text NOT NULL DEFAULT '',
    enabled         boolean NOT NULL DEFAULT true,
    batch_size      integer NOT NULL DEFAULT 100 CHECK (batch_size BETWEEN 1 AND 10000),
    max_attempts    integer NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 1000),
    backoff_base_ms integer NOT NULL DEFAULT 1000 CHECK (backoff_base_ms > 0),
    backoff_max_ms  integer NOT NULL DEFAULT 3600000 CHECK (backoff_max_ms >= backoff_base_ms),
    -- The rule's lock while one chain job executes: a lease, never a held transaction.
    lease_owner     text,
    lease_until     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rules_connection ON rules (connection_id);

-- One record to deliver by one rule.
CREATE TABLE deliveries (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule_id         bigint NOT NULL REFERENCES rules (id) ON DELETE CASCADE,
    record_key      text NOT NULL CHECK (record_key <> ''),
    payload         jsonb NOT NULL,
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'delivered', 'rejected', 'exhausted', 'suppressed')),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    hold_until      timestamptz,
    depends_on      text,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
-- The chain's claim: pending deliveries of a rule in id order.
CREATE INDEX deliveries_pending ON deliveries (rule_id, id) WHERE status = 'pending';
-- The dispatcher's question: does a rule have anything due?
CREATE INDEX deliveries_due ON deliveries (rule_id, next_attempt_at) WHERE status = 'pending';
-- Supersession: a newer pending delivery with the same rule and key.
CREATE INDEX deliveries_pending_key ON deliveries (rule_id, record_key, id) WHERE status = 'pending';

-- The last payload delivered per rule and record key: the basis of suppression and of
-- `depends_on`. Kept apart from `deliveries` so both checks are one index probe.
CREATE TABLE delivered_records (
    rule_id       bigint NOT NULL REFERENCES rules (id) ON DELETE CASCADE,
    record_key    text NOT NULL,
    connection_id bigint NOT NULL REFERENCES connections (id) ON DELETE CASCADE,
    payload       jsonb NOT NULL,
    delivery_id   bigint NOT NULL,
    delivered_at  timestamptz NOT NULL,
    PRIMARY KEY (rule_id, record_key)
);
CREATE INDEX delivered_records_connection_key ON delivered_records (connection_id, record_key);

-- A plain INSERT into deliveries wakes the dispatcher: one notification per statement.
CREATE FUNCTION courier_notify_deliveries() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('courier_deliveries', '');
    RETURN NULL;
END $$;
CREATE TRIGGER deliveries_notify AFTER INSERT ON deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION courier_notify_deliveries();

-- One pass of a rule over its due deliveries, executed as a chain of apalis jobs.
CREATE TABLE runs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule_id      bigint NOT NULL REFERENCES rules (id) ON DELETE CASCADE,
    status       text NOT NULL DEFAULT 'running'
                 CHECK (status IN ('running', 'waiting', 'completed', 'circuit_open', 'throttled', 'stale', 'failed')),
    -- The highest delivery id this run has handled: a run visits each delivery at most once.
    cursor_id    bigint NOT NULL DEFAULT 0,
    jobs         integer NOT NULL DEFAULT 0,
    delivered    integer NOT NULL DEFAULT 0,
    failed       integer NOT NULL DEFAULT 0,
    exhausted    integer NOT NULL DEFAULT 0,
    rejected     integer NOT NULL DEFAULT 0,
    suppressed   integer NOT NULL DEFAULT 0,
    held         integer NOT NULL DEFAULT 0,
    started_by   text NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    error        text,
    CHECK ((status IN ('running', 'waiting')) = (finished_at IS NULL))
);
-- At most one active run per rule, enforced here and not only in code.
CREATE UNIQUE INDEX runs_one_active_per_rule ON runs (rule_id) WHERE status IN ('running', 'waiting');
CREATE INDEX runs_rule_started ON runs (rule_id, started_at DESC);
CREATE INDEX runs_active_heartbeat ON runs (heartbeat_at) WHERE status IN ('running', 'waiting');

ALTER TABLE circuits ADD FOREIGN KEY (probe_run_id) REFERENCES runs (id) ON DELETE SET NULL;

-- Append-only: one row per outcome of one delivery in one run.
CREATE TABLE ledger (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      bigint NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    delivery_id bigint NOT NULL REFERENCES deliveries (id) ON DELETE CASCADE,
    rule_id     bigint NOT NULL REFERENCES rules (id) ON DELETE CASCADE,
    outcome     text NOT NULL
                CHECK (outcome IN ('delivered', 'failed', 'exhausted', 'rejected', 'suppressed', 'held')),
    attempt     integer NOT NULL CHECK (attempt >= 0),
    http_status smallint,
    error       text,
    duration_ms integer,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_delivery ON ledger (delivery_id);
CREATE INDEX ledger_run ON ledger (run_id);

CREATE FUNCTION courier_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger is append-only';
END $$;
CREATE TRIGGER ledger_append_only BEFORE UPDATE ON ledger
    FOR EACH ROW EXECUTE FUNCTION courier_ledger_append_only();
