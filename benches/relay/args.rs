//! What the relay benchmark runs, and how big: `BENCH_*`, `DATABASE_URL` and `REDIS_URL`.

use jobrelay::config::{DEFAULT_BATCH_SIZE, DEFAULT_WORKERS};
use jobrelay::LayoutKind;

use super::support::env;
use super::BoxError;

/// `BENCH_OPTIONS` checked to be a JSON object, as compact text.
fn options(text: &str) -> Result<String, BoxError> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v.to_string()),
        _ => Err(format!("BENCH_OPTIONS must be a JSON object, not {text:?}").into()),
    }
}

/// What to run, and how big.
pub struct Args {
    pub database_url: String,
    pub redis_url: String,
    pub rows: usize,
    pub naive_rows: usize,
    pub rate: usize,
    pub seconds: f64,
    pub insert_seconds: f64,
    pub workers: usize,
    pub batch_size: usize,
    /// `BENCH_LAYOUT`: the Redis layout (`jobrelay`, `conveyor`, `sidekiq`, `celery`, `bullmq` or
    /// `rq`).
    pub layout: LayoutKind,
    /// `BENCH_BACKLOG_ROWS`: the backlog one worker drains in `backlog` (default 1,000,000).
    pub backlog_rows: usize,
    /// `BENCH_VACUUMED=1`: also the drain after `VACUUM (ANALYZE)` (labelled).
    pub vacuumed: bool,
    /// `BENCH_OPTIONS`: the job options of every row the drains and the stages COPY, a JSON object the layout
    /// carries (e.g. `{"retry":3,"backtrace":true,"tags":["billing"]}` with `BENCH_LAYOUT=sidekiq`);
    /// default none (`{}`: the column's default, as rows without options). Compact JSON text.
    pub options: String,
    /// `BENCH_ORDERING_KEYS`: the rows of the drains and the stages take their ordering key
    /// round-robin from this many keys (`k0`, `k1`, ...: interleaved); 1 is one hot key; 0
    /// (default) no key.
    pub ordering_keys: usize,
    /// `BENCH_PREPARED`: `--prepared-statements` (`auto`, the default; `1`/`0` for
    /// `true`/`false`).
    pub prepared_statements: jobrelay::relay::PreparedStatements,
    /// `BENCH_STAGES`: the stages to run, comma-separated (`drain`, `stages`, `naive`,
    /// `latency`, `notify_cost`); default all.
    pub stages: Vec<String>,
}

impl Args {
    /// Whether `BENCH_STAGES` names `stage`.
    pub fn runs(&self, stage: &str) -> bool {
        self.stages.iter().any(|s| s == stage)
    }

    /// Sizes from `BENCH_*` variables, defaults as documented in `main.rs`.
    pub fn from_env() -> Result<Self, BoxError> {
        Ok(Args {
            database_url: env::or(
                "DATABASE_URL",
                "postgres://postgres@127.0.0.1:5432/postgres",
            ),
            redis_url: env::or("REDIS_URL", "redis://127.0.0.1:6379"),
            rows: env::num("BENCH_ROWS", 200_000)?,
            naive_rows: env::num("BENCH_NAIVE_ROWS", 10_000)?,
            rate: env::num("BENCH_RATE", 2_000)?,
            seconds: env::num("BENCH_SECONDS", 20.0)?,
            insert_seconds: env::num("BENCH_INSERT_SECONDS", 30.0)?,
            workers: env::num("BENCH_WORKERS", DEFAULT_WORKERS)?,
            batch_size: env::num("BENCH_BATCH_SIZE", DEFAULT_BATCH_SIZE)?,
            layout: env::or("BENCH_LAYOUT", "jobrelay").parse()?,
            backlog_rows: env::num("BENCH_BACKLOG_ROWS", 1_000_000)?,
            vacuumed: env::or("BENCH_VACUUMED", "") == "1",
            options: options(&env::or("BENCH_OPTIONS", "{}"))?,
            ordering_keys: env::num("BENCH_ORDERING_KEYS", 0)?,
            prepared_statements: env::or("BENCH_PREPARED", "auto").parse()?,
            stages: env::or("BENCH_STAGES", "drain,stages,naive,latency,notify_cost")
                .split(',')
                .map(|s| s.trim().to_owned())
                .collect(),
        })
    }
}
