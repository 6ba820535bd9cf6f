-- min_reader: 1
-- Version 1: one row per idempotency key, and a name/value table for
-- counters and settings that outlive a process.
PRAGMA application_id = 1734700402; -- 'gemr'

CREATE TABLE gemrecon_keys (
	key             TEXT    PRIMARY KEY NOT NULL,
	state           TEXT    NOT NULL CHECK (state IN ('pending', 'claimed', 'done', 'dead')),
	attempts        INTEGER NOT NULL DEFAULT 0,
	token           INTEGER NOT NULL DEFAULT 0,
	first_source    TEXT    NOT NULL,
	sources         TEXT    NOT NULL,           -- ",poll,webhook," in first-seen order
	seen_count      INTEGER NOT NULL DEFAULT 1,
	first_seen_at   INTEGER NOT NULL,           -- unix nanoseconds, like every time here
	last_seen_at    INTEGER NOT NULL,
	lease_owner     TEXT    NOT NULL DEFAULT '',
	lease_until     INTEGER NOT NULL DEFAULT 0,
	next_attempt_at INTEGER NOT NULL DEFAULT 0,
	done_at         INTEGER NOT NULL DEFAULT 0,
	last_error      TEXT    NOT NULL DEFAULT '',
	conflicts       INTEGER NOT NULL DEFAULT 0,
	payload         BLOB,
	payload_sha     BLOB                        -- SHA-256 of payload; NULL when empty
) WITHOUT ROWID;

CREATE INDEX gemrecon_keys_due ON gemrecon_keys (state, next_attempt_at, first_seen_at);

CREATE TABLE gemrecon_meta (
	name  TEXT    PRIMARY KEY NOT NULL,
	value INTEGER NOT NULL
) WITHOUT ROWID;
