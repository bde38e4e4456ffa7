-- jobrelay schema, version 3: skip NOTIFY while a relay is awake.
--
-- A transaction that NOTIFYs takes a database-wide lock at commit and holds it through its WAL
-- flush, so concurrent producers that all notify commit one at a time (measured here: 4
-- single-row producers went from ~700 to ~260 commits/s). A relay that is busy does not need
-- the wake-up: it polls. So while a relay holds a lease in this table, the trigger skips
-- pg_notify; when the relay lets the lease lapse it waits until every transaction that could
-- have seen the lease has ended, claims once more, and from then on producers notify again.
CREATE TABLE jobrelay_wakeup (
    channel     text        PRIMARY KEY,
    awake_until timestamptz NOT NULL DEFAULT '-infinity'
);

COMMENT ON TABLE jobrelay_wakeup IS
    'jobrelay: while awake_until is in the future a relay polls channel''s table, and inserts skip NOTIFY';

-- SECURITY DEFINER: producers need no privilege on jobrelay_wakeup to insert jobs.
CREATE OR REPLACE FUNCTION jobrelay_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    -- clock_timestamp(), not now(): a long transaction must not judge the lease by its start.
    IF NOT EXISTS (SELECT 1 FROM jobrelay_wakeup
                   WHERE channel = TG_ARGV[0] AND awake_until > clock_timestamp()) THEN
        PERFORM pg_notify(TG_ARGV[0], '');
    END IF;
    RETURN NULL;
END
$$;
