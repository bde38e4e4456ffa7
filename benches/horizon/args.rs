//! The horizon benchmark's settings: `HORIZON_*` and `DATABASE_URL`.

use std::time::Duration;

use super::support::env;
use super::BoxError;

/// What to run, and how long.
pub struct Args {
    pub database_url: String,
    /// `HORIZON_RATE`: rows a second of the steady stream.
    pub rate: u64,
    /// `HORIZON_WORKERS`: the relay's workers.
    pub workers: usize,
    /// `HORIZON_PHASE`: how long each phase runs.
    pub phase: Duration,
    /// `HORIZON_PAIRS`: pairs of phases A and B.
    pub pairs: usize,
    /// `HORIZON_WINDOW`: how often a line is printed.
    pub window: Duration,
    /// `HORIZON_HOUR_ROWS`: the rows of the simulated hour (0: none).
    pub hour_rows: u64,
}

impl Args {
    /// Settings from the environment, defaults as documented in `main.rs`.
    pub fn from_env() -> Result<Self, BoxError> {
        Ok(Args {
            database_url: env::or(
                "DATABASE_URL",
                "postgres://postgres@127.0.0.1:5432/postgres",
            ),
            rate: env::num("HORIZON_RATE", 1_500)?,
            workers: env::num("HORIZON_WORKERS", 2)?,
            phase: env::duration("HORIZON_PHASE", Duration::from_secs(300))?,
            pairs: env::num("HORIZON_PAIRS", 1)?,
            window: env::duration("HORIZON_WINDOW", Duration::from_secs(30))?,
            hour_rows: env::num("HORIZON_HOUR_ROWS", 2_000_000)?,
        })
    }
}
