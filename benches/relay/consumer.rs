//! The latency stage's consumer: BRPOP, then RPOP up to 100 more without blocking while the
//! list has any; each job is timed when the reply that carried it arrived. A thread of its own
//! with a blocking connection, as a consumer process would be, so that the producers' tasks
//! cannot delay its timestamps. Popping one job per round trip would measure the consumer: it
//! falls behind whenever a batch lands, and the slowest jobs then wait for it, not for the
//! relay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use jobrelay::LayoutKind;
use prost::Message;

use super::support::sandbox::Sandbox;
use super::{rows, BoxError};

/// Pop instants, by uuid.
pub type Popped = Arc<Mutex<HashMap<uuid::Uuid, Instant>>>;

/// Starts the thread: it pops `total` jobs from the queue `latency` and notes each in `popped`.
pub fn spawn(
    sb: &Sandbox,
    layout: LayoutKind,
    total: usize,
    popped: Popped,
) -> Result<JoinHandle<()>, BoxError> {
    let mut con = sb.redis().get_connection()?;
    let key = rows::queue_key(sb, layout, "latency");
    Ok(std::thread::spawn(move || {
        let mut seen = 0;
        while seen < total {
            let first: Option<(String, Vec<u8>)> = redis::cmd("BRPOP")
                .arg(&key)
                .arg(1)
                .query(&mut con)
                .unwrap_or(None);
            let Some((_, first)) = first else { continue };
            let mut reply = vec![first];
            let mut now = Instant::now();
            loop {
                let mut popped = popped.lock().unwrap();
                for bytes in reply.drain(..) {
                    popped.insert(job_uuid(layout, bytes).parse().expect("a uuid"), now);
                    seen += 1;
                }
                drop(popped);
                reply = redis::cmd("RPOP")
                    .arg(&key)
                    .arg(100)
                    .query::<Option<Vec<Vec<u8>>>>(&mut con)
                    .unwrap_or(None)
                    .unwrap_or_default();
                now = Instant::now();
                if reply.is_empty() {
                    break;
                }
            }
        }
    }))
}

/// The uuid of a job popped from a queue of `layout`.
fn job_uuid(layout: LayoutKind, bytes: Vec<u8>) -> String {
    match layout {
        LayoutKind::Jobrelay => {
            jobrelay::proto::v1::Job::decode(bytes.as_slice())
                .expect("a job")
                .uuid
        }
        LayoutKind::Conveyor => {
            jobrelay::proto::wire::Job::decode(bytes.as_slice())
                .expect("a job")
                .uuid
        }
        // The jid is the uuid's 32 hex digits.
        LayoutKind::Sidekiq => serde_json::from_slice::<serde_json::Value>(&bytes)
            .expect("a Sidekiq job")["jid"]
            .as_str()
            .expect("a jid")
            .to_owned(),
        LayoutKind::Celery => {
            let msg: serde_json::Value = serde_json::from_slice(&bytes).expect("a celery message");
            msg["headers"]["id"].as_str().expect("a task id").to_owned()
        }
        // The wait list holds the job ids: the uuids.
        LayoutKind::Bullmq => String::from_utf8(bytes).expect("a job id"),
        // RQ's queue holds job ids: the uuid itself.
        LayoutKind::Rq => String::from_utf8(bytes).expect("a job id"),
    }
}
