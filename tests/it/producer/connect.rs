//! `connect_redis`: the fast path's Redis connection from a URL, so that an application needs
//! no `redis` crate of its own (whose version would have to match the library's).

use jobrelay::producer::connect_redis;

use super::*;

/// A URL of the shared Redis: the fast path pushes and deletes through the connection.
#[sqlx::test]
async fn connect_redis_gives_the_fast_path_its_connection(pool: PgPool) {
    let ns = Namespace::new();
    let mut redis = connect_redis(&ns.url).await.expect("redis reachable");
    let mut jobs = Producer::new(ns.prefix.clone()).pending();
    let uuid = jobs.add(JobBuilder::new("default", "Ping")).unwrap();
    let mut tx = pool.begin().await.unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();

    let report = jobs.push_and_delete(&mut redis, &pool).await.unwrap();
    assert_eq!(report.pushed, vec![(uuid, Outcome::Queued)]);
    assert_eq!(pending_count(&pool).await, 0);
    assert_eq!(uuids_of(&ns.list_jobs("queue:default").await), vec![uuid]);
}

/// What is not a Redis URL is refused as such; a Redis that is not there fails at once as
/// transient; a Sentinel URL is taken (and fails only on reaching its Sentinels). No error
/// shows the password.
#[tokio::test]
async fn connect_redis_refuses_bad_urls_without_the_password() {
    let err = connect_redis("http://user:s3cret@127.0.0.1:6379")
        .await
        .err()
        .expect("refused");
    let text = format!("{err} {err:?}");
    assert!(text.contains("not a Redis URL"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");

    let port = free_port();
    for url in [
        format!("redis://user:s3cret@127.0.0.1:{port}"),
        format!("redis+sentinel://user:s3cret@127.0.0.1:{port}/primary"),
    ] {
        let err = connect_redis(&url).await.err().expect("nobody listens");
        let text = format!("{err} {err:?}");
        assert_eq!(err.class(), ErrorClass::Transient, "{url}: {text}");
        assert!(!text.contains("not a Redis URL"), "{url}: {text}");
        assert!(!text.contains("s3cret"), "{url}: {text}");
    }
}
