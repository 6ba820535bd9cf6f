-- min_reader: 2
-- Version 4: the API is the truth (spec §9). Additive: new columns with
-- defaults, so binaries that know version 2 or 3 keep working (they ignore
-- these columns and run unconfirmed keys on their webhook body, as before).
--
-- In the key row, small columns only (it is rewritten by every claim and
-- completion): confirmed (the payload is the API's operation), batch_state
-- (the batch's own state, normalised; '' when unknown), needs_confirm
-- (every sighting so far was verified only by a dynamic signature: no
-- process runs the key unconfirmed) and dead_reason (the class of a dead
-- key's failure: '' for the effect's, 'unknown_to_api').
ALTER TABLE gemrecon_keys ADD COLUMN confirmed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE gemrecon_keys ADD COLUMN batch_state TEXT NOT NULL DEFAULT '';
ALTER TABLE gemrecon_keys ADD COLUMN needs_confirm INTEGER NOT NULL DEFAULT 0;
ALTER TABLE gemrecon_keys ADD COLUMN dead_reason TEXT NOT NULL DEFAULT '';

-- Bodies stay in the payloads table, written once: webhook is the first
-- webhook body once the payload is the API's operation (while a
-- webhook-first key is unconfirmed its payload IS that body, stored once),
-- results_file where its results were written.
ALTER TABLE gemrecon_payloads ADD COLUMN webhook BLOB;
ALTER TABLE gemrecon_payloads ADD COLUMN results_file TEXT NOT NULL DEFAULT '';

-- Rows stored before: a poll-first key's payload is the listed operation.
UPDATE gemrecon_keys SET confirmed = 1 WHERE first_source = 'poll';

-- batch_state from the stored payload: its "state", "metadata.state",
-- "data.state" (text), else a batch.* event type; normalised as canon does
-- (upper case, BATCH_STATE_ / JOB_STATE_ / batch. prefixes dropped,
-- CANCELED spelled CANCELLED; batch.completed names no state). A payload
-- that is not JSON, or says nothing, leaves '' ("batch: unknown").
UPDATE gemrecon_keys SET batch_state = s.st FROM (
	SELECT key, CASE WHEN n = 'CANCELED' THEN 'CANCELLED' WHEN n = 'COMPLETED' AND from_type THEN '' ELSE n END AS st
	FROM (
		SELECT key, from_type, CASE
			WHEN substr(u, 1, 12) = 'BATCH_STATE_' THEN substr(u, 13)
			WHEN substr(u, 1, 10) = 'JOB_STATE_' THEN substr(u, 11)
			WHEN substr(u, 1, 6) = 'BATCH.' THEN substr(u, 7)
			ELSE u END AS n
		FROM (
			SELECT key, upper(trim(coalesce(
				CASE WHEN json_type(j, '$.state') = 'text' THEN json_extract(j, '$.state') END,
				CASE WHEN json_type(j, '$.metadata.state') = 'text' THEN json_extract(j, '$.metadata.state') END,
				CASE WHEN json_type(j, '$.data.state') = 'text' THEN json_extract(j, '$.data.state') END,
				CASE WHEN json_type(j, '$.type') = 'text' AND lower(substr(json_extract(j, '$.type'), 1, 6)) = 'batch.'
					THEN json_extract(j, '$.type') END, ''))) AS u,
				coalesce(json_type(j, '$.state') = 'text' OR json_type(j, '$.metadata.state') = 'text'
					OR json_type(j, '$.data.state') = 'text', 0) = 0 AS from_type
			-- Every json_* call gets valid JSON: an error would abort the
			-- migration (and so every start).
			FROM (SELECT key, CASE WHEN json_valid(CAST(payload AS TEXT)) THEN CAST(payload AS TEXT) ELSE '{}' END AS j
				FROM gemrecon_payloads)
		)
	)
) AS s
WHERE gemrecon_keys.key = s.key AND s.st <> '';
