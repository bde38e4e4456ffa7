//! Migration 9 on outboxes in use, and the ordering trigger: two transactions writing one key
//! run one after the other, and the later one's row gets the higher id.

use super::*;

#[sqlx::test(migrations = false)]
async fn migration_9_adds_ordering_key_to_outboxes_in_use(pool: PgPool) {
    migrate_before(&pool, "20261129000009").await;
    sqlx::raw_sql(
        "SELECT jobrelay_create_outbox('billing_jobs');
         INSERT INTO pending_jobs (queue, job_type) VALUES ('q', 'Old');
         INSERT INTO billing_jobs (queue, job_type) VALUES ('q', 'Old');",
    )
    .execute(&pool)
    .await
    .unwrap();

    jobrelay::db::MIGRATOR
        .run(&pool)
        .await
        .expect("migration 9 applies");

    let columns: Vec<String> = sqlx::query_scalar(
        "SELECT attrelid::regclass::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
         WHERE attname = 'ordering_key' AND atttypid = 'text'::regtype AND NOT attnotnull
           AND c.relkind = 'r'
         ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        columns,
        [
            "billing_jobs",
            "billing_jobs_dead",
            "pending_jobs",
            "pending_jobs_dead"
        ]
    );
    let indexed = key_indexed(&pool).await;
    assert_eq!(indexed, columns, "each has the partial index");
    let checks: Vec<(String, bool)> = sqlx::query_as(
        "SELECT conrelid::regclass::text, convalidated FROM pg_constraint
         WHERE conname = 'pending_jobs_ordering_key_check' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        checks,
        [
            ("billing_jobs".to_owned(), true),
            ("pending_jobs".to_owned(), true)
        ]
    );
    for table in ["pending_jobs", "billing_jobs"] {
        let old: Option<String> = sqlx::query_scalar(&format!("SELECT ordering_key FROM {table}"))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(old, None, "an old row has no key");
        for bad in [String::new(), "x".repeat(257)] {
            let e = sqlx::query(&format!(
                "INSERT INTO {table} (queue, job_type, ordering_key) VALUES ('q', 'New', $1)"
            ))
            .bind(&bad)
            .execute(&pool)
            .await
            .unwrap_err();
            assert!(
                e.to_string().contains("pending_jobs_ordering_key_check"),
                "{table}: {e}"
            );
        }
        let ok: i64 = sqlx::query_scalar(&format!(
            "INSERT INTO {table} (queue, job_type, ordering_key) VALUES ('q', 'New', $1) RETURNING id"
        ))
        .bind("ü".repeat(256))
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(ok > 1);
    }
}

#[sqlx::test]
async fn writers_of_one_key_take_turns_and_ids_follow_their_commits(pool: PgPool) {
    let insert = "INSERT INTO pending_jobs (queue, job_type, ordering_key) VALUES ('q', 'T', $1) \
                  RETURNING id";
    let mut first = pool.begin().await.unwrap();
    let first_id: i64 = sqlx::query_scalar(insert)
        .bind("k")
        .fetch_one(&mut *first)
        .await
        .unwrap();
    // Another key does not wait.
    let other: i64 = sqlx::query_scalar(insert)
        .bind("other")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(other > first_id);
    // The same key waits for the first transaction's end ...
    let second = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let id: i64 = sqlx::query_scalar(insert)
                .bind("k")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            id
        })
    };
    wait_until(
        "the second writer waits on the key's lock",
        Duration::from_secs(10),
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            waiting == 1
        },
    )
    .await;
    // A row of another key written while it waits.
    let during: i64 = sqlx::query_scalar(insert)
        .bind("other")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(!second.is_finished(), "the second writer of k did not wait");
    first.commit().await.unwrap();
    // ... and its row's id is drawn once it has the lock: after the row written meanwhile,
    // though its insert began before.
    let second_id = second.await.unwrap();
    assert!(
        second_id > during && during > other && other > first_id,
        "ids {first_id}, {other}, {during}, then {second_id}: the waiting writer's id is drawn after its wait"
    );
    // The relay's hand-backs keep a row's id.
    let kept: i64 = sqlx::query_scalar(
        "WITH moved AS (DELETE FROM pending_jobs WHERE id = $1 RETURNING id)
         INSERT INTO pending_jobs (id, queue, job_type, ordering_key)
         SELECT id, 'q', 'T', 'k' FROM moved
         WHERE (SELECT set_config('jobrelay.ordering_lock', 'off', true)) IS NOT NULL
         RETURNING id",
    )
    .bind(first_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(kept, first_id);
}

/// The tables with the partial index `(ordering_key, id)`.
async fn key_indexed(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT indrelid::regclass::text FROM pg_index
         WHERE pg_get_indexdef(indexrelid) LIKE '%(ordering_key, id) WHERE (ordering_key IS NOT NULL)'
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The tables whose `ordering_key` compares bytewise (`COLLATE "C"`).
async fn bytewise_keys(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT attrelid::regclass::text FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
         WHERE attname = 'ordering_key' AND attcollation = 'pg_catalog.\"C\"'::regcollation
           AND c.relkind = 'r'
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn migration_10_makes_keys_bytewise_on_outboxes_in_use(pool: PgPool) {
    migrate_before(&pool, "20261129000010").await;
    let insert = |table: &str| {
        format!(
            "INSERT INTO {table} (queue, job_type, ordering_key) VALUES ('q', 'T', $1) RETURNING id"
        )
    };
    sqlx::query("SELECT jobrelay_create_outbox('billing_jobs')")
        .execute(&pool)
        .await
        .unwrap();
    let mut before = Vec::new();
    for table in ["pending_jobs", "billing_jobs"] {
        let id: i64 = sqlx::query_scalar(&insert(table))
            .bind("Straße-1")
            .fetch_one(&pool)
            .await
            .unwrap();
        before.push(id);
    }
    assert_eq!(bytewise_keys(&pool).await, Vec::<String>::new());

    jobrelay::db::MIGRATOR
        .run(&pool)
        .await
        .expect("migration 10 applies");

    let all = [
        "billing_jobs",
        "billing_jobs_dead",
        "pending_jobs",
        "pending_jobs_dead",
    ];
    assert_eq!(bytewise_keys(&pool).await, all);
    let indexed = key_indexed(&pool).await;
    assert_eq!(indexed, all, "each keeps its partial index");
    let triggered: Vec<String> = sqlx::query_scalar(
        "SELECT tgrelid::regclass::text FROM pg_trigger
         WHERE tgfoid = 'jobrelay_order_key'::regproc ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        triggered,
        ["billing_jobs", "pending_jobs"],
        "each outbox keeps its trigger"
    );
    for (table, old) in ["pending_jobs", "billing_jobs"].into_iter().zip(before) {
        let key: String = sqlx::query_scalar(&format!("SELECT ordering_key FROM {table}"))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(
            key, "Straße-1",
            "{table}: the row written before keeps its key"
        );
        let new: i64 = sqlx::query_scalar(&insert(table))
            .bind("Straße-1")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert!(new > old, "{table}: {new} after {old}");
    }
    // An outbox made afterwards, and its dead letters, compare bytewise too.
    sqlx::query("SELECT jobrelay_create_outbox('late_jobs')")
        .execute(&pool)
        .await
        .unwrap();
    let late = bytewise_keys(&pool).await;
    assert!(
        late.iter().any(|t| t == "late_jobs") && late.iter().any(|t| t == "late_jobs_dead"),
        "{late:?}"
    );
}
