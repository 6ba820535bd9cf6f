-- min_reader: 1
-- gemrecon sink, schema version 2: the reconciliation pass records and pass
-- lease of spec §5.5, one row per scope. A new table: binaries that know
-- version 1 keep working.
--
-- last_start, last_end, last_holder: the last pass that listed (as its
-- process reported it); last_success: the end of the last pass that listed
-- fully with every effect succeeding; last_full_scan: the start of the last
-- pass that read every page. ended_at is the sink's clock (the database's)
-- when the last pass was recorded: the minimum interval between passes is
-- measured from it, so that replicas whose clocks disagree still agree.
-- holder/held_until/token: the pass lease (holder NULL when free; a lease is
-- live while now < held_until); token is the fencing token, incremented by
-- every acquisition. op_nonce is random per write: it finds the outcome of
-- a statement whose reply was lost.
CREATE TABLE gemrecon_passes (
    scope          text        PRIMARY KEY,
    last_start     timestamptz,
    last_end       timestamptz,
    last_holder    text,
    last_success   timestamptz,
    last_full_scan timestamptz,
    ended_at       timestamptz,
    holder         text,
    held_until     timestamptz,
    token          bigint      NOT NULL DEFAULT 0,
    op_nonce       bigint
);
