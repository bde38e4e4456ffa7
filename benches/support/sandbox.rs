//! A benchmark's sandbox: a database of its own next to `DATABASE_URL`
//! (`jobrelay_<kind>_<random>`, migrated), a Redis namespace of its own (`<kind><random>:`),
//! the child processes it starts and a directory, all removed at the end of a run, and on
//! SIGINT or SIGTERM.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use super::BoxError;

/// Set by the signal handler before it removes the sandbox: a stage that fails meanwhile
/// (its database is being dropped) waits for the handler instead of reporting.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether the signal handler is removing the sandbox.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// What to create.
pub struct Settings<'a> {
    /// Names the database `jobrelay_<kind>_<random>` and the namespace `<kind><random>:`.
    pub kind: &'a str,
    /// The server's URL: the database is created next to the one it names.
    pub database_url: &'a str,
    /// The Redis whose keys under the namespace are removed; `None`: no Redis.
    pub redis_url: Option<&'a str>,
    /// Connections of [`Sandbox::pool`].
    pub max_connections: u32,
    /// `application_name` of the pool's sessions.
    pub application_name: Option<&'a str>,
}

/// What a run leaves behind, detached from its pool (for the signal handler).
#[derive(Clone)]
pub struct Scratch {
    pub admin_url: String,
    pub db_name: String,
    pub redis: Option<redis::Client>,
    pub namespace: String,
    /// Pids of child processes started and not yet reaped: killed first.
    pub children: Arc<Mutex<HashSet<u32>>>,
    /// A directory removed last, if set.
    pub dir: Option<PathBuf>,
}

impl Scratch {
    /// Drops the database.
    pub async fn drop_database(&self) -> Result<(), sqlx::Error> {
        let mut admin = PgConnection::connect(&self.admin_url).await?;
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.db_name
        ))
        .execute(&mut admin)
        .await?;
        admin.close().await
    }

    /// Kills the children still running, drops the database (a relay on it then claims nothing
    /// more), unlinks the keys until a pass finds none (a push in flight when the database
    /// went away lands late), and removes the directory.
    pub async fn remove(&self) {
        let pids: Vec<u32> = self.children.lock().unwrap().iter().copied().collect();
        for pid in pids {
            // Not reaped yet, so the pid cannot belong to another process.
            let _ = std::process::Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.drop_database().await;
        if let Some(redis) = &self.redis {
            if let Ok(mut con) = redis.get_multiplexed_async_connection().await {
                for _ in 0..50 {
                    if unlink_keys(&mut con, &self.namespace).await == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
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

/// The sandbox of a run: its database (migrated, with a pool), namespace and leftovers.
pub struct Sandbox {
    pub scratch: Scratch,
    pub pool: PgPool,
    base_url: url::Url,
}

/// `url` pointing at database `db`, with `application_name` set to `app` when given.
fn url_for(url: &url::Url, db: &str, app: Option<&str>) -> String {
    let mut url = url.clone();
    url.set_path(&format!("/{db}"));
    if let Some(app) = app {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(k, _)| k != "application_name")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        url.query_pairs_mut()
            .clear()
            .extend_pairs(pairs)
            .append_pair("application_name", app);
    }
    url.to_string()
}

impl Sandbox {
    /// Creates and migrates the database, and connects the pool; whatever was created is
    /// removed again when a step fails.
    pub async fn create(settings: &Settings<'_>) -> Result<Sandbox, BoxError> {
        let tag = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let db_name = format!("jobrelay_{}_{tag}", settings.kind);
        let base_url = url::Url::parse(settings.database_url)?;
        let scratch = Scratch {
            admin_url: settings.database_url.to_owned(),
            db_name: db_name.clone(),
            redis: settings.redis_url.map(redis::Client::open).transpose()?,
            namespace: format!("{}{tag}:", settings.kind),
            children: Arc::default(),
            dir: None,
        };
        let mut admin = PgConnection::connect(settings.database_url).await?;
        sqlx::query(&format!("CREATE DATABASE {db_name}"))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        let url = url_for(&base_url, &db_name, settings.application_name);
        let pool = async {
            let pool = PgPoolOptions::new()
                .max_connections(settings.max_connections)
                .connect_with(url.parse::<PgConnectOptions>()?)
                .await?;
            if let Err(e) = jobrelay::db::migrate(&pool, &jobrelay::TableName::default()).await {
                pool.close().await;
                return Err(BoxError::from(e));
            }
            Ok(pool)
        }
        .await;
        match pool {
            Ok(pool) => Ok(Sandbox {
                scratch,
                pool,
                base_url,
            }),
            Err(e) => {
                scratch.remove().await;
                Err(e)
            }
        }
    }

    pub fn db_name(&self) -> &str {
        &self.scratch.db_name
    }

    pub fn namespace(&self) -> &str {
        &self.scratch.namespace
    }

    /// The Redis of a sandbox created with one.
    pub fn redis(&self) -> &redis::Client {
        self.scratch
            .redis
            .as_ref()
            .expect("a sandbox created with a Redis URL")
    }

    pub async fn redis_con(&self) -> Result<redis::aio::MultiplexedConnection, BoxError> {
        Ok(self.redis().get_multiplexed_async_connection().await?)
    }

    /// The URL of the sandbox's database, with `application_name` set to `app` when given.
    pub fn url(&self, app: Option<&str>) -> String {
        url_for(&self.base_url, self.db_name(), app)
    }

    /// Whether `pending_jobs` has no row.
    pub async fn table_empty(&self) -> Result<bool, BoxError> {
        let any: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pending_jobs LIMIT 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(any.is_none())
    }

    /// Closes the pool and removes everything.
    pub async fn remove(self) {
        self.pool.close().await;
        self.scratch.remove().await;
    }
}

/// With `on`, a task that waits for SIGINT or SIGTERM, then says so on stderr (`program:
/// interrupted; removing <database>`), removes the sandbox and exits 130. Only for the
/// programs: a test must not take over its process's signals.
pub struct SignalGuard(Option<tokio::task::JoinHandle<()>>);

impl SignalGuard {
    pub fn arm(program: &'static str, on: bool, scratch: &Scratch) -> SignalGuard {
        let scratch = scratch.clone();
        SignalGuard(on.then(|| tokio::spawn(remove_on_signal(program, scratch))))
    }

    /// After the run: if the handler is removing the sandbox (the run failed because its
    /// database is being dropped), waits for it to exit the process; else stops the task.
    pub async fn disarm(self) {
        if interrupted() {
            std::future::pending::<()>().await;
        }
        if let Some(task) = self.0 {
            task.abort();
        }
    }
}

async fn remove_on_signal(program: &str, scratch: Scratch) {
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
        note!("{program}: interrupted; removing {}", scratch.db_name);
        scratch.remove().await;
        std::process::exit(130);
    }
}
