//! The backlog gauges, the held ordering keys and the xmin horizon's episodes, sampled by the
//! daemon's probe task every [`super::probe::BACKLOG_INTERVAL`] (docs/metrics.md#metrics).

use std::time::{Duration, Instant};

use sqlx::{Connection as _, PgPool, Row as _};

use super::queries::{self, Queries};
use crate::admin::held_keys::{self, HeldKeys};
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

/// The held ordering keys as an episode: the gauges at every sample, a WARN when a key becomes
/// held (naming the first), an INFO when none is any more.
#[derive(Debug)]
pub struct HeldWatch {
    table: TableName,
    /// Whether the last sample found a held key (the episode is on).
    held: bool,
}

impl HeldWatch {
    /// The watch of `table`'s keys, no episode on.
    pub fn new(table: &TableName) -> Self {
        HeldWatch {
            table: table.clone(),
            held: false,
        }
    }

    /// Takes one sample (naming the first key, the oldest hold), emits its gauges and, when
    /// the episode begins or ends, its log line.
    pub async fn sample(&mut self, pool: &PgPool) -> crate::error::Result<HeldKeys> {
        let held = held_keys::held_keys(pool, &self.table, 1).await?;
        self.saw(&held);
        Ok(held)
    }

    /// Records one sample.
    fn saw(&mut self, held: &HeldKeys) {
        events::HeldKeysSampled {
            keys: held.keys,
            oldest_age_seconds: held.oldest_age_seconds.unwrap_or(0.0),
        }
        .emit();
        match (held.keys > 0, self.held) {
            (true, false) => events::OrderingKeyHeld { held }.emit(),
            (false, true) => events::OrderingKeysReleased.emit(),
            _ => {}
        }
        self.held = held.keys > 0;
    }
}

/// The xmin horizon as an episode: a WARN when a transaction has held it for
/// [`HORIZON_WARN_AFTER`], an INFO when it moved on; the gauges at every sample.
#[derive(Debug, Default)]
pub struct HorizonWatch {
    /// The holder warned about, while the episode lasts.
    held: Option<Horizon>,
    /// The holder of the last sample, its horizon, and how long it had held it when first seen.
    tracked: Option<Tracked>,
}

#[derive(Debug)]
struct Tracked {
    pid: Option<i32>,
    horizon: String,
    first_seen: Instant,
    seconds_then: f64,
}

impl HorizonWatch {
    /// `found` with its seconds counted from the first sample that saw the same holder hold
    /// the same horizon, when that is longer than the sample's own estimate (a `REPEATABLE READ`
    /// transaction's snapshot outlives its statements).
    pub fn held_for(&mut self, found: Option<&Horizon>, now: Instant) -> Option<Horizon> {
        let mut h = found?.clone();
        let same = match (&self.tracked, &h.horizon) {
            (Some(t), Some(x)) => t.pid == h.pid && &t.horizon == x,
            _ => false,
        };
        if same {
            let t = self.tracked.as_ref().expect("same");
            if let Some(s) = h.seconds.as_mut() {
                *s = s.max(
                    t.seconds_then + now.saturating_duration_since(t.first_seen).as_secs_f64(),
                );
            }
        } else {
            self.tracked = h.horizon.clone().map(|horizon| Tracked {
                pid: h.pid,
                horizon,
                first_seen: now,
                seconds_then: h.seconds.unwrap_or(0.0).max(0.0),
            });
        }
        Some(h)
    }

    /// Records one sample (`None`: nothing holds the horizon back).
    pub fn saw(&mut self, found: Option<&Horizon>) {
        let found = self.held_for(found, Instant::now());
        if found.is_none() {
            self.tracked = None;
        }
        let found = found.as_ref();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: i32, horizon: &str, seconds: f64) -> Horizon {
        Horizon {
            kind: "transaction".to_owned(),
            pid: Some(pid),
            seconds: Some(seconds),
            xids: 5,
            detail: "active".to_owned(),
            horizon: Some(horizon.to_owned()),
        }
    }

    /// A holder that keeps the same horizon is timed from when it was first seen (a `REPEATABLE
    /// READ` transaction whose statement started 1 s ago has held it since the first sample);
    /// a new horizon, or another holder, starts from the sample's own estimate.
    #[test]
    fn the_same_horizon_is_timed_from_its_first_sample() {
        let mut w = HorizonWatch::default();
        let t0 = Instant::now();
        let s = |h: Option<Horizon>| h.and_then(|h| h.seconds).unwrap();
        assert_eq!(s(w.held_for(Some(&holder(1, "100", 3.0)), t0)), 3.0);
        let later = t0 + Duration::from_secs(10);
        assert_eq!(s(w.held_for(Some(&holder(1, "100", 1.0)), later)), 13.0);
        // A fresh snapshot (a new statement of a READ COMMITTED transaction): its own age.
        let later = t0 + Duration::from_secs(20);
        assert_eq!(s(w.held_for(Some(&holder(1, "140", 0.5)), later)), 0.5);
        // Another session holding the same xid: timed afresh.
        let later = t0 + Duration::from_secs(30);
        assert_eq!(s(w.held_for(Some(&holder(2, "140", 2.0)), later)), 2.0);
        // The sample's own estimate wins when longer.
        let later = t0 + Duration::from_secs(31);
        assert_eq!(s(w.held_for(Some(&holder(2, "140", 90.0)), later)), 90.0);
    }
}
