-- Version 2: keep the history of operator retries (Retry resets attempts so a
-- retried key gets a fresh attempt budget), find expired leases and old done
-- rows by index, and seed the durable fenced-outcome counter.
ALTER TABLE gemrecon_keys ADD COLUMN retries INTEGER NOT NULL DEFAULT 0;

CREATE INDEX gemrecon_keys_lease ON gemrecon_keys (state, lease_until);
CREATE INDEX gemrecon_keys_done ON gemrecon_keys (state, done_at);

INSERT INTO gemrecon_meta (name, value) VALUES ('fenced', 0) ON CONFLICT (name) DO NOTHING;
