//! Exactly-once after a run: every expected uuid in the queues (or popped by the consumer)
//! once, no other job, nothing left in the table or its dead letters.

use std::collections::HashSet;

use prost::Message;
use serde_json::{json, Value};
use uuid::Uuid;

use super::outbox::QUEUES;
use super::support::sandbox::Sandbox;
use super::BoxError;

impl Sandbox {
    /// Exactly-once: every COPYed uuid is in the queues once, no other job is, and nothing is
    /// left in the table or its dead letters.
    pub async fn check(&self, uuids: &[Uuid]) -> Result<Value, BoxError> {
        self.check_with(uuids, &[]).await
    }

    /// [`Sandbox::check`], where the jobs a consumer `popped` from the queues (their uuids;
    /// `None`: not a job) count as in the queues.
    pub async fn check_with(
        &self,
        uuids: &[Uuid],
        popped: &[Option<Uuid>],
    ) -> Result<Value, BoxError> {
        const CHUNK: isize = 10_000;
        let expected: HashSet<Uuid> = uuids.iter().copied().collect();
        let mut seen: HashSet<Uuid> = HashSet::with_capacity(uuids.len());
        let (mut in_queues, mut duplicated, mut unexpected) = (0usize, 0usize, 0usize);
        for uuid in popped {
            in_queues += 1;
            match uuid {
                Some(uuid) if expected.contains(uuid) => {
                    if !seen.insert(*uuid) {
                        duplicated += 1;
                    }
                }
                _ => unexpected += 1,
            }
        }
        let mut con = self.redis_con().await?;
        for q in 0..QUEUES {
            let mut start = 0isize;
            loop {
                let items: Vec<Vec<u8>> = redis::cmd("LRANGE")
                    .arg(self.queue_key(q))
                    .arg(start)
                    .arg(start + CHUNK - 1)
                    .query_async(&mut con)
                    .await?;
                if items.is_empty() {
                    break;
                }
                start += items.len() as isize;
                for bytes in items {
                    in_queues += 1;
                    let job = jobrelay::proto::v1::Job::decode(bytes.as_slice())?;
                    let uuid: Uuid = job.uuid.parse()?;
                    if !expected.contains(&uuid) {
                        unexpected += 1;
                    } else if !seen.insert(uuid) {
                        duplicated += 1;
                    }
                }
            }
        }
        let missing = expected.len() - seen.len();
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_jobs")
            .fetch_one(&self.pool)
            .await?;
        let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_jobs_dead")
            .fetch_one(&self.pool)
            .await?;
        let ok = in_queues == uuids.len()
            && missing == 0
            && duplicated == 0
            && unexpected == 0
            && left == 0
            && dead == 0;
        Ok(json!({
            "exactly_once": ok,
            "jobs_in_queues": in_queues,
            "popped": popped.len(),
            "missing": missing,
            "duplicated": duplicated,
            "unexpected": unexpected,
            "left_in_table": left,
            "dead_lettered": dead,
        }))
    }
}
