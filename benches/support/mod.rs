//! What the benchmarks share. Each benchmark includes this module with `#[path]` and uses a
//! part of it:
//!
//! - [`sandbox`]: the run's own database, Redis namespace, child processes and directory,
//!   removed at the end of a run or on SIGINT or SIGTERM;
//! - [`procfs`]: CPU time from `/proc` (threads, processes, the Postgres server's processes, the
//!   machine), and [`redis_info`]: Redis's own CPU time, from `INFO`;
//! - [`stats`]: rounding, percentiles, medians;
//! - [`env`]: settings from environment variables;
//! - [`cli`]: whether `cargo bench` started the program (and not `cargo test`).
//!
//! Submodules of a benchmark reach each other with `super::` paths, never `crate::`: the
//! integration tests (`tests/it/bench/`) compile every benchmark as a module of their crate.

/// `eprintln!` that ignores a closed or broken stderr: a panic there would skip the cleanup.
#[allow(unused_macros)]
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod cli;
pub mod env;
pub mod procfs;
pub mod redis_info;
pub mod sandbox;
pub mod stats;

/// Any error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
