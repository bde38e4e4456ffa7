//! The producer: what it shares with the relay (table, namespace, dedup TTL, layout) and the
//! bound on a fast-path push.

use std::sync::Arc;
use std::time::Duration;

use super::sql::Sql;
use crate::broker::enqueue::Enqueuer;
use crate::broker::layout::LayoutKind;
use crate::defaults::{DEFAULT_DEDUP_TTL, DEFAULT_PUSH_TIMEOUT};
use crate::table::TableName;

/// What a producer shares with the relay: the outbox table, the Redis key namespace and the
/// dedup TTL; plus the bound on a fast-path push.
///
/// Make one per application (it is cheap to clone) with the same `--table`, `--namespace`
/// and `--dedup-ttl` as the relay, and call [`Producer::pending`](Producer::pending) once per transaction.
/// Defaults match the relay's: table `pending_jobs`, dedup TTL 15 minutes, push timeout 5 s.
///
/// ```
/// use std::time::Duration;
/// use jobrelay::{producer::Producer, TableName};
///
/// let producer = Producer::new("app1:")
///     .table(TableName::parse("billing.jobs").expect("a valid table name"))
///     .dedup_ttl(Duration::from_secs(3600));
/// assert_eq!(producer.table_name().to_string(), "billing.jobs");
/// assert_eq!(producer.enqueuer().namespace(), "app1:");
/// ```
#[derive(Debug, Clone)]
pub struct Producer {
    pub(super) inner: Arc<Inner>,
}

/// What every `PendingJobs` of a producer reads.
#[derive(Debug, Clone)]
pub(super) struct Inner {
    pub(super) enqueuer: Enqueuer,
    pub(super) table: TableName,
    /// Rendered once per table, shared by every `PendingJobs` of this producer.
    pub(super) sql: Arc<Sql>,
    pub(super) push_timeout: Duration,
}

impl Producer {
    /// A producer writing to `pending_jobs` and pushing keys under `namespace` (e.g.
    /// `"app1:"`, or `""` for none: the relay's `--namespace`).
    pub fn new(namespace: impl Into<String>) -> Self {
        let table = TableName::default();
        Producer {
            inner: Arc::new(Inner {
                enqueuer: Enqueuer::new(namespace, DEFAULT_DEDUP_TTL),
                sql: Arc::new(Sql::new(&table)),
                table,
                push_timeout: DEFAULT_PUSH_TIMEOUT,
            }),
        }
    }

    /// Writes to `table` (the relay's `--table`) instead of `pending_jobs`. The table must
    /// exist (`jobrelay migrate --table T`, or `SELECT jobrelay_create_outbox('T')`).
    #[must_use]
    pub fn table(self, table: TableName) -> Self {
        self.with(|i| {
            i.sql = Arc::new(Sql::new(&table));
            i.table = table;
        })
    }

    /// Sets how long the dedup markers written by the fast path live (the relay's
    /// `--dedup-ttl`; `Duration::ZERO`: forever). Default: 15 minutes.
    #[must_use]
    pub fn dedup_ttl(self, ttl: Duration) -> Self {
        self.with(|i| i.enqueuer = i.enqueuer.clone().with_dedup_ttl(ttl))
    }

    /// Writes the fast path's jobs in `layout` (the relay's `--layout`): the same keys, wire
    /// format and script as the relay. Default: [`LayoutKind::Jobrelay`].
    #[must_use]
    pub fn layout(self, layout: LayoutKind) -> Self {
        self.with(|i| i.enqueuer = i.enqueuer.clone().with_layout(layout))
    }

    /// Bounds each fast-path push (the relay's `--push-timeout`); a push that takes longer
    /// fails with [`Error::Timeout`](crate::Error::Timeout) and leaves the rows to the relay. Default: 5 s.
    #[must_use]
    pub fn push_timeout(self, timeout: Duration) -> Self {
        self.with(|i| i.push_timeout = timeout)
    }

    /// The enqueuer the fast path runs: the same algorithm and script as the relay.
    pub fn enqueuer(&self) -> &Enqueuer {
        &self.inner.enqueuer
    }

    /// The outbox table.
    pub fn table_name(&self) -> &TableName {
        &self.inner.table
    }

    fn with(self, change: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = Arc::unwrap_or_clone(self.inner);
        change(&mut inner);
        Producer {
            inner: Arc::new(inner),
        }
    }
}

impl Default for Producer {
    /// [`Producer::new`] with no namespace: the relay's defaults.
    fn default() -> Self {
        Producer::new("")
    }
}
