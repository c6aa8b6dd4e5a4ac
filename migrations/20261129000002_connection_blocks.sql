-- A 429 blocks its whole connection until `blocked_until`; every worker process sees it.
CREATE TABLE connection_blocks (
    connection_id   bigint PRIMARY KEY REFERENCES connections (id) ON DELETE CASCADE,
    blocked_until   timestamptz NOT NULL,
    -- The rule and run whose call met the 429, and the raw header value it carried.
    rule_id         bigint REFERENCES rules (id) ON DELETE SET NULL,
    run_id          bigint REFERENCES runs (id) ON DELETE SET NULL,
    retry_after_raw text,
    set_at          timestamptz NOT NULL
);

-- A waiting run resumes at `resume_at`; a throttled run records when the block ends.
ALTER TABLE runs ADD COLUMN resume_at timestamptz, ADD COLUMN throttled_until timestamptz;
