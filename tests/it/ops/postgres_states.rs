//! Postgres states named for what they are, each against a Postgres the test controls: a full
//! tablespace (a private cluster whose outbox lives on a small tmpfs) with a job Redis refuses,
//! a migration's lock held on the outbox, a transaction holding the xmin horizon.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

use super::*;
use crate::common::batch::queue_uuids;
use jobrelay::relay::probe::HORIZON_WARN_AFTER;
use sqlx::Connection as _;

/// A tmpfs of `size` mounted on a fresh directory owned by the `postgres` OS user; unmounted
/// (and the directory removed) on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("jobrelay-tmpfs-")
            .tempdir()
            .unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(
            ok,
            "mount -t tmpfs on {} (needs root)",
            dir.path().display()
        );
        let ok = Command::new("chown")
            .arg("postgres:postgres")
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "chown postgres {}", dir.path().display());
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// A private cluster whose outbox table lives in a tablespace on a small tmpfs. Fields drop in
/// order: the server stops before the tmpfs is unmounted.
struct FullDisk {
    pg: PgServer,
    _tmpfs: Tmpfs,
}

impl FullDisk {
    fn start() -> FullDisk {
        let tmpfs = Tmpfs::mount("8m");
        let pg = PgServer::start_trusted("-c autovacuum=off");
        FullDisk { pg, _tmpfs: tmpfs }.with_tablespace()
    }

    fn with_tablespace(self) -> FullDisk {
        let location = self._tmpfs.path().display().to_string();
        self.pg
            .psql(&format!("CREATE TABLESPACE small LOCATION '{location}'"));
        self
    }

    fn url(&self) -> String {
        self.pg.url("postgres", "unused", "postgres", "")
    }

    /// Fills the tablespace with a table of its own until Postgres cannot extend a file there.
    fn fill(&self) {
        self.pg.psql(
            "CREATE TABLE filler (b text) TABLESPACE small;
             DO $$ BEGIN
                 LOOP
                     BEGIN
                         INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 100);
                     EXCEPTION WHEN disk_full THEN EXIT;
                     END;
                 END LOOP;
             END $$",
        );
    }

    fn free(&self) {
        self.pg.psql("DROP TABLE filler");
    }
}

/// Messages of `events` that are exactly `message`.
fn with_message<'a>(events: &'a [serde_json::Value], message: &str) -> Vec<&'a serde_json::Value> {
    events.iter().filter(|e| e["message"] == message).collect()
}

/// On `disk`: the migrated outbox with a job Redis will refuse first (queue `poison`), then
/// `good` jobs (queue `default`), all in one batch, moved onto the small tablespace, which is
/// then filled. 1,000-byte payloads and a fillfactor of 10: a row put back needs a new page,
/// whatever room the others leave. Returns a pool and the uuids of the good jobs.
async fn outbox_on_the_full_disk(disk: &FullDisk, good: usize) -> (PgPool, HashSet<String>) {
    let url = disk.url();
    let (code, out, err) = run_relay(&["migrate"], &[("DATABASE_URL", &url)]).await;
    assert_eq!(code, 0, "migrate\n{out}\n{err}");
    let pool = PgPool::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT CASE WHEN i = 0 THEN 'poison' ELSE 'default' END, 'Bulk',
                convert_to(rpad(i::text, 1000, 'x'), 'UTF8')
         FROM generate_series(0, $1) AS i",
    )
    .bind(good as i64)
    .execute(&pool)
    .await
    .unwrap();
    let good: HashSet<String> =
        sqlx::query_scalar("SELECT uuid::text FROM pending_jobs WHERE queue = 'default'")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    disk.pg.psql(
        "ALTER TABLE pending_jobs SET TABLESPACE small;
         ALTER TABLE pending_jobs SET (fillfactor = 10)",
    );
    disk.fill();
    (pool, good)
}

/// A report held open on another connection to `url` (a REPEATABLE READ transaction that has
/// taken its snapshot): the rows the relay deletes cannot be pruned (which would make room in
/// the outbox's own pages), so the disk stays full for it.
async fn report_held_open(url: &str) -> sqlx::PgConnection {
    let mut report = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut report)
        .await
        .unwrap();
    sqlx::query("SELECT 1").execute(&mut report).await.unwrap();
    report
}

/// Deletes the dedup markers of `ns` (as if they expired, after --dedup-ttl): a job pushed again
/// now would be a second job, not a duplicate. There must be `n`, one per acknowledged job.
async fn expire_the_markers(ns: &Namespace, n: usize) {
    let mut con = ns.con().await;
    let markers: Vec<String> = ns
        .keys()
        .await
        .into_iter()
        .filter(|k| k.starts_with("jobs:") && k.matches(':').count() == 1)
        .map(|k| ns.key(&k))
        .collect();
    assert_eq!(markers.len(), n, "one marker per acknowledged job");
    for chunk in markers.chunks(500) {
        let _: () = redis::cmd("DEL")
            .arg(chunk)
            .query_async(&mut con)
            .await
            .unwrap();
    }
}

/// `/readyz` (503) and `jobrelay check` (exit 1) name the full disk.
async fn assert_the_disk_full_is_named(d: &Daemon, env: &[(&str, &str)]) {
    let (status, body) = d.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("postgres: disk full (") && body.contains("No space left on device"),
        "{body}"
    );
    let (code, out, err) = run_relay(&["check"], env).await;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains("postgres: disk full: ") && out.contains("could not extend file"),
        "{out}"
    );
}

/// The disk full is one episode in the log, that ended, and the batches never failed.
fn assert_one_disk_full_episode(events: &[serde_json::Value]) {
    let down = with_message(events, "postgres unavailable; retrying with backoff");
    assert_eq!(down.len(), 1, "one episode: {down:?}");
    assert_eq!(down[0]["reason"], "disk full", "{}", down[0]);
    let error = down[0]["error"].as_str().unwrap();
    assert!(error.contains("could not extend file"), "{error}");
    let up = with_message(events, "postgres recovered");
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0]["reason"], "disk full");
    assert!(with_message(events, "relay batches failing; retrying with backoff").is_empty());
}

/// The outbox's tablespace is full and Redis refuses one job of the batch (a WRONGTYPE key):
/// the hand-back of that row cannot be written. The rows whose jobs Redis acknowledged are
/// deleted all the same, so that once their dedup markers expired (no marker to absorb a
/// second push) every job is in Redis exactly once while the relay keeps retrying the
/// refused one, which stays pending as it was. The disk is named (`disk full`) once, in the
/// logs and `/readyz`, and stays one episode although the probe's reads succeed all along; it
/// ends when the row can be handed back.
#[tokio::test]
async fn a_full_tablespace_never_rolls_back_an_acknowledged_push() {
    const GOOD: usize = 999;
    let disk = FullDisk::start();
    let url = disk.url();
    let (pool, good) = outbox_on_the_full_disk(&disk, GOOD).await;
    let ns = Namespace::new();
    let mut con = ns.con().await;
    let _: () = redis::cmd("SET")
        .arg(ns.key("queue:poison"))
        .arg("not a list")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut report = report_held_open(&url).await;

    let d = Daemon::start(
        &[],
        &[
            ("DATABASE_URL", &url),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
            ("RUST_LOG", "info,jobrelay=debug"),
        ],
    );
    let refusals = || with_message(&d.events(), "jobs refused by redis; kept for retry").len();
    wait_until(
        "the refused job tried twice on the full disk",
        Duration::from_secs(60),
        || async { refusals() >= 2 },
    )
    .await;
    expire_the_markers(&ns, GOOD).await;
    let before = refusals();
    wait_until(
        "the refused job tried 3 more times after the markers expired",
        Duration::from_secs(60),
        || async { refusals() >= before + 3 },
    )
    .await;
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("REDIS_URL", ns.url.as_str()),
        ("JOBRELAY_NAMESPACE", ns.prefix.as_str()),
    ];
    assert_the_disk_full_is_named(&d, &env).await;
    // Every acknowledged job once, and only the refused row left, untouched.
    let got = queue_uuids(&ns, "queue:default").await;
    let distinct: HashSet<String> = got.iter().cloned().collect();
    println!(
        "FIGURES test=full_tablespace pushes={} distinct={} refusals={}",
        got.len(),
        distinct.len(),
        refusals()
    );
    assert_eq!(got.len(), GOOD, "each acknowledged job pushed once");
    assert_eq!(distinct, good);
    let left: Vec<(String, i32)> = sqlx::query_as("SELECT queue, attempts FROM pending_jobs")
        .fetch_all(&pool)
        .await
        .unwrap();
    let refused = [("poison".to_owned(), 0)];
    assert_eq!(left, refused, "the refused row is pending, as it was");

    sqlx::query("COMMIT").execute(&mut report).await.unwrap();
    disk.free();
    wait_until(
        "the refused row handed back once the disk has room",
        Duration::from_secs(60),
        || async {
            sqlx::query_scalar::<_, i32>("SELECT attempts FROM pending_jobs")
                .fetch_optional(&pool)
                .await
                .unwrap()
                .is_some_and(|a| a >= 1)
        },
    )
    .await;
    d.wait_ready(Duration::from_secs(10)).await;
    let (code, out, err) = run_relay(&["check"], &env).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let _: () = redis::cmd("DEL")
        .arg(ns.key("queue:poison"))
        .query_async(&mut con)
        .await
        .unwrap();
    wait_until(
        "the refused job relayed",
        Duration::from_secs(60),
        || async { pending_count(&pool).await == 0 },
    )
    .await;
    assert_eq!(ns.llen("queue:poison").await, 1);
    assert_eq!(queue_uuids(&ns, "queue:default").await.len(), GOOD);
    assert_one_disk_full_episode(&d.events());
    pool.close().await;
}

/// A migration holds `LOCK TABLE pending_jobs IN ACCESS EXCLUSIVE MODE` for longer than the
/// statement timeout: `/readyz`, `jobrelay check` and the log name a `lock wait` and the
/// holder's pid, as one episode (the workers' claims that time out behind it do not rename
/// it), and the relay resumes when the lock goes.
#[sqlx::test]
async fn a_lock_held_on_the_outbox_is_a_lock_wait_naming_its_holder(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let ns = Namespace::new();
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", ns.url.as_str()),
        ("JOBRELAY_NAMESPACE", ns.prefix.as_str()),
    ];
    let mut d = Daemon::start(&[], &env);
    d.wait_ready(Duration::from_secs(15)).await;

    let mut migration = sqlx::PgConnection::connect(&db).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut migration)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut migration).await.unwrap();
    sqlx::query("LOCK TABLE pending_jobs IN ACCESS EXCLUSIVE MODE")
        .execute(&mut migration)
        .await
        .unwrap();
    let locked = Instant::now();
    let named = format!("pid {pid} (AccessExclusiveLock");
    wait_until(
        "/readyz names the lock",
        Duration::from_secs(10),
        || async {
            let (status, body) = d.get("/readyz").await;
            status == 503 && body.contains("postgres: lock wait (") && body.contains(&named)
        },
    )
    .await;
    let (code, out, err) = run_relay(&["check"], &env).await;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains("postgres: lock wait: ") && out.contains(&named),
        "{out}"
    );
    // Held past the statement timeout (15 s): the workers' claims time out behind it.
    while locked.elapsed() < Duration::from_secs(18) {
        let (status, body) = d.get("/readyz").await;
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("lock wait"), "{body}");
        hold_for(Duration::from_millis(200), "between looks at /readyz").await;
    }
    sqlx::query("COMMIT").execute(&mut migration).await.unwrap();
    d.wait_ready(Duration::from_secs(10)).await;
    insert_rows(&pool, 100, "default").await;
    wait_until(
        "rows relayed after the lock",
        Duration::from_secs(30),
        || async { pending_count(&pool).await == 0 },
    )
    .await;
    assert_eq!(ns.llen("queue:default").await, 100);

    let events = d.events();
    let down = with_message(&events, "postgres unavailable; retrying with backoff");
    assert_eq!(down.len(), 1, "one episode: {down:?}");
    assert_eq!(down[0]["reason"], "lock wait", "{}", down[0]);
    assert!(
        down[0]["error"].as_str().unwrap().contains(&named),
        "{}",
        down[0]
    );
    assert_eq!(with_message(&events, "postgres recovered").len(), 1);
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

/// `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;` left open on another connection holds
/// the xmin horizon: the gauge shows its age, and once it passes the threshold (60 s) the
/// relay says so once, at WARN, naming its pid; when it ends, once more, at INFO.
#[sqlx::test]
async fn a_transaction_holding_the_xmin_horizon_is_named_once(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let ns = Namespace::new();
    let d = Daemon::start(
        &[],
        &[
            ("DATABASE_URL", &db),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    d.wait_ready(Duration::from_secs(15)).await;
    let mut report = sqlx::PgConnection::connect(&db).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut report)
        .await
        .unwrap();
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut report)
        .await
        .unwrap();
    sqlx::query("SELECT 1").execute(&mut report).await.unwrap();
    let opened = Instant::now();
    let age = || async {
        d.metrics()
            .await
            .try_get("jobrelay_xmin_horizon_age_seconds")
            .unwrap_or(0.0)
    };
    wait_until(
        "the gauge shows the held horizon",
        Duration::from_secs(15),
        || async { age().await >= 1.0 },
    )
    .await;
    let warning = "a transaction (pid ".to_owned() + &pid.to_string() + ") open for";
    let warned = || {
        d.events()
            .into_iter()
            .filter(|e| {
                e["level"] == "WARN" && e["message"].as_str().unwrap().starts_with(&warning)
            })
            .collect::<Vec<_>>()
    };
    assert!(warned().is_empty(), "warned before the threshold");
    wait_until(
        "the WARN naming the holder",
        Duration::from_secs(90),
        || async { !warned().is_empty() },
    )
    .await;
    assert!(opened.elapsed() >= HORIZON_WARN_AFTER);
    let w = &warned()[0];
    assert_eq!(w["pid"], pid.to_string(), "{w}");
    assert!(w["age_seconds"].as_f64().unwrap() >= 60.0, "{w}");
    assert_eq!(w["kind"], "transaction", "{w}");
    // Once per episode: the next samples (every 5 s) say nothing more.
    hold_for(
        Duration::from_secs(11),
        "two more samples, which say nothing",
    )
    .await;
    assert_eq!(warned().len(), 1);
    assert!(age().await >= 60.0);

    sqlx::query("COMMIT").execute(&mut report).await.unwrap();
    wait_until("the horizon moved on", Duration::from_secs(15), || async {
        !d.events_with("the xmin horizon moved on").is_empty()
    })
    .await;
    assert!(age().await < 60.0);
    assert_eq!(warned().len(), 1);
}
