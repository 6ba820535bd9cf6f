-- min_reader: 2
-- Version 6: every attempt on record, operator reruns, and what the passes
-- saw unfinished (spec §3 "History", §7, §5.5). Additive: binaries that know
-- versions 2 to 5 keep working; their attempts leave gaps in a key's history
-- (tokens with no entry), which status counts as missing.
--
-- gemrecon_history keeps the last entries of each key: an attempt (from its
-- claim to its outcome), a fenced outcome, an operator's retry or rerun.
-- history_dropped counts the older entries it no longer keeps. A key's
-- entries go with it (purge), also when an older binary purges.
CREATE TABLE gemrecon_history (
	key     TEXT    NOT NULL REFERENCES gemrecon_keys (key) ON DELETE CASCADE,
	seq     INTEGER NOT NULL,
	kind    TEXT    NOT NULL,              -- attempt, fenced, retry, rerun
	token   INTEGER NOT NULL,
	command TEXT    NOT NULL DEFAULT '',   -- poll, serve, drain (attempts)
	holder  TEXT    NOT NULL DEFAULT '',   -- the lease owner, or user@host
	started INTEGER NOT NULL,              -- unix nanoseconds
	ended   INTEGER NOT NULL DEFAULT 0,
	outcome TEXT    NOT NULL DEFAULT '',
	error   TEXT    NOT NULL DEFAULT '',
	PRIMARY KEY (key, seq)
) WITHOUT ROWID;

ALTER TABLE gemrecon_keys ADD COLUMN history_dropped INTEGER NOT NULL DEFAULT 0;
-- reruns: the operator's reruns of a done key; no_results: run without the
-- batch's results (retry --without-results); batch_end: the batch's own
-- endTime (unix nanoseconds, 0 unknown), when its results expire from.
ALTER TABLE gemrecon_keys ADD COLUMN reruns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE gemrecon_keys ADD COLUMN no_results INTEGER NOT NULL DEFAULT 0;
ALTER TABLE gemrecon_keys ADD COLUMN batch_end INTEGER NOT NULL DEFAULT 0;

-- What the last pass of a scope listed unfinished: counts by state as JSON
-- ({"PENDING": 3}), and the creation time of the oldest.
ALTER TABLE gemrecon_passes ADD COLUMN unfinished TEXT NOT NULL DEFAULT '';
ALTER TABLE gemrecon_passes ADD COLUMN oldest_unfinished INTEGER NOT NULL DEFAULT 0;
