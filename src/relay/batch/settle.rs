//! What a batch writes back: failed rows handed back to the outbox (for a retry) or moved to
//! the dead letters, and, when that fails, the acknowledged rows deleted on their own.

use std::time::Duration;

use sqlx::{Connection as _, PgConnection};

use super::Batcher;
use crate::error::{Dependency, Error, Result};
use crate::relay::row::{PendingRow, RowArrays};
use crate::report::{Interruption, Report};
use crate::sink::JobSink;
use crate::telemetry::events::{self, Event as _};

/// A row that did not make it, on its way back to the table or to the dead letters.
pub(super) struct Failed {
    pub(super) row: PendingRow,
    pub(super) error: String,
    pub(super) fate: Fate,
}

/// Where a failed row goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Fate {
    /// Back to the outbox table, claimable after this delay.
    Retry(Duration),
    /// To the dead-letter table.
    Dead,
}

impl<S: JobSink> Batcher<S> {
    /// After a failed hand-back: deletes the rows whose jobs Redis acknowledged (the batch was
    /// rolled back, every row is pending again as it was), in a statement of its own. A
    /// delete writes no new row, so it succeeds where the hand-back's INSERT could not extend
    /// a full tablespace. The failed rows stay pending, untouched, and are retried with the
    /// next batch. A row another worker claimed in the meantime is waited for
    /// ([`Queries::settle_acknowledged`]).
    /// Returns how many rows it deleted.
    pub(super) async fn settle_acknowledged(
        &self,
        conn: &mut PgConnection,
        acknowledged: &[i64],
        e: &Error,
        buried: u64,
        report: &mut Report,
    ) -> Result<u64> {
        let deleted = if acknowledged.is_empty() {
            0
        } else {
            // In a transaction of its own, with the relay's settings (a statement with
            // parameters outside a transaction could reach two server connections through
            // PgBouncer in transaction mode).
            let begin = crate::db::begin_statement(
                self.settings.statement_timeout,
                self.settings.idle_in_transaction_timeout,
            );
            let mut tx = self
                .bounded("postgres begin", conn.begin_with(begin))
                .await?;
            let deleted = self
                .bounded(
                    "postgres settle",
                    sqlx::query(&self.queries.settle_acknowledged)
                        .bind(acknowledged)
                        // Run rarely, planned each time for the table as it is now: no
                        // generic plan cached while the table was small.
                        .persistent(false)
                        .execute(&mut *tx),
                )
                .await?
                .rows_affected();
            self.bounded("postgres commit", tx.commit()).await?;
            deleted
        };
        // Every row not delivered is pending again as it was: the refused and invalid ones,
        // those kept, and those the claim had moved to the dead letters (over --max-job-size).
        let unsettled = report.refused + report.invalid + report.kept + report.held;
        report.kept = unsettled;
        report.held = 0;
        report.dead_lettered -= buried;
        report.handed_back = 0;
        report.unsettled = Some(Interruption {
            dependency: e.dependency().unwrap_or(Dependency::Postgres),
            reason: e.reason(),
            error: e.to_string(),
        });
        Ok(deleted)
    }

    /// Puts failed rows back (attempts + 1, delayed) or moves them to the dead letters.
    pub(super) async fn settle_failures(
        &self,
        conn: &mut PgConnection,
        failed: Vec<Failed>,
        report: &mut Report,
    ) -> Result<()> {
        let (retry, dead): (Vec<Failed>, Vec<Failed>) =
            failed.into_iter().partition(|f| f.fate != Fate::Dead);
        if !retry.is_empty() {
            let n = retry.len() as u64;
            self.hand_back(conn, &self.queries.retry, retry).await?;
            report.handed_back += n;
        }
        if !dead.is_empty() {
            let n = dead.len() as u64;
            // Named in the log line: the first ones only, their errors kept before the move.
            let named: Vec<(uuid::Uuid, i64, String)> = dead
                .iter()
                .take(events::DEAD_ROWS_NAMED)
                .map(|f| (f.row.uuid, f.row.id, f.error.clone()))
                .collect();
            self.hand_back(conn, &self.queries.dead_letter, dead)
                .await?;
            report.handed_back += n;
            report.dead_lettered += n;
            let first: Vec<events::DeadRow<'_>> = named
                .iter()
                .map(|(uuid, id, error)| events::DeadRow {
                    uuid: *uuid,
                    id: *id,
                    error,
                })
                .collect();
            events::RowsDeadLettered {
                rows: n,
                first: &first,
            }
            .emit();
        }
        Ok(())
    }

    /// Writes `rows` with `sql` ([`Queries::retry`](crate::relay::Queries::retry) or
    /// [`Queries::dead_letter`](crate::relay::Queries::dead_letter)), their
    /// values moved into one array per column ([`RowArrays`]).
    async fn hand_back(&self, conn: &mut PgConnection, sql: &str, rows: Vec<Failed>) -> Result<()> {
        let mut arrays = RowArrays::with_capacity(rows.len());
        for f in rows {
            let delay = match f.fate {
                Fate::Retry(d) => d.as_secs_f64(),
                Fate::Dead => 0.0,
            };
            arrays.push(f.row, delay, f.error);
        }
        self.bounded(
            "postgres hand-back",
            arrays
                .bind(sqlx::query(sql).persistent(false))
                .execute(conn),
        )
        .await?;
        Ok(())
    }
}
