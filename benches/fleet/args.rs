//! The fleet benchmark's settings: `FLEET_*`, `DATABASE_URL`, `REDIS_URL` and `JOBRELAY_BIN`
//! (documented in `main.rs`).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use super::BoxError;

/// A configuration: processes x workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub processes: usize,
    pub workers: usize,
}

/// What the fleet is compared with: one process with the default two workers.
pub const BASELINE: Shape = Shape {
    processes: 1,
    workers: 2,
};

/// What to run, and how big.
#[derive(Debug, Clone)]
pub struct Args {
    pub database_url: String,
    pub redis_url: String,
    pub rows: usize,
    pub fleet: Shape,
    pub rounds: usize,
    /// The `jobrelay` binary the relays run.
    pub relay_bin: PathBuf,
    /// Longest a drain may take.
    pub timeout: Duration,
    /// Keep the relays' log files.
    pub keep_logs: bool,
    /// `FLEET_VACUUMED`: VACUUM (ANALYZE) the table after the COPY (a labelled extra figure:
    /// production tables are never in that state).
    pub vacuumed: bool,
    /// The idle-fleet stage after the rounds; `None` skips it (`FLEET_IDLE_RELAYS=0`).
    pub idle: Option<IdleArgs>,
}

/// The idle-fleet stage: what an idle fleet costs, and how soon it relays a single row.
#[derive(Debug, Clone, PartialEq)]
pub struct IdleArgs {
    /// Relay processes, each with the default workers.
    pub relays: usize,
    /// How long the idle fleet's CPU is measured.
    pub window: Duration,
    /// Rows of the "steady" latency series, and the time between their inserts.
    pub latency_rows: usize,
    pub latency_gap: Duration,
    /// Rows of the "quiet" series (0: none), each after this long without a row, longer than
    /// the relays' poll interval so that every worker is waiting for a notification.
    pub quiet_rows: usize,
    pub quiet_gap: Duration,
}

impl Args {
    /// Settings from the process's environment (see the module documentation).
    pub fn from_env() -> Result<Self, BoxError> {
        Args::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Settings from `get` (an environment); empty values count as unset.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, BoxError> {
        let var = |k: &str| get(k).filter(|s| !s.is_empty());
        let positive = |k: &str, default: usize| -> Result<usize, BoxError> {
            match var(k) {
                None => Ok(default),
                Some(v) => match usize::from_str(&v) {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(format!("{k}={v:?}: expected a positive integer").into()),
                },
            }
        };
        // `cargo bench --bench fleet` builds the binary with the benchmark (as `cargo test`
        // does with the tests that compile this file).
        let relay_bin = var("JOBRELAY_BIN").map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_jobrelay")),
            PathBuf::from,
        );
        if !relay_bin.is_file() {
            return Err(format!("JOBRELAY_BIN: no relay binary at {}", relay_bin.display()).into());
        }
        let non_negative = |k: &str, default: usize| -> Result<usize, BoxError> {
            match var(k) {
                None => Ok(default),
                Some(v) => usize::from_str(&v)
                    .map_err(|_| format!("{k}={v:?}: expected a non-negative integer").into()),
            }
        };
        let duration = |k: &str, default: Duration| -> Result<Duration, BoxError> {
            match var(k) {
                None => Ok(default),
                Some(v) => {
                    Ok(humantime::parse_duration(&v).map_err(|e| format!("{k}={v:?}: {e}"))?)
                }
            }
        };
        let timeout = duration("FLEET_TIMEOUT", Duration::from_secs(600))?;
        let idle = match non_negative("FLEET_IDLE_RELAYS", 24)? {
            0 => None,
            relays => Some(IdleArgs {
                relays,
                window: match var("FLEET_IDLE_SECONDS") {
                    None => Duration::from_secs(10),
                    Some(v) => match f64::from_str(&v) {
                        Ok(s) if s > 0.0 && s.is_finite() => Duration::from_secs_f64(s),
                        _ => {
                            return Err(format!(
                                "FLEET_IDLE_SECONDS={v:?}: expected a positive number"
                            )
                            .into())
                        }
                    },
                },
                latency_rows: positive("FLEET_LATENCY_ROWS", 200)?,
                latency_gap: duration("FLEET_LATENCY_GAP", Duration::from_millis(50))?,
                quiet_rows: non_negative("FLEET_QUIET_ROWS", 20)?,
                quiet_gap: duration("FLEET_QUIET_GAP", Duration::from_secs(2))?,
            }),
        };
        Ok(Args {
            database_url: var("DATABASE_URL")
                .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into()),
            redis_url: var("REDIS_URL").unwrap_or_else(|| "redis://127.0.0.1:6379".into()),
            rows: positive("FLEET_ROWS", 100_000)?,
            fleet: Shape {
                processes: positive("FLEET_PROCESSES", 6)?,
                workers: positive("FLEET_WORKERS", 4)?,
            },
            rounds: positive("FLEET_ROUNDS", 3)?,
            relay_bin,
            timeout,
            keep_logs: var("FLEET_KEEP_LOGS").is_some(),
            vacuumed: var("FLEET_VACUUMED").is_some(),
            idle,
        })
    }
}

/// Warns when the relay binary is older than a file it is built from (`src/`, `migrations/`,
/// `proto/` of this crate): a `JOBRELAY_BIN` built before an edit (the binary `cargo bench`
/// builds is current).
pub fn warn_if_stale(bin: &Path) {
    fn newest(dir: &Path) -> Option<SystemTime> {
        let mut latest = None;
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let path = entry.path();
            let t = if path.is_dir() {
                newest(&path)
            } else {
                entry.metadata().and_then(|m| m.modified()).ok()
            };
            latest = latest.max(t);
        }
        latest
    }
    let Ok(built) = std::fs::metadata(bin).and_then(|m| m.modified()) else {
        return;
    };
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = ["src", "migrations", "proto"]
        .iter()
        .filter_map(|d| newest(&crate_dir.join(d)))
        .max();
    if source.is_some_and(|s| s > built) {
        note!(
            "fleet: warning: {} is older than the source in {}: rebuild it (or leave \
             JOBRELAY_BIN unset: `cargo bench --bench fleet` builds the binary)",
            bin.display(),
            crate_dir.display()
        );
    }
}
