-- jobrelay schema, version 7: the dependents of a job can be found without scanning the table.
--
-- In the conveyor layout (`--layout conveyor`) a row is claimed only once no other pending row
-- names it as its parent or predecessor: a flow's children and heirs reach Redis before the job
-- they wait for, never after it may have finished (docs/layouts.md). That test runs for every
-- row a claim looks at, so it needs these two indexes. They are partial: rows without a parent
-- or predecessor (most rows) do not enter them, and cost nothing more at insert.
--
-- Each index is built with a brief SHARE lock on its table (inserts wait while it is built, which
-- takes as long as reading the table once). New outboxes copy them from pending_jobs (LIKE ...
-- INCLUDING ALL).

CREATE FUNCTION jobrelay_add_flow_indexes(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    sch  text;
    rel  text;
BEGIN
    SELECT n.nspname, c.relname INTO sch, rel
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = tbl;
    IF NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a
                       ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                   WHERE i.indrelid = tbl AND i.indnatts = 1 AND a.attname = 'parent_uuid') THEN
        EXECUTE format('CREATE INDEX %I ON %I.%I (parent_uuid) WHERE parent_uuid IS NOT NULL',
                       left(rel, 45) || '_parent_uuid_idx', sch, rel);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a
                       ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                   WHERE i.indrelid = tbl AND i.indnatts = 1 AND a.attname = 'predecessor_uuid') THEN
        EXECUTE format('CREATE INDEX %I ON %I.%I (predecessor_uuid) WHERE predecessor_uuid IS NOT NULL',
                       left(rel, 40) || '_predecessor_uuid_idx', sch, rel);
    END IF;
END
$$;

-- pending_jobs, and every other outbox of the outbox's shape, found as version 6 found them.
DO $migration$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT c.oid::regclass AS tbl,
               (SELECT count(*) FROM pg_attribute a
                WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                  AND ((a.attname = 'parent_uuid' AND a.atttypid = 'uuid'::regtype)
                    OR (a.attname = 'predecessor_uuid' AND a.atttypid = 'uuid'::regtype))) = 2 AS fits
        FROM pg_class c
        WHERE c.relkind = 'r'
          AND (c.oid = 'pending_jobs'::regclass
               OR EXISTS (SELECT 1 FROM pg_trigger tg
                          WHERE tg.tgrelid = c.oid AND NOT tg.tgisinternal
                            AND tg.tgfoid = 'jobrelay_notify'::regproc))
    LOOP
        IF t.fits THEN
            PERFORM jobrelay_add_flow_indexes(t.tbl);
        END IF;
    END LOOP;
END
$migration$;

-- An existing table of the right shape that `jobrelay migrate --table T` adopts gets them too.
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
