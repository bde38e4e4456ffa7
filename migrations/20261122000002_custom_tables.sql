-- jobrelay schema, version 2: a helper that creates another outbox of the same shape, for
-- `--table T`: T, T_dead and the insert trigger notifying channel T.
--   SELECT jobrelay_create_outbox('billing_jobs');            -- public.billing_jobs
--   SELECT jobrelay_create_outbox('billing.jobs');            -- billing.jobs (schema must exist)
-- `jobrelay migrate --table T` calls it for you. It does nothing for tables that already exist.
CREATE FUNCTION jobrelay_create_outbox(qualified text) RETURNS void
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
        EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %I.%I FOR EACH STATEMENT '
                       'EXECUTE FUNCTION jobrelay_notify(%L)', tbl || '_notify', sch, tbl, qualified);
    END IF;
END
$$;
