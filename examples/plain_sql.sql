-- jobrelay: producing jobs from any language, with nothing but SQL.
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f examples/plain_sql.sql
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -v keep=1 -f examples/plain_sql.sql
--
-- Needs jobrelay's schema (`jobrelay migrate`). The application's own table here is a temporary
-- `things` table, gone when the session ends. By default the script removes the pending rows it
-- committed before it exits (a relay that is running may still have delivered some of them, to
-- queue `default`: they are harmless demo jobs). With `-v keep=1` it leaves them for a relay to
-- deliver: `jobrelay --sweep --older-than 0s`, or the daemon.
--
-- Every statement below is plain SQL: from another language, send the same text with bind
-- parameters where psql uses :'variables'. With `--table T`, write to T instead of pending_jobs.

\set ON_ERROR_STOP 1
\if :{?keep}
\else
  \set keep 0
\endif

-- Tag this run's rows with a header, so that the clean-up touches nothing else.
SELECT gen_random_uuid() AS run \gset

CREATE TEMP TABLE things (
    id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL
);

-- 1. The pattern: the application's write and its job in ONE transaction. The job is invisible
--    to the relay until COMMIT; if the transaction rolls back, there is no row and no job.
BEGIN;
INSERT INTO things (name) VALUES ('x') RETURNING id AS thing_id \gset
INSERT INTO pending_jobs (queue, job_type, payload, headers)
VALUES ('default', 'ProcessThing',
        convert_to(json_build_object('thing_id', :thing_id)::text, 'UTF8'),
        jsonb_build_object('example_run', :'run'))
RETURNING id, uuid;
COMMIT;

-- 2. Many jobs with ONE statement, using every optional column:
--    uuid       chosen by the producer before the transaction, so that retrying a transaction
--               whose COMMIT acknowledgement was lost cannot enqueue twice (see the WHERE
--               below; Redis also keeps one job per uuid); omitted, it is gen_random_uuid()
--    run_at     run no earlier than this (a delay: now() + interval)
--    parent_uuid, predecessor_uuid, dead_parent: job dependencies (docs/layouts/algorithm.md#the-enqueue-algorithm)
--    headers    string-to-string metadata, e.g. the W3C traceparent of the caller's span
SELECT gen_random_uuid() AS mail, gen_random_uuid() AS reminder, gen_random_uuid() AS archive \gset
BEGIN;
INSERT INTO pending_jobs (uuid, queue, job_type, payload, run_at, predecessor_uuid, headers)
SELECT j.uuid, 'default', j.job_type, convert_to(j.args::text, 'UTF8'), j.run_at,
       j.predecessor_uuid,
       jsonb_build_object('example_run', :'run',
                          'traceparent', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')
FROM (VALUES
        (:'mail'::uuid,     'SendWelcomeMail', jsonb_build_object('thing_id', :thing_id),
         NULL::timestamptz, NULL::uuid),
        (:'reminder'::uuid, 'SendReminder',    jsonb_build_object('thing_id', :thing_id),
         now() + interval '1 day', NULL::uuid),
        (:'archive'::uuid,  'Archive',         jsonb_build_object('thing_id', :thing_id),
         NULL::timestamptz, :'mail'::uuid)     -- runs when SendWelcomeMail completes
     ) AS j(uuid, job_type, args, run_at, predecessor_uuid)
WHERE NOT EXISTS (SELECT 1 FROM pending_jobs p WHERE p.uuid = j.uuid)
RETURNING id, uuid, job_type, run_at;
COMMIT;

-- 3. A rolled-back transaction leaves nothing behind.
BEGIN;
INSERT INTO things (name) VALUES ('never') RETURNING id AS rolled_back_id \gset
INSERT INTO pending_jobs (queue, job_type, payload, headers)
VALUES ('default', 'ProcessThing',
        convert_to(json_build_object('thing_id', :rolled_back_id)::text, 'UTF8'),
        jsonb_build_object('example_run', :'run', 'rolled_back', 'yes'));
ROLLBACK;
SELECT count(*) > 0 AS rolled_back_visible FROM pending_jobs
WHERE headers->>'example_run' = :'run' AND headers ? 'rolled_back' \gset
\if :rolled_back_visible
  \echo 'BUG: a rolled-back job row is visible'
  SELECT 1/0;
\endif

-- 4. Bad input is refused inside the producer's transaction by the table's CHECK constraints,
--    with Postgres's error: the relay never sees it.
DO $$
BEGIN
    INSERT INTO pending_jobs (queue, job_type) VALUES ('no spaces allowed', 'ProcessThing');
    RAISE EXCEPTION 'the invalid queue name was accepted';
EXCEPTION WHEN check_violation THEN
    RAISE NOTICE 'refused as expected: %', SQLERRM;
END
$$;

SELECT count(*) AS committed_rows FROM pending_jobs WHERE headers->>'example_run' = :'run' \gset
\echo 'committed job rows of this run still pending:' :committed_rows

-- Clean up, unless asked to keep the jobs for a relay.
\if :keep
  \echo 'kept for the relay: run `jobrelay --sweep --older-than 0s` (or the daemon) to deliver them'
\else
  DELETE FROM pending_jobs WHERE headers->>'example_run' = :'run';
  \echo 'cleaned up: this run''s pending rows were deleted'
\endif
