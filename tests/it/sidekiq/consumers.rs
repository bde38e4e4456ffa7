//! The Redis side with the real Sidekiq (docs/redis-side.md): the relay writing under a
//! namespace no Sidekiq process reads (`myapp:` in front of a stock Sidekiq), and a queue no
//! process reads, are seen by the metrics, the daemon's log (once per episode, naming the
//! namespace the consumers do use), `status` and `check`; with the right namespace the
//! consumer is counted; a process that stops heartbeating (SIGSTOP) stops counting after
//! Sidekiq's 60 s and counts again when it resumes.

use super::*;
use crate::common::http_relay::HttpRelay;
use crate::common::redis_server::RedisServer;
use crate::common::redis_side::{self, metric};
use crate::common::sidekiq::Sidekiq;
use sqlx::PgPool;

/// Inserts `n` rows of `queue` (class HardJob).
async fn rows(pool: &PgPool, queue: &str, n: usize) {
    for i in 0..n {
        sqlx::query(
            "INSERT INTO pending_jobs (queue, job_type, payload)
             VALUES ($1, 'HardJob', convert_to($2, 'UTF8'))",
        )
        .bind(queue)
        .bind(json!([i]).to_string())
        .execute(pool)
        .await
        .unwrap();
    }
}

/// `jobrelay <args>` in the sidekiq layout.
async fn cli(pool: &PgPool, redis: &str, namespace: &str, args: &[&str]) -> (i32, String) {
    redis_side::cli(pool, redis, "sidekiq", namespace, args).await
}

#[sqlx::test]
async fn a_wrong_namespace_and_a_queue_nobody_reads_are_told_everywhere(pool: PgPool) {
    let redis = RedisServer::start();
    let mut sidekiq = Sidekiq::new(&redis.url());
    sidekiq.start(&["billing"], 1).await;
    rows(&pool, "billing", 3).await;
    rows(&pool, "mail", 2).await;
    let relay = HttpRelay::start(&pool, &redis.url(), "myapp:", &["--layout", "sidekiq"]).await;
    relayed(&pool, "every row relayed").await;

    // The metrics: 3 and 2 waiting, no consumer under myapp:.
    let port = relay.port();
    let seen = || async {
        metric(port, "jobrelay_queue_depth{queue=\"billing\"}").await == Some(3.0)
            && metric(port, "jobrelay_queue_depth{queue=\"mail\"}").await == Some(2.0)
            && metric(port, "jobrelay_queue_consumers{queue=\"billing\"}").await == Some(0.0)
            && metric(port, "jobrelay_queue_consumers{queue=\"mail\"}").await == Some(0.0)
    };
    wait_until("the queue gauges", Duration::from_secs(30), seen).await;
    let age = metric(port, "jobrelay_queue_oldest_age_seconds{queue=\"billing\"}").await;
    assert!(age.is_some_and(|a| (0.0..60.0).contains(&a)), "{age:?}");

    // The log: one warning per queue, the wrong namespace's naming the fix.
    let warned = || async { relay.warnings("no consumer of the sidekiq layout").len() >= 2 };
    wait_until("the warnings", Duration::from_secs(30), warned).await;
    // Another sample or two: still one line per queue (once per episode).
    hold_for(
        Duration::from_secs(11),
        "two more samples may not log again",
    )
    .await;
    let lines = relay.warnings("no consumer of the sidekiq layout");
    assert_eq!(lines.len(), 2, "{lines:?}");
    let message = |q: &str| -> String {
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("queue {q}:")))
            .unwrap();
        let v: Value = serde_json::from_str(line).unwrap();
        v["message"].as_str().unwrap().to_owned()
    };
    let billing = message("billing");
    assert!(
        billing.starts_with("queue billing: 3 jobs waiting, oldest "),
        "{billing}"
    );
    assert!(
        billing.ends_with(
            ", no consumer of the sidekiq layout seen under namespace \"myapp:\"; \
             consumers of billing are seen under namespace \"\" (pass --namespace \"\")"
        ),
        "{billing}"
    );
    assert!(
        message("mail")
            .ends_with("no consumer of the sidekiq layout seen under namespace \"myapp:\""),
        "nobody reads mail anywhere: {}",
        message("mail")
    );
    assert!(relay
        .logs()
        .contains("\"failure\":\"queue_without_consumer\""));

    // `status`, with the outbox empty: the runner's registry names the queues.
    let (code, text) = cli(&pool, &redis.url(), "myapp:", &["status"]).await;
    assert_eq!(code, 0, "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("billing "))
        .expect(&text);
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((cols[1], cols[3]), ("3", "0"), "waiting, consumers: {text}");
    assert!(
        text.contains("warning: queue billing: 3 jobs waiting"),
        "{text}"
    );
    let (code, text) = cli(&pool, &redis.url(), "myapp:", &["status", "--json"]).await;
    assert_eq!(code, 0, "{text}");
    let v: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let billing = v["redis"]["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "billing")
        .unwrap()
        .clone();
    assert_eq!(
        (&billing["depth"], &billing["consumers"]),
        (&json!(3), &json!(0))
    );
    assert_eq!(v["redis"]["consumers_elsewhere"]["billing"], json!([""]));

    // `check`: a warning, exit 0; with --strict, exit 1.
    let (code, text) = cli(&pool, &redis.url(), "myapp:", &["check"]).await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("redis: warning: queue billing: 3 jobs waiting")
            && text.contains("(pass --namespace \"\")"),
        "{text}"
    );
    let (code, text) = cli(&pool, &redis.url(), "myapp:", &["check", "--strict"]).await;
    assert_eq!(code, 1, "{text}");

    // The right namespace: the process is counted, and it runs the jobs.
    drop(relay);
    rows(&pool, "billing", 2).await;
    let relay = HttpRelay::start(&pool, &redis.url(), "", &["--layout", "sidekiq"]).await;
    relayed(&pool, "every row relayed").await;
    sidekiq.wait_for_runs(2, Duration::from_secs(30)).await;
    let port = relay.port();
    let counted =
        || async { metric(port, "jobrelay_queue_consumers{queue=\"billing\"}").await == Some(1.0) };
    wait_until("one consumer of billing", Duration::from_secs(30), counted).await;
    let (code, text) = cli(&pool, &redis.url(), "", &["check", "--strict"]).await;
    assert_eq!(code, 0, "{text}");
    assert!(relay.warnings("no consumer").is_empty(), "{}", relay.logs());
}

#[sqlx::test]
async fn a_process_that_stops_heartbeating_stops_counting(pool: PgPool) {
    let redis = RedisServer::start();
    let mut sidekiq = Sidekiq::new(&redis.url());
    sidekiq.start(&["billing"], 1).await;
    let relay = HttpRelay::start(&pool, &redis.url(), "", &["--layout", "sidekiq"]).await;
    rows(&pool, "billing", 1).await;
    sidekiq.wait_for_runs(1, Duration::from_secs(30)).await;
    let port = relay.port();
    let consumers = || metric(port, "jobrelay_queue_consumers{queue=\"billing\"}");
    wait_until("one consumer", Duration::from_secs(30), || async {
        consumers().await == Some(1.0)
    })
    .await;

    // Stopped, it neither runs jobs nor beats: after Sidekiq's 60 s it is gone.
    sidekiq.signal("STOP");
    rows(&pool, "billing", 2).await;
    relayed(&pool, "the rows relayed").await;
    wait_until(
        "no consumer after 60 s",
        Duration::from_secs(90),
        || async { consumers().await == Some(0.0) },
    )
    .await;
    // (The stopped process may have popped one of them before it stopped.)
    let warned = || async { !relay.warnings("queue billing: ").is_empty() };
    let said = eventually(Duration::from_secs(10), warned).await;
    assert!(said, "the warning; logs:\n{}", relay.logs());

    // Resumed, it beats again: counted, the episode over, the jobs run.
    sidekiq.signal("CONT");
    wait_until("the consumer again", Duration::from_secs(30), || async {
        consumers().await == Some(1.0)
    })
    .await;
    sidekiq.wait_for_runs(3, Duration::from_secs(30)).await;
    let over = || async {
        relay
            .logs()
            .contains("queue billing: no longer without a consumer")
    };
    wait_until("the episode's end", Duration::from_secs(30), over).await;
}
