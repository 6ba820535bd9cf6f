-- min_reader: 2
-- Version 5: fewer pages per commit (issue 17). The due index held every
-- key, so that each completion moved the key's entry from ('claimed', lease
-- end) to ('done', done time): two index pages per Complete, and done keys
-- (almost all of them) filled the index. Two partial indexes replace it,
-- one per state a claimer looks for: pending keys by the time they are due,
-- claimed keys by the end of their lease. A completion only deletes its
-- entry; a key recorded and claimed in one commit enters one index once.
-- Older binaries (versions 2 to 4) keep working: their queries name no
-- index, and their due query (state = 'pending' / state = 'claimed') uses
-- these. Each keeps the state column, constant in it, so that the due query
-- reads the index alone (a covering index on every SQLite version). Purge and
-- the state counts of Stats read the table instead.
DROP INDEX gemrecon_keys_due;
CREATE INDEX gemrecon_keys_due ON gemrecon_keys (state, due_at, first_seen_at) WHERE state = 'pending';
CREATE INDEX gemrecon_keys_leases ON gemrecon_keys (state, due_at, first_seen_at) WHERE state = 'claimed';
