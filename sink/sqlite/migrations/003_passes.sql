-- min_reader: 2
-- Version 3: the reconciliation pass records and pass lease of spec §5.5, one
-- row per scope. A new table: binaries that know version 2 keep working.
--
-- last_start, last_end, last_holder: the last pass that listed (as its
-- process reported it); last_success: the end of the last pass that listed
-- fully with every effect succeeding; last_full_scan: the start of the last
-- pass that read every page. ended_at is this database's clock (the sink's)
-- when the last pass was recorded: the minimum interval between passes is
-- measured from it. holder/held_until/token: the pass lease (holder '' when
-- free; a lease is live while now < held_until); token is the fencing token,
-- incremented by every acquisition. Times are unix nanoseconds, 0 = never.
CREATE TABLE gemrecon_passes (
	scope          TEXT    PRIMARY KEY NOT NULL,
	last_start     INTEGER NOT NULL DEFAULT 0,
	last_end       INTEGER NOT NULL DEFAULT 0,
	last_holder    TEXT    NOT NULL DEFAULT '',
	last_success   INTEGER NOT NULL DEFAULT 0,
	last_full_scan INTEGER NOT NULL DEFAULT 0,
	ended_at       INTEGER NOT NULL DEFAULT 0,
	holder         TEXT    NOT NULL DEFAULT '',
	held_until     INTEGER NOT NULL DEFAULT 0,
	token          INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
