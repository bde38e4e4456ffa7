//! The backlog gauges and the xmin horizon's episodes, sampled by the daemon's probe task
//! every [`super::probe::BACKLOG_INTERVAL`] (docs/metrics.md#metrics).

use std::time::{Duration, Instant};

use sqlx::{Connection as _, PgPool, Row as _};

use super::queries::{self, Queries};
use crate::sink::ClaimNeeds;
use crate::table::TableName;
use crate::telemetry::events::{self, BacklogSampled, Event as _};
pub use crate::telemetry::events::{Horizon, HORIZON_WARN_AFTER};

/// How often the claimable age is looked for from the lowest id (a catch-up) rather than from
/// the mark: at most this late for a row that became claimable below it.
pub const CLAIMABLE_CATCH_UP: Duration = Duration::from_secs(60);

/// The backlog sampler: its statements, and where the next look for a claimable row starts.
///
/// [`Queries::oldest_claimable`] walks the primary key from a lower bound. From the lowest id
/// it walks over every row deleted since vacuum last ran, and while a transaction holds the
/// xmin horizon nothing removes them (measured: 1,000,000 dead rows ahead of 10 claimable ones,
/// 169 ms). So, like the claims (docs/guarantees.md#where-a-claim-looks), it starts from a
/// **mark**, the first claimable row the previous sample found, and walks only over what was
/// claimed since; every [`CLAIMABLE_CATCH_UP`] it starts from the lowest id again, which finds
/// a row that became claimable below the mark (a retry whose backoff ended, a long producer
/// transaction's row) and moves the mark back to it.
#[derive(Debug, Clone)]
pub struct Backlog {
    /// Rows pending, the oldest one's age, dead rows: reads the whole table (the count is the
    /// gauge's definition).
    totals: String,
    /// [`Queries::oldest_claimable`].
    claimable: String,
    /// Where the next look for a claimable row starts.
    mark: i64,
    /// When the last look from the lowest id was.
    caught_up: Option<Instant>,
    /// How often to look from the lowest id.
    catch_up_every: Duration,
}

impl Backlog {
    /// The statements for `table`, for a runner that `needs` what it says of the claim
    /// (whether rows wait until due).
    pub fn new(table: &TableName, needs: ClaimNeeds) -> Self {
        Backlog {
            totals: format!(
                "SELECT (SELECT count(*) FROM {t}),
                        (SELECT COALESCE(EXTRACT(EPOCH FROM now()
                             - min(created_at) FILTER (WHERE isfinite(created_at)))::float8, 0)
                         FROM {t}),
                        (SELECT count(*) FROM {d})",
                t = table.pending(),
                d = table.dead()
            ),
            claimable: Queries::for_needs(table, needs).oldest_claimable,
            mark: i64::MIN,
            caught_up: None,
            catch_up_every: CLAIMABLE_CATCH_UP,
        }
    }

    /// The same sampler, looking from the lowest id every `every` (default
    /// [`CLAIMABLE_CATCH_UP`]).
    pub fn catch_up_every(mut self, every: Duration) -> Self {
        self.catch_up_every = every;
        self
    }

    /// Takes one sample.
    pub async fn sample(&mut self, pool: &PgPool) -> sqlx::Result<BacklogSampled> {
        let mut conn = pool.acquire().await?;
        let row = crate::db::simple_query(&mut conn, &self.totals).await?;
        let (pending, oldest_age_seconds, dead) = (
            row.try_get::<i64, _>(0)?,
            row.try_get::<f64, _>(1)?,
            row.try_get::<i64, _>(2)?,
        );
        let catch_up = self
            .caught_up
            .is_none_or(|t| t.elapsed() >= self.catch_up_every);
        let from = if catch_up { i64::MIN } else { self.mark };
        // With the relay's planner settings: the primary key in `id` order, whatever the
        // statistics of a table analysed while nearly empty say. Unnamed: no plan cached.
        let mut tx = conn.begin_with(queries::BEGIN).await?;
        let found: Option<(i64, f64)> = sqlx::query_as(&self.claimable)
            .persistent(false)
            .bind(from)
            .fetch_optional(&mut *tx)
            .await?;
        tx.rollback().await?;
        if catch_up {
            self.caught_up = Some(Instant::now());
        }
        // None claimable: the rows below the mark were claimed or are parked; it stays.
        if let Some((id, _)) = found {
            self.mark = id;
        }
        Ok(BacklogSampled {
            pending,
            oldest_age_seconds,
            oldest_claimable_age_seconds: found.map_or(0.0, |(_, age)| age),
            dead,
        })
    }
}

/// The xmin horizon as an episode: a WARN when a transaction has held it for
/// [`HORIZON_WARN_AFTER`], an INFO when it moved on; the gauges at every sample.
#[derive(Debug, Default)]
pub struct HorizonWatch {
    /// The holder warned about, while the episode lasts.
    held: Option<Horizon>,
}

impl HorizonWatch {
    /// Records one sample (`None`: nothing holds the horizon back).
    pub fn saw(&mut self, found: Option<&Horizon>) {
        let seconds = found.and_then(|h| h.seconds).unwrap_or(0.0).max(0.0);
        events::XminHorizonSampled {
            age_seconds: seconds,
            xids: found.map_or(0, |h| h.xids),
        }
        .emit();
        let over = found.filter(|_| seconds >= HORIZON_WARN_AFTER.as_secs_f64());
        match (over, &self.held) {
            (Some(h), None) => {
                events::XminHorizonHeld {
                    horizon: h,
                    seconds,
                }
                .emit();
                self.held = Some(h.clone());
            }
            (None, Some(was)) => {
                events::XminHorizonMovedOn { was }.emit();
                self.held = None;
            }
            _ => {}
        }
    }
}
