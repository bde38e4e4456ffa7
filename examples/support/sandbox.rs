//! What the benchmark examples share: removing their scratch database and Redis keys, at the
//! end of a run or on SIGINT or SIGTERM. Included by each example with `#[path]`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::{Connection, PgConnection};

/// Set by the signal handler before it removes the sandbox: a stage that fails meanwhile
/// (its database is being dropped) waits for the handler instead of reporting.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether the signal handler is removing the sandbox.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// A scratch database next to `admin_url` and the Redis keys under `namespace`.
#[derive(Clone)]
pub struct Scratch {
    pub admin_url: String,
    pub db_name: String,
    pub redis: redis::Client,
    pub namespace: String,
}

impl Scratch {
    /// Drops the database first (a relay on it then claims nothing more), then unlinks the
    /// keys until a pass finds none: a push in flight when the database went away lands late.
    pub async fn remove(&self) {
        if let Ok(mut admin) = PgConnection::connect(&self.admin_url).await {
            let _ = sqlx::query(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.db_name
            ))
            .execute(&mut admin)
            .await;
        }
        let Ok(mut con) = self.redis.get_multiplexed_async_connection().await else {
            return;
        };
        for _ in 0..50 {
            if unlink_keys(&mut con, &self.namespace).await == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Unlinks every key under `namespace`; how many there were.
pub async fn unlink_keys(con: &mut redis::aio::MultiplexedConnection, namespace: &str) -> usize {
    let mut removed = 0;
    let mut cursor = 0u64;
    loop {
        let r: Result<(u64, Vec<String>), _> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{namespace}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await;
        let Ok((next, keys)) = r else { break };
        if !keys.is_empty() {
            removed += keys.len();
            let _: Result<(), _> = redis::cmd("UNLINK").arg(&keys).query_async(con).await;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    removed
}

/// Waits for SIGINT or SIGTERM, then says so on stderr (`program: interrupted; removing
/// what`), runs `remove` and exits 130.
pub async fn remove_on_signal<F: Future<Output = ()>>(program: &str, what: String, remove: F) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return;
    };
    let signalled = tokio::select! {
        r = tokio::signal::ctrl_c() => r.is_ok(),
        r = term.recv() => r.is_some(),
    };
    if signalled {
        INTERRUPTED.store(true, Ordering::SeqCst);
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "{program}: interrupted; removing {what}");
        remove.await;
        std::process::exit(130);
    }
}
