//! The defaults of every setting, owned by the library: the relay's and the producer's code
//! use them, and the binary's flags, environment and TOML file fall back to them.

use std::time::Duration;

/// Default Postgres URL: the local server, as its conventional superuser (trust auth on a
/// development machine; production always sets `DATABASE_URL`).
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// Default Redis URL.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Default rows per batch (chosen by benchmark; docs/decisions.md#defaults).
pub const DEFAULT_BATCH_SIZE: usize = 1000;
/// Default `--batch-max-bytes`: bytes per script call and per batch (chosen by measurement;
/// docs/decisions.md#defaults, docs/benchmarks.md#the-byte-cap-and-the-job-size-limit).
pub const DEFAULT_BATCH_MAX_BYTES: usize = 8 * 1024 * 1024;
/// Default `--max-job-size`: the largest marshalled job relayed; larger ones are dead-lettered
/// as permanent failures (docs/decisions.md#defaults,
/// docs/benchmarks.md#the-byte-cap-and-the-job-size-limit).
pub const DEFAULT_MAX_JOB_SIZE: usize = 8 * 1024 * 1024;
/// Default fleet-wide claim slots (chosen by benchmark; docs/decisions.md#defaults).
pub const DEFAULT_CLAIM_SLOTS: usize = 2;
/// Default claim loops (chosen by benchmark).
pub const DEFAULT_WORKERS: usize = 2;
/// Default idle poll interval.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Default attempts before dead-lettering.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 25;
/// Default dedup marker lifetime.
pub const DEFAULT_DEDUP_TTL: Duration = Duration::from_secs(15 * 60);
/// Default HTTP listener.
pub const DEFAULT_HTTP_ADDR: &str = "0.0.0.0:9898";
/// Default shutdown bound.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(25);
/// Default push bound.
pub const DEFAULT_PUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// Default window of the queues whose Redis side the daemon watches (fed this recently).
pub const DEFAULT_CONSUMER_WINDOW: Duration = Duration::from_secs(5 * 60);
/// Default sweep age.
pub const DEFAULT_OLDER_THAN: Duration = Duration::from_secs(60);
/// Server-side `statement_timeout` of the relay's sessions, and the client-side bound on each
/// statement: a claim or delete of one batch takes milliseconds.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(15);
/// Default `--redis-wait-replicas`: no replica waited for.
pub const DEFAULT_REDIS_WAIT_REPLICAS: u32 = 0;
/// Default `--redis-wait-timeout`: how long `WAIT` waits for the replicas.
pub const DEFAULT_REDIS_WAIT_TIMEOUT: Duration = Duration::from_secs(1);
