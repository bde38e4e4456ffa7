-- jobrelay schema, version 5: the wake-up lease becomes an advisory lock, checked in the
-- trigger's WHEN clause.
--
-- Version 4's trigger called a PL/pgSQL function on every INSERT statement, which ran a query on
-- jobrelay_wakeup: measured with 8 single-row producers and a relay running, it cost them about
-- 18% of their insert rate even though no NOTIFY was sent. Now a busy relay holds the
-- session-level advisory lock (27250, hashtext(<channel>)) exclusively, and the trigger fires
-- only WHEN the producer can take that lock shared, i.e. when no relay is busy: a plain function
-- call in the executor, and no PL/pgSQL at all while a relay is busy. The shared lock is a
-- transaction-level one, released at the producer's commit, so a relay about to sleep can wait
-- for every producer that skipped its NOTIFY (src/relay/lease.rs). Advisory locks need no
-- privilege, and a relay that dies releases its lock with its session.
--
-- 27250 is 0x6A72, "jr": applications that use two-key advisory locks should avoid that first
-- key.

CREATE OR REPLACE FUNCTION jobrelay_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY INVOKER AS $$
BEGIN
    -- Reached only when no relay holds the wake-up lock (see the trigger's WHEN clause).
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;

-- (Re)creates the notify trigger of one outbox table for `channel`.
CREATE OR REPLACE FUNCTION jobrelay_notify_trigger(tbl regclass, trigger_name text, channel text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trigger_name, tbl);
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s FOR EACH STATEMENT '
                   'WHEN (pg_try_advisory_xact_lock_shared(27250, hashtext(%L))) '
                   'EXECUTE FUNCTION jobrelay_notify(%L)', trigger_name, tbl, channel, channel);
END
$$;

-- Every existing jobrelay trigger (pending_jobs, and tables made by jobrelay_create_outbox)
-- gets the WHEN clause, keeping its channel.
DO $migration$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT tg.tgrelid::regclass AS tbl, tg.tgname,
               split_part(encode(tg.tgargs, 'escape'), '\000', 1) AS channel
        FROM pg_trigger tg
        WHERE tg.tgfoid = 'jobrelay_notify'::regproc AND NOT tg.tgisinternal
    LOOP
        PERFORM jobrelay_notify_trigger(t.tbl, t.tgname, t.channel);
    END LOOP;
END
$migration$;

CREATE OR REPLACE FUNCTION jobrelay_create_outbox(qualified text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    parts  text[] := string_to_array(qualified, '.');
    sch    text;
    tbl    text;
BEGIN
    IF array_length(parts, 1) = 1 THEN
        sch := current_schema(); tbl := parts[1];
    ELSIF array_length(parts, 1) = 2 THEN
        sch := parts[1]; tbl := parts[2];
    ELSE
        RAISE EXCEPTION 'jobrelay_create_outbox: % is not a table name or schema.table', qualified;
    END IF;
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I (LIKE public.pending_jobs INCLUDING ALL)', sch, tbl);
    EXECUTE format('ALTER TABLE %I.%I SET (autovacuum_vacuum_scale_factor = 0, '
                   'autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_insert_scale_factor = 0, '
                   'autovacuum_vacuum_insert_threshold = 10000, autovacuum_analyze_scale_factor = 0, '
                   'autovacuum_analyze_threshold = 10000, autovacuum_vacuum_cost_delay = 0)', sch, tbl);
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I (LIKE public.pending_jobs_dead INCLUDING ALL)',
                   sch, tbl || '_dead');
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE n.nspname = sch AND c.relname = tbl AND t.tgname = tbl || '_notify') THEN
        PERFORM jobrelay_notify_trigger(format('%I.%I', sch, tbl)::regclass, tbl || '_notify',
                                        qualified);
    END IF;
END
$$;

-- The lease table of versions 3 and 4 is no longer read or written.
DROP TABLE jobrelay_wakeup;
