//! The backlog gauges and the xmin horizon's episodes, sampled by the daemon's probe task
//! every [`super::probe::BACKLOG_INTERVAL`] (docs/metrics.md#metrics).

use sqlx::{Connection as _, PgPool, Row as _};

use super::probe::{Horizon, HORIZON_WARN_AFTER};
use super::queries::{self, Queries};
use crate::redis::layout::LayoutKind;
use crate::table::TableName;
use crate::telemetry::events::{self, BacklogSampled, Event as _};

/// The statements of one backlog sample.
#[derive(Debug, Clone)]
pub struct Backlog {
    /// Rows pending, the oldest one's age, dead rows: reads the whole table (the count is the
    /// gauge's definition).
    totals: String,
    /// [`Queries::oldest_claimable`]: bounded by the rows parked ahead of the first claimable
    /// one.
    claimable: String,
}

impl Backlog {
    /// The statements for `table` in `layout` (which says whether rows wait until due).
    pub fn new(table: &TableName, layout: LayoutKind) -> Self {
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
            claimable: Queries::for_layout(table, layout).oldest_claimable,
        }
    }

    /// Takes one sample.
    pub async fn sample(&self, pool: &PgPool) -> sqlx::Result<BacklogSampled> {
        let mut conn = pool.acquire().await?;
        let row = crate::db::simple_query(&mut conn, &self.totals).await?;
        let (pending, oldest_age_seconds, dead) = (
            row.try_get::<i64, _>(0)?,
            row.try_get::<f64, _>(1)?,
            row.try_get::<i64, _>(2)?,
        );
        // With the relay's planner settings: the primary key in `id` order, whatever the
        // statistics of a table analysed while nearly empty say.
        let mut tx = conn.begin_with(queries::BEGIN).await?;
        let oldest_claimable_age_seconds = crate::db::simple_query(&mut tx, &self.claimable)
            .await?
            .try_get::<f64, _>(0)?;
        tx.rollback().await?;
        Ok(BacklogSampled {
            pending,
            oldest_age_seconds,
            oldest_claimable_age_seconds,
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
