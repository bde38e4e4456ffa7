//! Every statement the relay and the producer run on the outbox reads rows in proportion to
//! its batch, not to the table, whatever the statistics say and whether its plan was made now
//! or cached while the table was empty (docs/guarantees.md#plans-that-do-not-depend-on-statistics).
//!
//! Each statement is prepared and run once on the empty table (never analysed, or analysed
//! while empty), under `plan_cache_mode = force_generic_plan`: the generic plan is made and
//! cached then, as a relay or an application that prepares its statements would. Then 100,000
//! rows land in one transaction, and the statement runs again under `EXPLAIN (ANALYZE,
//! FORMAT JSON)`, once with that cached generic plan and once with a custom plan. Every scan
//! of the outbox must be an index or TID scan reading at most a few rows per row of the batch,
//! and nothing may be JIT-compiled (the session sets `jit_above_cost = 0`, so only the
//! statement's own transaction settings keep JIT off).

use jobrelay::relay::queries::{self, Queries};
use jobrelay::{LayoutKind, TableName};
use serde_json::Value;
use sqlx::{Connection, PgConnection, PgPool};

const ROWS: i64 = 100_000;
const BATCH: i64 = 1_000;

/// One statement, how it is run, and arguments for `EXECUTE`.
struct Case {
    name: &'static str,
    sql: String,
    args: String,
    /// Opens its transaction with the relay's planner settings ([`queries::BEGIN`]).
    planner_settings: bool,
    /// Reads every row by definition (`status` counts them): only "no JIT" applies.
    whole_table: bool,
    /// Run as a named statement whose plan may be cached (the relay's statements; whether they
    /// are is the pool's choice). The producer's fast path runs unnamed statements, planned at
    /// each call: those are prepared here after the rows landed.
    cached: bool,
}

fn hand_back_args() -> String {
    // One row, id -1 (the table's ids are positive), in the columns' order.
    "ARRAY[-1]::int8[], ARRAY[gen_random_uuid()], ARRAY['q'], ARRAY['t'], ARRAY['\\x00'::bytea], \
     ARRAY[NULL::uuid], ARRAY[NULL::uuid], ARRAY[false], ARRAY[NULL::timestamptz], ARRAY['{}'], \
     ARRAY['{}'], ARRAY[NULL::text], ARRAY[now()], ARRAY[1], ARRAY[0.0::float8], ARRAY['refused']"
        .to_owned()
}

fn cases() -> Vec<Case> {
    let table = TableName::default();
    let plain = Queries::for_needs(&table, LayoutKind::Jobrelay.layout().claim_needs());
    let conveyor = Queries::for_needs(&table, LayoutKind::Conveyor.layout().claim_needs());
    let celery = Queries::for_needs(&table, LayoutKind::Celery.layout().claim_needs());
    let [_insert, fast_claim, fast_delete] = jobrelay::producer::statements(&table);
    let [status_pending, status_dead] = jobrelay::admin::status::statements(&table);
    let claim = |name, sql: &str, args: &str| Case {
        name,
        sql: sql.to_owned(),
        args: args.to_owned(),
        planner_settings: true,
        whole_table: false,
        cached: true,
    };
    let unnamed = |name, sql: &str| Case {
        planner_settings: false,
        cached: false,
        ..claim(name, sql, IDS)
    };
    // $1 rows, $2 older than (s), $3 bytes, $4 max job bytes, $5 claim slots, $6 from id.
    const IDS: &str = "ARRAY[7, 50000, 99999]::int8[], \
               ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid()]";
    vec![
        claim(
            "claim, catch-up from the lowest id",
            &plain.claim,
            &format!("{BATCH}, NULL, 8388608, 8388608, 2, {}", i64::MIN),
        ),
        claim(
            "claim from a mark",
            &plain.claim,
            &format!("{BATCH}, NULL, 8388608, 8388608, 2, 50000"),
        ),
        claim(
            "claim of key heads, from the lowest id",
            &plain.claim_heads,
            &format!("{BATCH}, NULL, 8388608, 8388608, 2, {}", i64::MIN),
        ),
        claim(
            "claim of key heads, from a mark",
            &plain.claim_heads,
            &format!("{BATCH}, NULL, 8388608, 8388608, 2, 50000"),
        ),
        claim(
            "claim of rows without a key, from the lowest id",
            &plain.claim_unkeyed,
            &format!("{BATCH}, NULL, 8388608, 8388608, 2, {}", i64::MIN),
        ),
        claim(
            "claim of rows without a key, from a mark",
            &plain.claim_unkeyed,
            &format!("{BATCH}, NULL, 8388608, 8388608, 2, 50000"),
        ),
        claim(
            "claim, conveyor layout with flows pending",
            &conveyor.claim,
            &format!("{BATCH}, NULL, 8388608, 8388608, 2, {}", i64::MIN),
        ),
        claim(
            "sweep claim (--older-than)",
            &plain.claim,
            &format!("{BATCH}, 0, 8388608, 8388608, 0, {}", i64::MIN),
        ),
        claim(
            "claim capped by bytes",
            &plain.claim,
            &format!("{BATCH}, NULL, 1000, 8388608, 0, {}", i64::MIN),
        ),
        claim("hand-back", &plain.retry, &hand_back_args()),
        claim(
            "oldest claimable row, catch-up from the lowest id (the probe)",
            &plain.oldest_claimable,
            &i64::MIN.to_string(),
        ),
        claim(
            "oldest claimable row from a mark (the probe)",
            &plain.oldest_claimable,
            "50000",
        ),
        claim(
            "oldest claimable row, celery layout (the probe)",
            &celery.oldest_claimable,
            &i64::MIN.to_string(),
        ),
        claim("dead-letter", &plain.dead_letter, &hand_back_args()),
        unnamed("fast path claim", &fast_claim),
        unnamed("fast path delete", &fast_delete),
        Case {
            planner_settings: false,
            whole_table: true,
            ..claim("status, pending rows", &status_pending, "")
        },
        Case {
            planner_settings: false,
            whole_table: true,
            ..claim("status, dead rows", &status_dead, "")
        },
    ]
}

fn execute(i: usize, args: &str) -> String {
    if args.is_empty() {
        format!("EXECUTE s{i}")
    } else {
        format!("EXECUTE s{i}({args})")
    }
}

async fn begin(conn: &mut PgConnection, case: &Case) {
    let sql = if case.name.starts_with("status") {
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL jit = off"
    } else if case.planner_settings {
        queries::BEGIN
    } else {
        "BEGIN"
    };
    sqlx::raw_sql(sql).execute(&mut *conn).await.unwrap();
}

/// Prepares case `i` as `s<i>` and runs it once (rolled back): under `force_generic_plan`, its
/// plan is made now and cached.
async fn prepare(conn: &mut PgConnection, i: usize, case: &Case) {
    sqlx::raw_sql(&format!("PREPARE s{i} AS {}", case.sql))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    begin(conn, case).await;
    sqlx::raw_sql(&execute(i, &case.args))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.unwrap();
}

/// Every problem with one plan: scans of the outbox not bounded by the batch, JIT.
fn problems(case: &Case, plan: &Value) -> Vec<String> {
    let mut found = Vec::new();
    if plan.get("JIT").is_some() {
        found.push("JIT compiled".to_owned());
    }
    let mut stack = vec![&plan["Plan"]];
    while let Some(node) = stack.pop() {
        if let Some(children) = node.get("Plans").and_then(Value::as_array) {
            stack.extend(children);
        }
        if node.get("Relation Name").and_then(Value::as_str) != Some("pending_jobs")
            || case.whole_table
        {
            continue;
        }
        let kind = node["Node Type"].as_str().unwrap_or("?");
        let count = |k: &str| node.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        let read = (count("Actual Rows") + count("Rows Removed by Filter")) * count("Actual Loops");
        // A bitmap of a few ids is bounded as well; one of a whole range reads too many rows.
        let bounded = matches!(
            kind,
            "Index Scan" | "Index Only Scan" | "Tid Scan" | "Bitmap Heap Scan" | "ModifyTable"
        );
        if !bounded {
            found.push(format!("{kind} on the outbox"));
        }
        if read > (3 * BATCH) as f64 {
            found.push(format!("{kind} read {read} rows"));
        }
    }
    found
}

async fn check(pool: PgPool, analyse_empty: bool) {
    let mut conn = pool.acquire().await.unwrap().detach();
    if analyse_empty {
        sqlx::raw_sql("ANALYZE pending_jobs; ANALYZE pending_jobs_dead")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    // A plan that reads the table once per row (the conveyor's flow test without its
    // indexes) would take hours: fail instead.
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan; SET statement_timeout = '30s'")
        .execute(&mut conn)
        .await
        .unwrap();
    let cases = cases();
    // Plans made and cached while the table is empty.
    for (i, case) in cases.iter().enumerate().filter(|(_, c)| c.cached) {
        prepare(&mut conn, i, case).await;
    }
    // An outage ends: 100,000 rows in one transaction, one in a hundred a flow's child, one
    // in three of one of 997 ordering keys.
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload, parent_uuid, ordering_key)
         SELECT 'q', 't', '\\x0102'::bytea, CASE WHEN g % 100 = 0 THEN gen_random_uuid() END,
                CASE WHEN g % 3 = 0 THEN 'k' || (g % 997) END
         FROM generate_series(1, $1) g",
    )
    .bind(ROWS)
    .execute(&mut conn)
    .await
    .unwrap();
    for (i, case) in cases.iter().enumerate().filter(|(_, c)| !c.cached) {
        prepare(&mut conn, i, case).await;
    }

    let mut failures = Vec::new();
    for mode in ["force_generic_plan", "force_custom_plan"] {
        sqlx::raw_sql(&format!("SET plan_cache_mode = {mode}"))
            .execute(&mut conn)
            .await
            .unwrap();
        for (i, case) in cases.iter().enumerate() {
            // A statement whose transaction turns JIT off must not be compiled even where
            // every plan would be; the fast path's unnamed lookups must stay far below the
            // default threshold (not set before the rows landed: every row's CHECK would be).
            let jit = if case.planner_settings || case.whole_table {
                "SET jit_above_cost = 0"
            } else {
                "RESET jit_above_cost"
            };
            sqlx::raw_sql(jit).execute(&mut conn).await.unwrap();
            begin(&mut conn, case).await;
            let (plan,): (Value,) = sqlx::query_as(&format!(
                "EXPLAIN (ANALYZE, FORMAT JSON) {}",
                execute(i, &case.args)
            ))
            .fetch_one(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();
            let plan = &plan[0];
            for p in problems(case, plan) {
                failures.push(format!(
                    "{} ({mode}): {p}\n{}",
                    case.name,
                    serde_json::to_string_pretty(&plan["Plan"]).unwrap()
                ));
            }
        }
    }
    conn.close().await.unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[sqlx::test]
async fn plans_are_bounded_by_the_batch_on_a_table_never_analysed(pool: PgPool) {
    check(pool, false).await;
}

#[sqlx::test]
async fn plans_are_bounded_by_the_batch_on_a_table_analysed_while_empty(pool: PgPool) {
    check(pool, true).await;
}
