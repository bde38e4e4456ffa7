//! Jobs written in the caller's transaction: rolled back, no row and no job; committed, the relay
//! delivers them; many jobs in one INSERT statement (counted on the wire); the table's checks.

use super::*;

/// A rolled-back transaction leaves no row and no job, and the fast path pushes
/// nothing for it.
#[sqlx::test]
async fn rolled_back_transaction_leaves_no_row_and_no_job(pool: PgPool) {
    let ns = Namespace::new();
    let producer = producer(&ns);
    let mut jobs = producer.pending();
    let mut tx = pool.begin().await.unwrap();
    jobs.add_all((0..3).map(|i| JobBuilder::new("default", "Doomed").json(&i)))
        .unwrap();
    let rows = jobs.create_pending(&mut tx).await.unwrap();
    assert_eq!(rows.len(), 3);
    // Inside the transaction the rows exist; outside it they are invisible.
    let inside: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_jobs")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(inside, 3);
    assert_eq!(pending_count(&pool).await, 0, "invisible until commit");
    tx.rollback().await.unwrap();
    assert_eq!(pending_count(&pool).await, 0);

    // Misuse: the fast path after a rollback finds no row to claim and pushes nothing.
    let mut con = ns.con().await;
    let report = jobs.push_and_delete(&mut con, &pool).await.unwrap();
    assert!(report.pushed.is_empty());
    assert_eq!(report.skipped.len(), 3);

    let (code, out) = sweep(&pool, &ns, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        ns.keys().await.is_empty(),
        "no job in redis: {:?}",
        ns.keys().await
    );
}

/// Committed rows reach Redis through the relay (`--sweep`), field for field.
#[sqlx::test]
async fn committed_jobs_reach_redis_through_the_relay(pool: PgPool) {
    let ns = Namespace::new();
    let mut jobs = producer(&ns).pending();
    let pred = Uuid::new_v4();
    let mut tx = pool.begin().await.unwrap();
    let now_uuid = jobs
        .add(
            JobBuilder::new("default", "ProcessThing")
                .json(&serde_json::json!({ "id": 1 }))
                .header("tenant", "acme"),
        )
        .unwrap();
    let later_uuid = jobs
        .add(JobBuilder::new("default", "Later").delay(Duration::from_secs(3600)))
        .unwrap();
    let after_uuid = jobs
        .add(JobBuilder::new("default", "After").predecessor(pred))
        .unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(pending_count(&pool).await, 3);

    let (code, out) = sweep(&pool, &ns, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(pending_count(&pool).await, 0);

    let queued = ns.list_jobs("queue:default").await;
    assert_eq!(uuids_of(&queued), vec![now_uuid]);
    let job = &jobs.jobs()[0];
    assert_eq!(queued[0].job_type, "ProcessThing");
    assert_eq!(queued[0].payload, br#"{"id":1}"#);
    assert_eq!(
        queued[0].headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    let created = queued[0].created_at.unwrap();
    assert_eq!(
        (created.seconds, created.nanos),
        (
            job.created_at.timestamp(),
            job.created_at.timestamp_subsec_nanos() as i32
        ),
        "create_pending took the row's created_at"
    );

    let scheduled = ns.scheduled().await;
    assert_eq!(scheduled.len(), 1);
    assert_eq!(scheduled[0].0.uuid, later_uuid.to_string());
    let run_at = jobs.jobs()[1].run_at.unwrap();
    assert!((scheduled[0].1 - run_at.timestamp_micros() as f64 / 1e6).abs() < 1e-3);

    let waiting = ns.list_jobs(&format!("jobs:{pred}:onComplete")).await;
    assert_eq!(uuids_of(&waiting), vec![after_uuid]);

    // The fast path afterwards has nothing left to do.
    let mut con = ns.con().await;
    let report = jobs.push_and_delete(&mut con, &pool).await.unwrap();
    assert!(report.pushed.is_empty() && report.skipped.len() == 3);
}

/// 10,000 jobs in one transaction are written with ONE statement. Two proofs:
/// a statement-level trigger fires once per INSERT statement on the table, and a proxy on the
/// wire counts the Execute (extended protocol) and Query (simple protocol) messages
/// `create_pending` sends.
#[sqlx::test]
async fn ten_thousand_jobs_are_written_with_one_statement(pool: PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE insert_statements (n int NOT NULL);
         INSERT INTO insert_statements VALUES (0);
         CREATE FUNCTION count_insert_statement() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN UPDATE insert_statements SET n = n + 1; RETURN NULL; END $$;
         CREATE TRIGGER count_insert_statements AFTER INSERT ON pending_jobs
             FOR EACH STATEMENT EXECUTE FUNCTION count_insert_statement();",
    )
    .execute(&pool)
    .await
    .unwrap();

    let proxy = WireCounter::start().await;
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut conn = PgConnection::connect(&proxy.url(&db)).await.unwrap();

    let mut jobs = Producer::default().pending();
    let uuids = jobs
        .add_all((0..10_000).map(|i| {
            JobBuilder::new("bulk", "Bulk")
                .json(&serde_json::json!({ "i": i }))
                .header("n", i.to_string())
        }))
        .unwrap();
    let mut tx = conn.begin().await.unwrap();
    proxy.counting.store(true, Ordering::SeqCst);
    let rows = jobs.create_pending(&mut tx).await.unwrap();
    proxy.counting.store(false, Ordering::SeqCst);
    tx.commit().await.unwrap();

    let executes = proxy.executes.load(Ordering::SeqCst);
    let queries = proxy.queries.load(Ordering::SeqCst);
    assert_eq!(
        (executes, queries),
        (1, 0),
        "create_pending sent {executes} Execute and {queries} Query messages"
    );
    let statements: i32 = sqlx::query_scalar("SELECT n FROM insert_statements")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(statements, 1, "INSERT statements on pending_jobs");
    assert_eq!(pending_count(&pool).await, 10_000);

    // Rows come back in the order added, which is also id order (the relay's claim order).
    assert_eq!(rows.iter().map(|r| r.uuid).collect::<Vec<_>>(), uuids);
    assert!(rows.windows(2).all(|w| w[0].id < w[1].id));
    let sample: (String, Vec<u8>, String) =
        sqlx::query_as("SELECT queue, payload, headers->>'n' FROM pending_jobs WHERE uuid = $1")
            .bind(uuids[4242])
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        sample,
        ("bulk".into(), br#"{"i":4242}"#.to_vec(), "4242".into())
    );

    // Nothing left to write: a second call sends nothing.
    proxy.counting.store(true, Ordering::SeqCst);
    assert!(jobs.create_pending(&mut conn).await.unwrap().is_empty());
    assert_eq!(proxy.executes.load(Ordering::SeqCst), 1);
}

/// `create_pending` writes only the jobs without a row; ids follow the order of `add`.
#[sqlx::test]
async fn create_pending_writes_each_job_once(pool: PgPool) {
    let mut jobs = Producer::default().pending();
    let a = jobs.add(JobBuilder::new("default", "A")).unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let first = jobs.create_pending(&mut conn).await.unwrap();
    let b = jobs.add(JobBuilder::new("default", "B")).unwrap();
    let second = jobs.create_pending(&mut conn).await.unwrap();
    assert_eq!(first.iter().map(|r| r.uuid).collect::<Vec<_>>(), vec![a]);
    assert_eq!(second.iter().map(|r| r.uuid).collect::<Vec<_>>(), vec![b]);
    assert!(first[0].id < second[0].id);
    assert_eq!(pending_count(&pool).await, 2);
    assert_eq!(jobs.rows().len(), 2);
}

/// Bad rows never get in: a CHECK violation fails `create_pending` (and so the caller's
/// transaction) with Postgres's error, for a Job whose checks were bypassed.
#[sqlx::test]
async fn the_table_refuses_what_the_builder_would(pool: PgPool) {
    // A table with a stricter CHECK than the builder's: the insert error comes back typed.
    sqlx::query("ALTER TABLE pending_jobs ADD CONSTRAINT no_x CHECK (job_type <> 'X')")
        .execute(&pool)
        .await
        .unwrap();
    let mut jobs = Producer::default().pending();
    jobs.add(JobBuilder::new("default", "X")).unwrap();
    let mut tx = pool.begin().await.unwrap();
    let e = jobs.create_pending(&mut tx).await.unwrap_err();
    assert!(matches!(e, Error::Database(_)), "{e:?}");
    assert!(e.to_string().contains("no_x"), "{e}");
    drop(tx);
    assert!(jobs.rows().is_empty(), "a failed insert records no row");
    assert_eq!(pending_count(&pool).await, 0);
}

/// Forwards 127.0.0.1:<port> to the shared Postgres, counting the frontend's Execute ('E') and
/// simple Query ('Q') messages while `counting` is set. Connections through it disable TLS.
struct WireCounter {
    port: u16,
    counting: Arc<AtomicBool>,
    executes: Arc<AtomicUsize>,
    queries: Arc<AtomicUsize>,
}

impl WireCounter {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstream = {
            let url = url::Url::parse(&std::env::var("DATABASE_URL").unwrap()).unwrap();
            format!(
                "{}:{}",
                url.host_str().unwrap_or("127.0.0.1"),
                url.port().unwrap_or(5432)
            )
        };
        let counter = WireCounter {
            port,
            counting: Arc::default(),
            executes: Arc::default(),
            queries: Arc::default(),
        };
        let (counting, executes, queries) = (
            counter.counting.clone(),
            counter.executes.clone(),
            counter.queries.clone(),
        );
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                let (counting, executes, queries) =
                    (counting.clone(), executes.clone(), queries.clone());
                tokio::spawn(async move {
                    let (mut client_rx, mut client_tx) = client.into_split();
                    let (mut server_rx, mut server_tx) = server.into_split();
                    tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
                    });
                    let _ = forward_frontend(
                        &mut client_rx,
                        &mut server_tx,
                        &counting,
                        &executes,
                        &queries,
                    )
                    .await;
                });
            }
        });
        counter
    }

    /// A URL for database `db` through the proxy.
    fn url(&self, db: &str) -> String {
        let mut url = url::Url::parse(&std::env::var("DATABASE_URL").unwrap()).unwrap();
        url.set_host(Some("127.0.0.1")).unwrap();
        url.set_port(Some(self.port)).unwrap();
        url.set_path(&format!("/{db}"));
        url.set_query(Some("sslmode=disable"));
        url.to_string()
    }
}

/// Copies frontend messages, counting them: first the untyped startup packets (length, body),
/// then typed messages (type byte, length, body).
async fn forward_frontend(
    rx: &mut tokio::net::tcp::OwnedReadHalf,
    tx: &mut tokio::net::tcp::OwnedWriteHalf,
    counting: &AtomicBool,
    executes: &AtomicUsize,
    queries: &AtomicUsize,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SSL_REQUEST: u32 = 80_877_103;
    const GSSENC_REQUEST: u32 = 80_877_104;
    loop {
        let len = rx.read_u32().await?;
        let mut body = vec![0u8; len as usize - 4];
        rx.read_exact(&mut body).await?;
        tx.write_u32(len).await?;
        tx.write_all(&body).await?;
        let code = u32::from_be_bytes(body[..4].try_into().unwrap());
        if code != SSL_REQUEST && code != GSSENC_REQUEST {
            break;
        }
    }
    loop {
        let kind = rx.read_u8().await?;
        let len = rx.read_u32().await?;
        let mut body = vec![0u8; len as usize - 4];
        rx.read_exact(&mut body).await?;
        if counting.load(Ordering::SeqCst) {
            match kind {
                b'E' => executes.fetch_add(1, Ordering::SeqCst),
                b'Q' => queries.fetch_add(1, Ordering::SeqCst),
                _ => 0,
            };
        }
        tx.write_u8(kind).await?;
        tx.write_u32(len).await?;
        tx.write_all(&body).await?;
    }
}
