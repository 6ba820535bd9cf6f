-- min_reader: 1
-- gemrecon sink, schema version 4: every attempt on record, operator reruns,
-- and what the passes saw unfinished (spec §3 "History", §7, §5.5).
-- Additive: binaries that know versions 1 to 3 keep working; their attempts
-- leave gaps in a key's history (tokens with no entry), which status counts
-- as missing. A key's entries go with it (ON DELETE CASCADE), also when an
-- older binary purges.
CREATE TABLE gemrecon_history (
    key     text        NOT NULL REFERENCES gemrecon_keys (key) ON DELETE CASCADE,
    seq     integer     NOT NULL,
    kind    text        NOT NULL,              -- attempt, fenced, retry, rerun
    token   bigint      NOT NULL,
    command text        NOT NULL DEFAULT '',   -- poll, serve, drain (attempts)
    holder  text        NOT NULL DEFAULT '',   -- the lease owner, or user@host
    started timestamptz NOT NULL,
    ended   timestamptz,
    outcome text        NOT NULL DEFAULT '',
    error   text        NOT NULL DEFAULT '',
    PRIMARY KEY (key, seq)
);

ALTER TABLE gemrecon_keys
    ADD COLUMN history_dropped integer NOT NULL DEFAULT 0,
    ADD COLUMN reruns          integer NOT NULL DEFAULT 0,
    ADD COLUMN no_results      boolean NOT NULL DEFAULT false,
    ADD COLUMN batch_end       timestamptz;

ALTER TABLE gemrecon_passes
    ADD COLUMN unfinished        jsonb,
    ADD COLUMN oldest_unfinished timestamptz;
