//! The fleet benchmark's rows and queues: 200-byte payloads over 4 queues, COPYed in one
//! transaction or inserted one at a time; the relays' backends. Methods of the shared sandbox
//! (`benches/support/sandbox.rs`).

use std::time::Instant;

use sqlx::PgConnection;
use uuid::Uuid;

use super::support::sandbox::Sandbox;
use super::BoxError;

pub const QUEUES: usize = 4;
pub const PAYLOAD_BYTES: usize = 200;
/// `application_name` of the relays' sessions: how their backends are found.
pub const RELAY_APP: &str = "jobrelay_fleet_relay";
/// `application_name` of the benchmark's own sessions.
pub const BENCH_APP: &str = "jobrelay_fleet_bench";

impl Sandbox {
    /// The list of queue `fleet<q>`.
    pub fn queue_key(&self, q: usize) -> String {
        format!("{}queue:fleet{q}", self.namespace())
    }

    /// Empties the table and its dead letters (a new, empty heap, as before the first run) and
    /// analyses it empty: the state autovacuum leaves an outbox in, nearly empty most of the
    /// time, when an outage ends or a bulk import commits.
    pub async fn reset_table(&self) -> Result<(), BoxError> {
        sqlx::raw_sql("TRUNCATE pending_jobs, pending_jobs_dead; ANALYZE pending_jobs")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// COPYs `n` rows with fresh uuids (returned) in one transaction: 200-byte payloads,
    /// round-robin over the queues `fleet0..3`. Statistics stay those of the empty table
    /// ([`Sandbox::reset_table`](Sandbox::reset_table)), unless `vacuumed` (`FLEET_VACUUMED`, a labelled extra).
    pub async fn copy_rows(&self, n: usize, vacuumed: bool) -> Result<Vec<Uuid>, BoxError> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut uuids = Vec::with_capacity(n);
        let mut conn = self.pool.acquire().await?;
        let mut copy = conn
            .copy_in_raw("COPY pending_jobs (uuid, queue, job_type, payload) FROM STDIN")
            .await?;
        let mut buf = String::with_capacity(1 << 20);
        for i in 0..n {
            let uuid = Uuid::new_v4();
            uuids.push(uuid);
            buf.push_str(&format!("{uuid}\tfleet{}\tProcessThing\t\\\\x", i % QUEUES));
            for b in payload(i) {
                buf.push(HEX[(b >> 4) as usize] as char);
                buf.push(HEX[(b & 15) as usize] as char);
            }
            buf.push('\n');
            if buf.len() > (1 << 20) {
                copy.send(buf.as_bytes()).await?;
                buf.clear();
            }
        }
        copy.send(buf.as_bytes()).await?;
        copy.finish().await?;
        drop(conn);
        if vacuumed {
            sqlx::query("VACUUM (ANALYZE) pending_jobs")
                .execute(&self.pool)
                .await?;
        }
        Ok(uuids)
    }

    /// Inserts one row (queue `fleet<i % 4>`, the payload of row `i`) in a transaction of its
    /// own on `conn` (autocommit); returns its uuid and when the commit returned.
    pub async fn insert_row(
        &self,
        conn: &mut PgConnection,
        i: usize,
    ) -> Result<(Uuid, Instant), BoxError> {
        let uuid = Uuid::new_v4();
        // Timed from the INSERT being sent: the row is visible from its commit, which can be
        // before the reply reaches this program, so a clock started at the reply could see the
        // pop come first.
        let sent = Instant::now();
        sqlx::query(
            "INSERT INTO pending_jobs (uuid, queue, job_type, payload)
             VALUES ($1, $2, 'ProcessThing', $3)",
        )
        .bind(uuid)
        .bind(format!("fleet{}", i % QUEUES))
        .bind(payload(i))
        .execute(&mut *conn)
        .await?;
        Ok((uuid, sent))
    }

    /// The lengths of the queues, summed.
    pub async fn jobs_in_queues(
        &self,
        con: &mut redis::aio::MultiplexedConnection,
    ) -> Result<usize, BoxError> {
        let mut pipe = redis::pipe();
        for q in 0..QUEUES {
            pipe.cmd("LLEN").arg(self.queue_key(q));
        }
        let lens: Vec<usize> = pipe.query_async(con).await?;
        Ok(lens.iter().sum())
    }

    /// The pids of the relays' Postgres backends (their pools and listeners).
    pub async fn relay_backends(&self) -> Result<Vec<u32>, BoxError> {
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = $1",
        )
        .bind(RELAY_APP)
        .fetch_all(&self.pool)
        .await?;
        Ok(pids.into_iter().map(|p| p as u32).collect())
    }
}

/// The payload of row `i`: 200 bytes of JSON-ish text, `{"thing_id":<i>,"pad":"xxx...`.
fn payload(i: usize) -> Vec<u8> {
    format!("{{\"thing_id\":{i},\"pad\":\"")
        .bytes()
        .chain(std::iter::repeat(b'x'))
        .take(PAYLOAD_BYTES)
        .collect()
}
