-- jobrelay schema, version 10: `ordering_key` compares bytewise (`COLLATE "C"`) on every
-- outbox and dead-letter table (docs/schema.md).
--
-- A key is only ever compared for equality, and equality is the same in every deterministic
-- collation; but the claim's probes descend the key's index (src/relay/queries.rs), and each
-- step of a descent compares keys in the column's collation. Measured (100,000 probes of an
-- index of 200,000 rows over 10,000 keys, three runs each): 340 ms under ICU's `en` collation,
-- 210 ms under "C"; 227 ms under this machine's default, glibc's C.UTF-8. A database created
-- with `en_US.UTF-8` (a common default) paid about 1.3 us more per keyed row claimed.
--
-- One transaction, holding each table's ACCESS EXCLUSIVE lock (ALTER COLUMN TYPE's) to its end:
-- the column changes in the catalog only (the same type), its partial index is rebuilt (it
-- holds the keyed rows only), the check is checked again. The ordering trigger names the
-- column in its WHEN, which Postgres refuses to keep across the change: it is dropped and made
-- again in the same transaction, so no producer inserts a keyed row without it. A table whose
-- column is already "C" is left alone.

-- New columns (outboxes that `jobrelay migrate --table T` adopts) are made "C" too.
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
        EXECUTE format('ALTER TABLE %s ADD COLUMN ordering_key text COLLATE "C"', tbl);
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

-- Makes one table's `ordering_key` "C", unless it is; `checked`: an outbox, whose ordering
-- trigger is made again after the change.
CREATE OR REPLACE FUNCTION jobrelay_ordering_key_bytewise(tbl regclass, checked boolean)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    trig text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = tbl AND attname = 'ordering_key' AND NOT attisdropped
                 AND attcollation = 'pg_catalog."C"'::regcollation) THEN
        RETURN;
    END IF;
    FOR trig IN SELECT tgname FROM pg_trigger
                WHERE tgrelid = tbl AND tgfoid = 'jobrelay_order_key'::regproc LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', trig, tbl);
    END LOOP;
    EXECUTE format('ALTER TABLE %s ALTER COLUMN ordering_key TYPE text COLLATE "C"', tbl);
    PERFORM jobrelay_add_ordering_key(tbl, checked);
END
$$;

DO $migration$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT * FROM jobrelay_outboxes() LOOP
        PERFORM jobrelay_ordering_key_bytewise(t.outbox, true);
        IF t.dead IS NOT NULL THEN
            PERFORM jobrelay_ordering_key_bytewise(t.dead, false);
        END IF;
    END LOOP;
END
$migration$;
