//! The script alone, on the shared Redis under a namespace: the message on `<ns><queue>`, the
//! marker `<ns>jobrelay:celery:<uuid>` (queue key, dedup TTL), duplicates, a refusal; and the
//! fast path leaving a job that is not due yet to the relay.

use base64::Engine as _;
use jobrelay::producer::Producer;
use uuid::Uuid;

use super::*;

#[tokio::test]
async fn the_script_writes_kombus_list_and_a_marker_of_its_own() {
    let ns = Namespace::new();
    let enqueuer = celery_enqueuer(&ns);
    let mut con = ns.con().await;
    let job = JobBuilder::new("mail.q", "app.tasks.send")
        .args_kwargs(&(1, "x"), &json!({"k": [true]}))
        .header("traceparent", TRACEPARENT)
        .header("id", "not celery's id")
        .build()
        .unwrap();
    let jobs = [job.clone(), job.clone()];
    let results = enqueuer.enqueue_batch(&mut con, &jobs).await.unwrap();
    assert!(matches!(results[0], Ok(Outcome::Queued)), "{results:?}");
    assert!(matches!(results[1], Ok(Outcome::Duplicate)), "{results:?}");
    assert_eq!(
        ns.keys().await,
        vec![format!("jobrelay:celery:{}", job.uuid), "mail.q".to_owned()]
    );
    let (value, ttl) = ns
        .get_and_pttl(&format!("jobrelay:celery:{}", job.uuid))
        .await;
    assert_eq!(value, ns.key("mail.q"));
    assert!((50_000..=60_000).contains(&ttl), "{ttl}");
    let raw: Vec<String> = ns.lrange("mail.q").await;
    assert_eq!(raw.len(), 1);
    let msg: Value = serde_json::from_str(&raw[0]).unwrap();
    let id = job.uuid.to_string();
    assert_eq!(msg["headers"]["id"], id.as_str(), "celery's id wins");
    assert_eq!(msg["headers"]["task"], "app.tasks.send");
    assert_eq!(msg["headers"]["traceparent"], TRACEPARENT);
    assert_eq!(msg["properties"]["delivery_info"]["routing_key"], "mail.q");
    let body = base64::engine::general_purpose::STANDARD
        .decode(msg["body"].as_str().unwrap())
        .unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body[0], json!([1, "x"]));
    assert_eq!(body[1], json!({"k": [true]}));
    // With its marker gone, a key of another type under the queue's name refuses the job,
    // writing nothing.
    let marker = ns.key(&format!("jobrelay:celery:{}", job.uuid));
    let _: () = redis::cmd("DEL")
        .arg(&marker)
        .arg(ns.key("mail.q"))
        .query_async(&mut con)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(ns.key("mail.q"))
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    match enqueuer.enqueue(&mut con, &job).await {
        Err(Error::Refused { message, .. }) => {
            assert!(message.contains("WRONGTYPE"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let exists: bool = redis::cmd("EXISTS")
        .arg(&marker)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(!exists, "no marker for a refused job");
}

/// The fast path pushes a due job and leaves one whose run_at is ahead to the relay.
#[sqlx::test]
async fn the_fast_path_leaves_a_job_not_yet_due_to_the_relay(pool: PgPool) {
    let ns = Namespace::new();
    let mut con = ns.con().await;
    let producer = Producer::new(ns.prefix.clone()).layout(LayoutKind::Celery);
    let mut pending = producer.pending();
    let now = pending
        .add(JobBuilder::new("fast.q", "t").args_kwargs(&[1], &BTreeMap::<String, i32>::new()))
        .unwrap();
    let later = pending
        .add(
            JobBuilder::new("fast.q", "t")
                .args_kwargs(&[2], &BTreeMap::<String, i32>::new())
                .delay(Duration::from_secs(3600)),
        )
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    pending.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let report = pending.push_and_delete(&mut con, &pool).await.unwrap();
    assert_eq!(report.pushed, vec![(now, Outcome::Queued)]);
    assert_eq!(report.skipped, vec![later]);
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT uuid FROM pending_jobs")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, vec![later]);
    assert_eq!(ns.llen("fast.q").await, 1);
}
