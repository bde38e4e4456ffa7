//! What a batch writes back: failed rows handed back to the outbox (for a retry) or moved to
//! the dead letters, and, when that fails, the acknowledged rows deleted on their own.

use std::time::Duration;

use sqlx::{Connection as _, PgConnection};

use super::Batcher;
use crate::error::{Dependency, Error, Result};
use crate::relay::report::{Interruption, Report};
use crate::relay::row::PendingRow;
use crate::relay::sink::JobSink;
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
        let unsettled = report.refused + report.invalid + report.kept;
        report.kept = unsettled;
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
            let first = dead[0].error.clone();
            self.hand_back(conn, &self.queries.dead_letter, dead)
                .await?;
            report.handed_back += n;
            report.dead_lettered += n;
            events::RowsDeadLettered {
                rows: n,
                first_error: &first,
            }
            .emit();
        }
        Ok(())
    }

    async fn hand_back(&self, conn: &mut PgConnection, sql: &str, rows: Vec<Failed>) -> Result<()> {
        let n = rows.len();
        let mut id = Vec::with_capacity(n);
        let mut uuid = Vec::with_capacity(n);
        let mut queue = Vec::with_capacity(n);
        let mut job_type = Vec::with_capacity(n);
        let mut payload = Vec::with_capacity(n);
        let mut parent = Vec::with_capacity(n);
        let mut pred = Vec::with_capacity(n);
        let mut dead_parent = Vec::with_capacity(n);
        let mut run_at = Vec::with_capacity(n);
        let mut headers = Vec::with_capacity(n);
        let mut created_at = Vec::with_capacity(n);
        let mut attempts = Vec::with_capacity(n);
        let mut delay = Vec::with_capacity(n);
        let mut last_error = Vec::with_capacity(n);
        for f in rows {
            let r = f.row;
            id.push(r.id);
            uuid.push(r.uuid);
            queue.push(r.queue);
            job_type.push(r.job_type);
            payload.push(r.payload);
            parent.push(r.parent_uuid);
            pred.push(r.predecessor_uuid);
            dead_parent.push(r.dead_parent);
            run_at.push(r.run_at);
            headers.push(r.headers);
            created_at.push(r.created_at);
            attempts.push(r.attempts);
            delay.push(match f.fate {
                Fate::Retry(d) => d.as_secs_f64(),
                Fate::Dead => 0.0,
            });
            last_error.push(f.error);
        }
        self.bounded(
            "postgres hand-back",
            sqlx::query(sql)
                .persistent(false)
                .bind(id)
                .bind(uuid)
                .bind(queue)
                .bind(job_type)
                .bind(payload)
                .bind(parent)
                .bind(pred)
                .bind(dead_parent)
                .bind(run_at)
                .bind(headers)
                .bind(created_at)
                .bind(attempts)
                .bind(delay)
                .bind(last_error)
                .execute(conn),
        )
        .await?;
        Ok(())
    }
}
