-- no-transaction
-- jobrelay schema, version 8: the runner's own job options, `options jsonb NOT NULL DEFAULT '{}'`,
-- on every outbox and its dead-letter table.
--
-- A job's options are the runner's own (Sidekiq's `retry`, BullMQ's `attempts`, ...): a JSON
-- object the layout carries into the runner's fields (docs/layouts/). The outbox refuses a
-- non-object in the producer's transaction (`pending_jobs_options_check`); the dead letters keep
-- whatever they are given, as for every other column.
--
-- Safe on a table in use:
-- - adding a column with a constant default (Postgres 11+) changes the catalog only: no row is
--   rewritten, existing rows read `{}`. It takes a brief ACCESS EXCLUSIVE lock per table;
-- - the CHECK is added `NOT VALID` (no scan) in that same short transaction, and validated in
--   a second transaction: `VALIDATE CONSTRAINT` scans the table under a SHARE UPDATE EXCLUSIVE
--   lock, which lets producers insert and relays claim and delete meanwhile. (In one
--   transaction the scan would run under the ACCESS EXCLUSIVE lock of the first step, stopping
--   every producer for as long as it reads the table: hence `-- no-transaction` above, and the
--   explicit transactions below.)
-- Run again after a failure in between, each step finds its work done and skips it.

-- Adds `options` to one outbox table and its CHECK, NOT VALID, unless it has them already (the
-- constraint gets pending_jobs's name, as migration 6's checks do). Without `checked`, for a
-- dead-letter table: the column only.
CREATE OR REPLACE FUNCTION jobrelay_add_options(tbl regclass, checked boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = tbl AND attname = 'options' AND NOT attisdropped) THEN
        EXECUTE format('ALTER TABLE %s ADD COLUMN options jsonb NOT NULL DEFAULT ''{}''', tbl);
    END IF;
    IF checked AND NOT EXISTS (SELECT 1 FROM pg_constraint
                               WHERE conrelid = tbl AND conname = 'pending_jobs_options_check') THEN
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT pending_jobs_options_check '
                       'CHECK (jsonb_typeof(options) = ''object'') NOT VALID', tbl);
    END IF;
END
$$;

-- The outboxes this migration changes: pending_jobs, and every other table with a jobrelay
-- notify trigger and the outbox's columns (as migration 6 found them), each with its
-- dead-letter table `<name>_dead` when that exists.
CREATE OR REPLACE FUNCTION jobrelay_outboxes() RETURNS TABLE (outbox regclass, dead regclass)
LANGUAGE sql STABLE AS $$
    SELECT c.oid::regclass,
           to_regclass(format('%I.%I', n.nspname, c.relname || '_dead'))
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind = 'r'
      AND (c.oid = 'pending_jobs'::regclass
           OR EXISTS (SELECT 1 FROM pg_trigger tg
                      WHERE tg.tgrelid = c.oid AND NOT tg.tgisinternal
                        AND tg.tgfoid = 'jobrelay_notify'::regproc))
      AND (SELECT count(*) FROM pg_attribute a
           JOIN (VALUES ('id', 'bigint'::regtype), ('uuid', 'uuid'), ('queue', 'text'),
                        ('job_type', 'text'), ('payload', 'bytea'), ('parent_uuid', 'uuid'),
                        ('predecessor_uuid', 'uuid'), ('dead_parent', 'boolean'),
                        ('run_at', 'timestamptz'), ('headers', 'jsonb'),
                        ('created_at', 'timestamptz'), ('attempts', 'integer'),
                        ('available_at', 'timestamptz'), ('last_error', 'text'))
                AS want(name, typ) ON a.attname = want.name AND a.atttypid = want.typ
           WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) = 14
$$;

-- Step 1, one short transaction: the columns and the NOT VALID checks; new outboxes get them too.
BEGIN;

DO $migration$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT * FROM jobrelay_outboxes() LOOP
        PERFORM jobrelay_add_options(t.outbox, true);
        IF t.dead IS NOT NULL THEN
            PERFORM jobrelay_add_options(t.dead, false);
        END IF;
    END LOOP;
END
$migration$;

-- New outboxes copy the column and the check from pending_jobs (LIKE ... INCLUDING ALL); an
-- existing table of the outbox's shape that `jobrelay migrate --table T` adopts, and its
-- dead-letter table, get them here (the check NOT VALID: `VALIDATE CONSTRAINT` it afterwards).
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
    PERFORM jobrelay_add_flow_indexes(format('%I.%I', sch, tbl)::regclass);
    PERFORM jobrelay_add_options(format('%I.%I', sch, tbl)::regclass, true);
    EXECUTE format('ALTER TABLE %I.%I SET (autovacuum_vacuum_scale_factor = 0, '
                   'autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_insert_scale_factor = 0, '
                   'autovacuum_vacuum_insert_threshold = 10000, autovacuum_analyze_scale_factor = 0, '
                   'autovacuum_analyze_threshold = 10000, autovacuum_vacuum_cost_delay = 0)', sch, tbl);
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I (LIKE public.pending_jobs_dead INCLUDING ALL)',
                   sch, tbl || '_dead');
    PERFORM jobrelay_add_options(format('%I.%I', sch, tbl || '_dead')::regclass, false);
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE n.nspname = sch AND c.relname = tbl AND t.tgname = tbl || '_notify') THEN
        PERFORM jobrelay_notify_trigger(format('%I.%I', sch, tbl)::regclass, tbl || '_notify',
                                        qualified);
    END IF;
END
$$;

COMMIT;

-- Step 2, another transaction: validate the checks (every existing row holds `{}`, so this only
-- reads each table once, without stopping its producers or relays).
BEGIN;

DO $migration$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT c.conrelid::regclass AS tbl FROM pg_constraint c
        JOIN jobrelay_outboxes() o ON o.outbox = c.conrelid
        WHERE c.conname = 'pending_jobs_options_check' AND NOT c.convalidated
    LOOP
        EXECUTE format('ALTER TABLE %s VALIDATE CONSTRAINT pending_jobs_options_check', t.tbl);
    END LOOP;
END
$migration$;

COMMIT;
