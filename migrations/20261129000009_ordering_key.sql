-- no-transaction
-- jobrelay schema, version 9: per-key order, `ordering_key text NULL`, on every outbox and its
-- dead-letter table (docs/guarantees.md#per-key-order).
--
-- A row that names an ordering key is claimed only at the head of its key: no earlier row of
-- the key is still pending outside the claim, and none lies in the dead letters
-- (src/relay/queries.rs). NULL, what every existing row holds, keeps the behaviour and the cost
-- of before: no index entry, no trigger work.
--
-- - `ordering_key`: 1..256 characters (`pending_jobs_ordering_key_check`, on the outbox only).
-- - A partial index `(ordering_key, id)` on the outbox and on the dead letters: the claim's
--   test is one probe per key of the batch.
-- - A BEFORE INSERT trigger, for keyed rows only, that takes a transaction-level advisory lock
--   on the table and key, then draws the row's id: two transactions writing the same key are
--   serialised, and the ids of a key are in the order those transactions commit. (An id drawn
--   before the lock could commit after a higher one of the same key that was already relayed.)
--   A transaction holds one such lock per key it writes (Postgres's lock table bounds them:
--   max_locks_per_transaction). With `SET LOCAL jobrelay.ordering_lock = off` the trigger does
--   nothing and a row keeps the id it was given or drawn: the relay's own hand-backs (a row
--   keeps its place in its key), and a bulk load that is the only writer of its keys
--   (docs/guarantees.md#per-key-order).
--
-- Safe on a table in use, as version 8: the column has no default (catalog only), the CHECK is
-- added NOT VALID in a short first transaction and validated in a second one; each partial
-- index is built under a brief SHARE lock (every existing row is NULL: it reads the table once
-- and indexes nothing). Run again after a failure in between, each step finds its work done.

-- The trigger: lock the key, then draw the id from the table's own sequence (TG_ARGV[0]).
-- SECURITY DEFINER: a producer's role may insert (the identity column draws its default without
-- a grant) yet hold no privilege on the sequence; the function draws as its owner, who does.
CREATE OR REPLACE FUNCTION jobrelay_order_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF current_setting('jobrelay.ordering_lock', true) IS DISTINCT FROM 'off' THEN
        PERFORM pg_advisory_xact_lock(
            hashtextextended(TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME || ':' || NEW.ordering_key, 0));
        NEW.id := nextval(TG_ARGV[0]::regclass);
    END IF;
    RETURN NEW;
END
$$;

-- Adds `ordering_key` to one table with its partial index, unless it has them; with `checked`
-- (an outbox, not a dead-letter table) also the CHECK, NOT VALID, and the trigger.
CREATE OR REPLACE FUNCTION jobrelay_add_ordering_key(tbl regclass, checked boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    sch  text;
    rel  text;
BEGIN
    SELECT n.nspname, c.relname INTO sch, rel
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = tbl;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = tbl AND attname = 'ordering_key' AND NOT attisdropped) THEN
        EXECUTE format('ALTER TABLE %s ADD COLUMN ordering_key text', tbl);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a
                       ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                   WHERE i.indrelid = tbl AND a.attname = 'ordering_key') THEN
        EXECUTE format('CREATE INDEX %I ON %I.%I (ordering_key, id) WHERE ordering_key IS NOT NULL',
                       left(rel, 45) || '_ordering_key_idx', sch, rel);
    END IF;
    IF checked THEN
        IF NOT EXISTS (SELECT 1 FROM pg_constraint
                       WHERE conrelid = tbl AND conname = 'pending_jobs_ordering_key_check') THEN
            EXECUTE format('ALTER TABLE %s ADD CONSTRAINT pending_jobs_ordering_key_check '
                           'CHECK (char_length(ordering_key) BETWEEN 1 AND 256) NOT VALID', tbl);
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_trigger
                       WHERE tgrelid = tbl AND tgfoid = 'jobrelay_order_key'::regproc) THEN
            EXECUTE format('CREATE TRIGGER %I BEFORE INSERT ON %s FOR EACH ROW '
                           'WHEN (NEW.ordering_key IS NOT NULL) '
                           'EXECUTE FUNCTION jobrelay_order_key(%L)',
                           left(rel, 45) || '_ordering_key', tbl,
                           pg_get_serial_sequence(format('%I.%I', sch, rel), 'id'));
        END IF;
    END IF;
END
$$;

-- Step 1, one short transaction: the columns, indexes, NOT VALID checks and triggers; new
-- outboxes get them too.
BEGIN;

DO $migration$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT * FROM jobrelay_outboxes() LOOP
        PERFORM jobrelay_add_ordering_key(t.outbox, true);
        IF t.dead IS NOT NULL THEN
            PERFORM jobrelay_add_ordering_key(t.dead, false);
        END IF;
    END LOOP;
END
$migration$;

-- New outboxes copy the column, index and check from pending_jobs (LIKE ... INCLUDING ALL), not
-- its trigger: added here, as for an existing table `jobrelay migrate --table T` adopts.
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
    PERFORM jobrelay_add_ordering_key(format('%I.%I', sch, tbl)::regclass, true);
    EXECUTE format('ALTER TABLE %I.%I SET (autovacuum_vacuum_scale_factor = 0, '
                   'autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_insert_scale_factor = 0, '
                   'autovacuum_vacuum_insert_threshold = 10000, autovacuum_analyze_scale_factor = 0, '
                   'autovacuum_analyze_threshold = 10000, autovacuum_vacuum_cost_delay = 0)', sch, tbl);
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I (LIKE public.pending_jobs_dead INCLUDING ALL)',
                   sch, tbl || '_dead');
    PERFORM jobrelay_add_options(format('%I.%I', sch, tbl || '_dead')::regclass, false);
    PERFORM jobrelay_add_ordering_key(format('%I.%I', sch, tbl || '_dead')::regclass, false);
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                   JOIN pg_namespace n ON n.oid = c.relnamespace
                   WHERE n.nspname = sch AND c.relname = tbl AND t.tgname = tbl || '_notify') THEN
        PERFORM jobrelay_notify_trigger(format('%I.%I', sch, tbl)::regclass, tbl || '_notify',
                                        qualified);
    END IF;
END
$$;

COMMIT;

-- Step 2, another transaction: validate the checks (every existing row is NULL: this only reads
-- each table once, without stopping its producers or relays).
BEGIN;

DO $migration$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT c.conrelid::regclass AS tbl FROM pg_constraint c
        JOIN jobrelay_outboxes() o ON o.outbox = c.conrelid
        WHERE c.conname = 'pending_jobs_ordering_key_check' AND NOT c.convalidated
    LOOP
        EXECUTE format('ALTER TABLE %s VALIDATE CONSTRAINT pending_jobs_ordering_key_check', t.tbl);
    END LOOP;
END
$migration$;

COMMIT;
