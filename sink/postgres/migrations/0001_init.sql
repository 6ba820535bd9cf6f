-- min_reader: 1
-- gemrecon sink, schema version 1: one row per idempotency key (spec §3).
CREATE TABLE gemrecon_keys (
    key             text        PRIMARY KEY,
    state           text        NOT NULL CHECK (state IN ('pending', 'claimed', 'done', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    token           bigint      NOT NULL DEFAULT 0,
    first_source    text        NOT NULL,
    sources         text[]      NOT NULL,
    seen_count      bigint      NOT NULL DEFAULT 1,
    first_seen_at   timestamptz NOT NULL,
    last_seen_at    timestamptz NOT NULL,
    lease_owner     text,
    lease_until     timestamptz,
    claim_nonce     bigint,      -- random per claim statement: finds a cut-off claim's rows
    took_over       boolean     NOT NULL DEFAULT false, -- the current claim took over an expired lease
    next_attempt_at timestamptz,
    done_at         timestamptz,
    last_error      text,
    conflicts       bigint      NOT NULL DEFAULT 0,
    retries         integer     NOT NULL DEFAULT 0,  -- operator retries (each restarts attempts)
    payload         bytea,
    payload_sha256  bytea
);

-- Due work: pending keys by due time, expired leases by lease end.
CREATE INDEX gemrecon_keys_pending ON gemrecon_keys (next_attempt_at) WHERE state = 'pending';
CREATE INDEX gemrecon_keys_claimed ON gemrecon_keys (lease_until) WHERE state = 'claimed';
CREATE INDEX gemrecon_keys_done ON gemrecon_keys (done_at) WHERE state = 'done';
CREATE INDEX gemrecon_keys_order ON gemrecon_keys (first_seen_at, key);

-- Durable counters that outlive rows (fenced outcomes).
CREATE TABLE gemrecon_counters (
    name  text   PRIMARY KEY,
    value bigint NOT NULL
);
INSERT INTO gemrecon_counters (name, value) VALUES ('fenced', 0);

-- The longest poll lookback ever used, guarding purge (spec §7).
CREATE TABLE gemrecon_lookback (
    id          integer PRIMARY KEY CHECK (id = 1),
    max_micros  bigint  NOT NULL,
    forever     boolean NOT NULL
);
