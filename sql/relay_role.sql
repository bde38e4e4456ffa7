-- jobrelay: least-privilege roles for the outbox in schema public.
--
--   jobrelay_migrator  LOGIN    owns the schema objects. Runs `jobrelay migrate`, and the
--                               operator commands `jobrelay dead-letter requeue|purge`.
--   jobrelay_relay     LOGIN    the relay daemon and `jobrelay --sweep` (also `check`, `status`,
--                               `dead-letter list`). Owns nothing; cannot alter, drop or truncate
--                               anything, cannot rewrite a pending row, cannot touch the
--                               migration history.
--   jobrelay_producer  NOLOGIN  grant it to the application's own role
--                               (GRANT jobrelay_producer TO app;): inserts pending rows and, on
--                               the fast path, deletes the rows whose jobs it pushed itself.
--
-- Run this file as a superuser (or as a role with CREATEROLE that owns the database), connected
-- to the application's database, before and after the first migration:
--
--   psql -d app -v ON_ERROR_STOP=1 -f sql/relay_role.sql     -- 1. roles, schema privileges
--   DATABASE_URL=postgres://jobrelay_migrator@.../app jobrelay migrate
--   psql -d app -v ON_ERROR_STOP=1 -f sql/relay_role.sql     -- 2. table privileges
--
-- It is idempotent; run it again after migrations that add tables. Passwords are not set here,
-- so that they never sit in a file: set them in psql with
--   \password jobrelay_migrator
--   \password jobrelay_relay
-- Roles are cluster-wide; the privileges are per database.
--
-- Why each privilege (see docs/guarantees.md#the-relay-step and 5.4):
--   pending_jobs       SELECT, DELETE: the claim is `DELETE ... RETURNING` over
--                      `SELECT ... FOR UPDATE SKIP LOCKED`; FOR UPDATE also needs UPDATE on at
--                      least one column, hence UPDATE (available_at) only.
--                      INSERT: a refused row goes back with attempts + 1 and a later
--                      available_at (its id is kept, so no sequence privilege is needed).
--   pending_jobs_dead  INSERT: failed rows move here. SELECT: the dead-letter gauge, `status`.
--   _sqlx_migrations   SELECT: `jobrelay check` reports the schema version.
--   The insert trigger's function and the headers CHECK function run with EXECUTE granted to
--   PUBLIC (PostgreSQL's default for functions).

-- 1. Roles.
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobrelay_migrator') THEN
        CREATE ROLE jobrelay_migrator LOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobrelay_relay') THEN
        CREATE ROLE jobrelay_relay LOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobrelay_producer') THEN
        CREATE ROLE jobrelay_producer NOLOGIN;
    END IF;
END
$roles$;

-- 2. The database and the schema. Since PostgreSQL 15 only the database owner may create in
--    schema public: the migration role gets CREATE there, the others only USAGE.
DO $db$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO jobrelay_migrator, jobrelay_relay, jobrelay_producer',
                   current_database());
END
$db$;
GRANT USAGE, CREATE ON SCHEMA public TO jobrelay_migrator;
GRANT USAGE ON SCHEMA public TO jobrelay_relay, jobrelay_producer;

-- 3. The tables, once `jobrelay migrate` has created them.
DO $tables$
BEGIN
    IF to_regclass('public.pending_jobs') IS NULL THEN
        RAISE NOTICE 'jobrelay: public.pending_jobs does not exist yet: run `jobrelay migrate` as jobrelay_migrator, then run this file again';
        RETURN;
    END IF;

    GRANT SELECT, INSERT, DELETE ON public.pending_jobs TO jobrelay_relay;
    GRANT UPDATE (available_at) ON public.pending_jobs TO jobrelay_relay;
    GRANT SELECT, INSERT ON public.pending_jobs_dead TO jobrelay_relay;
    GRANT SELECT ON public._sqlx_migrations TO jobrelay_relay;
    -- The wake-up lease table of migrations 3-4 (dropped by migration 5, whose advisory lock
    -- needs no grant): granted only on a schema that still has it.
    IF to_regclass('public.jobrelay_wakeup') IS NOT NULL THEN
        GRANT SELECT, INSERT, UPDATE ON public.jobrelay_wakeup TO jobrelay_relay;
    END IF;

    -- The producer API inserts with RETURNING (SELECT) and, on the fast path, locks its own
    -- rows FOR UPDATE and deletes them.
    GRANT SELECT, INSERT, DELETE ON public.pending_jobs TO jobrelay_producer;
    GRANT UPDATE (available_at) ON public.pending_jobs TO jobrelay_producer;
END
$tables$;
