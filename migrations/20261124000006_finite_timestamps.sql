-- jobrelay schema, version 6: run_at and created_at must be instants a job can carry.
--
-- A job carries them as google.protobuf.Timestamp (SPEC 3), whose range is
-- 0001-01-01T00:00:00Z ..= 9999-12-31T23:59:59.999999999Z. A timestamptz also holds 'infinity',
-- '-infinity' and the years 4713 BC ..= 294276 AD; a row with such a run_at or created_at can
-- never become a job. The relay dead-letters it (SPEC 5.4), but the producer should hear of it in
-- its own transaction, like any other invalid row: these CHECK constraints refuse it at insert.
-- isfinite() alone would not do: year 10000 is finite.
--
-- The constraints are added NOT VALID: rows already in a table are not checked (they must not
-- make this migration fail; the relay dead-letters them), new and updated rows are. Once those
-- rows are gone, `ALTER TABLE ... VALIDATE CONSTRAINT` turns them into plain constraints.
-- Adding a constraint takes a brief ACCESS EXCLUSIVE lock on each outbox table.

-- Not STRICT, so that the planner can inline it; NULL gives NULL, which a CHECK lets pass.
-- IMMUTABLE holds: the bounds carry their offset, so no session setting changes the answer.
CREATE FUNCTION jobrelay_timestamp_relayable(t timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT t BETWEEN '0001-01-01 00:00:00+00'::timestamptz
                 AND '9999-12-31 23:59:59.999999+00'::timestamptz
$$;

-- Adds the two constraints to one outbox table, NOT VALID, unless it has them already. They get
-- the names pending_jobs's have, as on every table made with LIKE pending_jobs INCLUDING ALL
-- (which copies the other CHECK constraints under pending_jobs's names too): constraint names
-- only need to be unique per table, and these fit in 63 bytes whatever the table is called.
CREATE FUNCTION jobrelay_add_timestamp_checks(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = tbl AND conname = 'pending_jobs_run_at_check') THEN
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT pending_jobs_run_at_check '
                       'CHECK (run_at IS NULL OR jobrelay_timestamp_relayable(run_at)) NOT VALID',
                       tbl);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = tbl AND conname = 'pending_jobs_created_at_check') THEN
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT pending_jobs_created_at_check '
                       'CHECK (jobrelay_timestamp_relayable(created_at)) NOT VALID', tbl);
    END IF;
END
$$;

-- pending_jobs, and every other outbox: the tables with a jobrelay notify trigger (as version 5
-- found them) that have the outbox's columns. Before version 6, `jobrelay migrate --table T` also
-- put the trigger on an existing table of another shape (an application's own table, say): such
-- a table is left alone, with a notice.
DO $migration$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT c.oid::regclass AS tbl,
               (SELECT count(*) FROM pg_attribute a
                JOIN (VALUES ('id', 'bigint'::regtype), ('uuid', 'uuid'), ('queue', 'text'),
                             ('job_type', 'text'), ('payload', 'bytea'), ('parent_uuid', 'uuid'),
                             ('predecessor_uuid', 'uuid'), ('dead_parent', 'boolean'),
                             ('run_at', 'timestamptz'), ('headers', 'jsonb'),
                             ('created_at', 'timestamptz'), ('attempts', 'integer'),
                             ('available_at', 'timestamptz'), ('last_error', 'text'))
                     AS want(name, typ) ON a.attname = want.name AND a.atttypid = want.typ
                WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) = 14 AS fits
        FROM pg_class c
        WHERE c.relkind = 'r'
          AND (c.oid = 'pending_jobs'::regclass
               OR EXISTS (SELECT 1 FROM pg_trigger tg
                          WHERE tg.tgrelid = c.oid AND NOT tg.tgisinternal
                            AND tg.tgfoid = 'jobrelay_notify'::regproc))
    LOOP
        IF t.fits THEN
            PERFORM jobrelay_add_timestamp_checks(t.tbl);
        ELSE
            RAISE NOTICE 'jobrelay: % has a jobrelay trigger but not the outbox''s columns; '
                         'no timestamp constraints added', t.tbl;
        END IF;
    END LOOP;
END
$migration$;

-- New outboxes copy the constraints from pending_jobs (LIKE ... INCLUDING ALL copies NOT VALID
-- CHECK constraints too, as valid ones: the new table is empty). An existing table of the right
-- shape that `jobrelay migrate --table T` adopts gets them here, NOT VALID.
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
    PERFORM jobrelay_add_timestamp_checks(format('%I.%I', sch, tbl)::regclass);
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
