-- jobrelay schema, version 4: a cheaper insert trigger.
--
-- Version 3's trigger function was SECURITY DEFINER with `SET search_path`, which saves and
-- restores a setting on every INSERT statement: measured here with 4 single-row producers it
-- cost a visible share of their insert rate. This version is a plain function that names the
-- lease table with the schema it lives in (fixed now, so no producer's search_path can make an
-- INSERT fail or read another table), and producers may read the lease table directly: it only
-- holds channel names and times.
GRANT SELECT ON jobrelay_wakeup TO PUBLIC;

DO $migration$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION jobrelay_notify() RETURNS trigger
        LANGUAGE plpgsql SECURITY INVOKER AS $body$
        BEGIN
            -- clock_timestamp(), not now(): a long transaction must not judge the lease by
            -- its start.
            IF NOT EXISTS (SELECT 1 FROM %I.jobrelay_wakeup
                           WHERE channel = TG_ARGV[0] AND awake_until > clock_timestamp()) THEN
                PERFORM pg_notify(TG_ARGV[0], '');
            END IF;
            RETURN NULL;
        END
        $body$
    $f$, current_schema());
    -- CREATE OR REPLACE keeps the function's existing attributes unless told otherwise.
    EXECUTE 'ALTER FUNCTION jobrelay_notify() RESET ALL';
END
$migration$;
