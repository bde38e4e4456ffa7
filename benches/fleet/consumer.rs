//! The idle stage's consumer: a thread that BRPOPs the queues and notes when each job arrived.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use uuid::Uuid;

use super::outbox::QUEUES;
use super::support::sandbox::Sandbox;
use super::BoxError;

/// Longest wait for a series' last rows to be popped after its last insert.
const POP_DEADLINE: Duration = Duration::from_secs(30);

/// A job the consumer popped: its uuid (`None`: not a job) and when BRPOP returned it.
pub struct Popped {
    pub uuid: Option<Uuid>,
    pub at: Instant,
}

/// A thread that BRPOPs the queues on a blocking connection of its own and hands every job
/// over with the instant it arrived. Dropped, it stops within a second.
pub struct Consumer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    incoming: std::sync::mpsc::Receiver<Popped>,
    /// What it popped so far (see [`Consumer::collect`]).
    pub popped: Vec<Popped>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Consumer {
    pub fn start(sb: &Sandbox) -> Result<Consumer, BoxError> {
        let keys: Vec<String> = (0..QUEUES).map(|q| sb.queue_key(q)).collect();
        let mut con = sb.redis().get_connection()?;
        con.set_read_timeout(Some(Duration::from_secs(10)))?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, incoming) = std::sync::mpsc::channel();
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || -> Result<(), String> {
            while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
                let item: Option<(String, Vec<u8>)> = redis::cmd("BRPOP")
                    .arg(&keys)
                    .arg(1)
                    .query(&mut con)
                    .map_err(|e| format!("BRPOP: {e}"))?;
                let at = Instant::now();
                if let Some((_, bytes)) = item {
                    let uuid = jobrelay::proto::v1::Job::decode(bytes.as_slice())
                        .ok()
                        .and_then(|job| job.uuid.parse().ok());
                    if tx.send(Popped { uuid, at }).is_err() {
                        break;
                    }
                }
            }
            Ok(())
        });
        Ok(Consumer {
            stop,
            incoming,
            popped: Vec::new(),
            thread: Some(thread),
        })
    }

    /// Takes in what the thread popped so far; an error if the thread ended early.
    pub fn collect(&mut self) -> Result<(), BoxError> {
        self.popped.extend(self.incoming.try_iter());
        if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
            self.finish()?;
            return Err("the consumer stopped early".into());
        }
        Ok(())
    }

    /// Waits until every uuid of `want` was popped, or [`POP_DEADLINE`].
    pub async fn wait_for(&mut self, want: &[Uuid]) -> Result<(), BoxError> {
        let t0 = Instant::now();
        loop {
            self.collect()?;
            let seen: HashSet<Uuid> = self.popped.iter().filter_map(|p| p.uuid).collect();
            if want.iter().all(|u| seen.contains(u)) || t0.elapsed() > POP_DEADLINE {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the thread, waits for it (at most a BRPOP's second), and takes in the rest of what
    /// it popped.
    pub fn finish(&mut self) -> Result<(), BoxError> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let result = match self.thread.take() {
            Some(t) => t.join().map_err(|_| "the consumer panicked")?,
            None => Ok(()),
        };
        self.popped.extend(self.incoming.try_iter());
        Ok(result?)
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
