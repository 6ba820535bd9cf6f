-- min_reader: 1
-- gemrecon sink, schema version 3: the API is the truth (spec §9).
-- Additive: new columns with constant defaults (no table rewrite) and a new
-- table, so binaries that know version 1 or 2 keep working (they ignore
-- them and run unconfirmed keys on their webhook body, as before).
--
-- Key row, small columns: confirmed (the payload is the API's operation),
-- batch_state (the batch's own state, normalised; '' when unknown),
-- needs_confirm (every sighting so far was verified only by a dynamic
-- signature: no process runs the key unconfirmed), dead_reason (the class of
-- a dead key's failure: '' for the effect's, 'unknown_to_api').
ALTER TABLE gemrecon_keys
    ADD COLUMN confirmed     boolean NOT NULL DEFAULT false,
    ADD COLUMN batch_state   text    NOT NULL DEFAULT '',
    ADD COLUMN needs_confirm boolean NOT NULL DEFAULT false,
    ADD COLUMN dead_reason   text    NOT NULL DEFAULT '';

-- Written once, apart from the key row: the first webhook body once the
-- payload is the API's operation (while a webhook-first key is unconfirmed
-- its payload IS that body, stored once), and where its results were
-- written. Deleted with the key (an older binary's purge included).
CREATE TABLE gemrecon_key_extras (
    key          text  PRIMARY KEY REFERENCES gemrecon_keys (key) ON DELETE CASCADE,
    webhook      bytea,
    results_file text  NOT NULL DEFAULT ''
);

-- Rows stored before: a poll-first key's payload is the listed operation.
UPDATE gemrecon_keys SET confirmed = true WHERE first_source = 'poll';

-- batch_state from the stored payload: its "state", "metadata.state",
-- "data.state" (strings), else a batch.* event type; normalised as canon
-- does. A payload that is not JSON (or not UTF-8) leaves ''; the parse is
-- guarded so that no payload can fail the migration.
CREATE FUNCTION pg_temp.gemrecon_json(p bytea) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN convert_from(p, 'UTF8')::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

UPDATE gemrecon_keys k SET batch_state = s.st
FROM (
    SELECT key, CASE WHEN n = 'CANCELED' THEN 'CANCELLED' WHEN n = 'COMPLETED' AND from_type THEN '' ELSE n END AS st
    FROM (
        SELECT key, from_type, CASE
            WHEN left(u, 12) = 'BATCH_STATE_' THEN substr(u, 13)
            WHEN left(u, 10) = 'JOB_STATE_' THEN substr(u, 11)
            WHEN left(u, 6) = 'BATCH.' THEN substr(u, 7)
            ELSE u END AS n
        FROM (
            SELECT key,
                upper(btrim(coalesce(
                    CASE WHEN jsonb_typeof(j -> 'state') = 'string' THEN j ->> 'state' END,
                    CASE WHEN jsonb_typeof(j -> 'metadata' -> 'state') = 'string' THEN j -> 'metadata' ->> 'state' END,
                    CASE WHEN jsonb_typeof(j -> 'data' -> 'state') = 'string' THEN j -> 'data' ->> 'state' END,
                    CASE WHEN jsonb_typeof(j -> 'type') = 'string' AND lower(left(j ->> 'type', 6)) = 'batch.' THEN j ->> 'type' END,
                    ''))) AS u,
                coalesce(jsonb_typeof(j -> 'state') = 'string' OR jsonb_typeof(j -> 'metadata' -> 'state') = 'string'
                    OR jsonb_typeof(j -> 'data' -> 'state') = 'string', false) = false AS from_type
            FROM (SELECT key, pg_temp.gemrecon_json(payload) AS j FROM gemrecon_keys WHERE payload IS NOT NULL) AS parsed
            WHERE jsonb_typeof(j) = 'object'
        ) AS raw
    ) AS normalised
) AS s
WHERE k.key = s.key AND s.st <> '';

DROP FUNCTION pg_temp.gemrecon_json(bytea);
