-- min_reader: 2
-- Version 2: fewer pages per commit, and operator-retry history.
--
-- A durable commit costs one disk sync whose price grows with the pages it
-- writes. Version 1 rewrote the payload (often kilobytes) and three index
-- entries on every claim and completion. Version 2 keeps payloads in their
-- own table, written once, and replaces the indexes by one on
-- (state, due_at, first_seen_at), where due_at is the time that matters in
-- the current state: next attempt (pending), lease end (claimed), done time
-- (done), 0 (dead).
CREATE TABLE gemrecon_payloads (
	key         TEXT PRIMARY KEY NOT NULL,
	payload     BLOB NOT NULL,
	payload_sha BLOB NOT NULL                   -- SHA-256 of payload
) WITHOUT ROWID;

INSERT INTO gemrecon_payloads (key, payload, payload_sha)
	SELECT key, payload, payload_sha FROM gemrecon_keys WHERE payload IS NOT NULL AND length(payload) > 0;

DROP INDEX gemrecon_keys_due;
ALTER TABLE gemrecon_keys DROP COLUMN payload;
ALTER TABLE gemrecon_keys DROP COLUMN payload_sha;

-- Retry resets attempts so a retried key gets a fresh budget; retries keeps count.
ALTER TABLE gemrecon_keys ADD COLUMN retries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE gemrecon_keys ADD COLUMN due_at INTEGER NOT NULL DEFAULT 0;

UPDATE gemrecon_keys SET due_at = CASE state
	WHEN 'pending' THEN next_attempt_at
	WHEN 'claimed' THEN lease_until
	WHEN 'done' THEN done_at
	ELSE 0 END;

CREATE INDEX gemrecon_keys_due ON gemrecon_keys (state, due_at, first_seen_at);

INSERT INTO gemrecon_meta (name, value) VALUES ('fenced', 0) ON CONFLICT (name) DO NOTHING;
