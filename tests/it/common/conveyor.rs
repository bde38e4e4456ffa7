//! A conveyor consumer in Rust, written to follow jpoz/conveyor's `storage/*.go` (layout 3:
//! `add.go`, `pop.go`, `close.go`, `scheduled.go`) one step at a time. Each Redis command is a
//! separate round trip, in conveyor's order, with no Lua and no MULTI, so that the tests
//! exercise jobrelay's `--layout conveyor` against the same interleavings a real conveyor worker
//! produces.
//!
//! The key prefix `p` is a raw string: conveyor's namespace `conv` is the prefix `conv:`.
//! Two things are left out on purpose. They are bookkeeping only; no step of the algorithm
//! reads them back:
//! - the stats (`queues:active` check-ins on pop, `hist:*` counters on close);
//! - the uncoordinated scheduled promotion of *every* worker. One promoter runs per
//!   [`Workers`] group, because two of conveyor's promoters that read the same member in the
//!   same second both enqueue it (conveyor §5). That double run would be conveyor's fault, not
//!   the relay's.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jobrelay::proto::wire;
use prost::Message;
use redis::aio::MultiplexedConnection;
use redis::FromRedisValue;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long one BRPOP blocks (conveyor: 2 s; shorter here so that workers stop sooner).
const POP_TIMEOUT: Duration = Duration::from_secs(1);

/// What conveyor's storage calls return instead of success.
#[derive(Debug)]
pub enum ConveyorError {
    /// `ErrNoJob` from CloseJob: `job`'s parent record `<p>job:<parent>` is gone (the "late
    /// child" failure, conveyor §8). The child's record and running-set entry leak.
    NoJob {
        job: String,
        parent: String,
    },
    /// `ErrNoQueue` / `ErrNoType` from marshalJob.
    Invalid(&'static str),
    /// `ErrFatalError`: bytes that are not a `wire.Job`.
    Decode(prost::DecodeError),
    Redis(redis::RedisError),
}

impl fmt::Display for ConveyorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConveyorError::NoJob { job, parent } => {
                write!(f, "NoJob: closing {job}, its parent {parent} has no record")
            }
            ConveyorError::Invalid(what) => write!(f, "invalid job: {what}"),
            ConveyorError::Decode(e) => write!(f, "invalid job payload: {e}"),
            ConveyorError::Redis(e) => write!(f, "redis: {e}"),
        }
    }
}

impl From<redis::RedisError> for ConveyorError {
    fn from(e: redis::RedisError) -> Self {
        ConveyorError::Redis(e)
    }
}

impl From<prost::DecodeError> for ConveyorError {
    fn from(e: prost::DecodeError) -> Self {
        ConveyorError::Decode(e)
    }
}

type Result<T> = std::result::Result<T, ConveyorError>;
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Seconds since the epoch, whole (Go's `time.Now().Unix()`).
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// `job.RunAt.AsTime().After(time.Now())`.
fn in_future(t: &prost_types::Timestamp) -> bool {
    let at = i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128;
    at > now
}

/// conveyor's `RedisHandler` on one connection (BRPOP blocks it: one per worker).
#[derive(Clone)]
pub struct Conveyor {
    pub prefix: String,
    con: MultiplexedConnection,
}

impl Conveyor {
    pub async fn connect(url: &str, prefix: &str) -> Conveyor {
        let con = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("redis reachable");
        Conveyor {
            prefix: prefix.to_owned(),
            con,
        }
    }

    pub fn queue_key(&self, queue: &str) -> String {
        format!("{}queue:{queue}", self.prefix)
    }
    pub fn scheduled_key(&self) -> String {
        format!("{}scheduled", self.prefix)
    }
    pub fn job_key(&self, uuid: &str) -> String {
        format!("{}job:{uuid}", self.prefix)
    }
    pub fn children_key(&self, uuid: &str) -> String {
        format!("{}job:{uuid}:children", self.prefix)
    }
    pub fn active_children_key(&self, uuid: &str) -> String {
        format!("{}job:{uuid}:active", self.prefix)
    }
    pub fn on_complete_key(&self, uuid: &str) -> String {
        format!("{}job:{uuid}:onComplete", self.prefix)
    }
    pub fn jobs_active_key(&self) -> String {
        format!("{}jobs:active", self.prefix)
    }
    pub fn worker_key(&self, worker: &str) -> String {
        format!("{}worker:active:{worker}", self.prefix)
    }

    /// One command, one round trip.
    async fn q<T: FromRedisValue>(&self, cmd: &mut redis::Cmd) -> Result<T> {
        let mut con = self.con.clone();
        Ok(cmd.query_async(&mut con).await?)
    }

    /// `AddJob` is `add(job, false)`; close and promotion pass `dead_parent` (add.go).
    pub async fn add(&self, job: &wire::Job, dead_parent: bool) -> Result<()> {
        let mut job = job.clone();
        if job.uuid.is_empty() {
            job.uuid = uuid::Uuid::new_v4().to_string();
        }
        // marshalJob
        if job.queue.is_empty() {
            return Err(ConveyorError::Invalid("no queue"));
        }
        if job.r#type.is_empty() {
            return Err(ConveyorError::Invalid("no type"));
        }
        let bytes = job.encode_to_vec();
        if !job.parent_uuid.is_empty() && !dead_parent {
            let key = self.children_key(&job.parent_uuid);
            return self.q(redis::cmd("LPUSH").arg(key).arg(bytes)).await;
        } else if !job.predecessor_uuid.is_empty() && !dead_parent {
            let key = self.on_complete_key(&job.predecessor_uuid);
            return self.q(redis::cmd("LPUSH").arg(key).arg(bytes)).await;
        } else if let Some(run_at) = job.run_at.as_ref().filter(|t| in_future(t)) {
            let score = run_at.seconds as f64;
            let key = self.scheduled_key();
            return self
                .q(redis::cmd("ZADD").arg(key).arg(score).arg(bytes))
                .await;
        }
        if !job.parent_uuid.is_empty() {
            let key = self.active_children_key(&job.parent_uuid);
            self.q::<()>(redis::cmd("SADD").arg(key).arg(&job.uuid))
                .await?;
        }
        self.q(redis::cmd("LPUSH")
            .arg(self.queue_key(&job.queue))
            .arg(bytes))
            .await
    }

    /// `Pop(ctx, worker, queues...)` (pop.go): the job and the bytes popped, None on timeout.
    pub async fn pop(
        &self,
        worker: &str,
        queues: &[String],
        timeout: Duration,
    ) -> Result<Option<(wire::Job, Vec<u8>)>> {
        let keys: Vec<String> = queues.iter().map(|q| self.queue_key(q)).collect();
        let popped: Option<(String, Vec<u8>)> = self
            .q(redis::cmd("BRPOP").arg(keys).arg(timeout.as_secs_f64()))
            .await?;
        let Some((_, bytes)) = popped else {
            return Ok(None);
        };
        let job = wire::Job::decode(bytes.as_slice())?;
        self.q::<()>(redis::cmd("SET").arg(self.job_key(&job.uuid)).arg(&bytes))
            .await?;
        self.q::<()>(
            redis::cmd("SADD")
                .arg(self.worker_key(worker))
                .arg(&job.uuid),
        )
        .await?;
        self.q::<()>(
            redis::cmd("SADD")
                .arg(self.jobs_active_key())
                .arg(&job.uuid),
        )
        .await?;
        Ok(Some((job, bytes)))
    }

    /// `CloseJob(ctx, worker, job)` (close.go): true when the job and all its ancestors closed.
    pub fn close<'a>(&'a self, worker: &'a str, job: &'a wire::Job) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let uuid = job.uuid.as_str();
            self.q::<()>(redis::cmd("SREM").arg(self.worker_key(worker)).arg(uuid))
                .await?;
            // Promote the children, oldest first.
            let mut had_children = false;
            while let Some(raw) = self
                .q::<Option<Vec<u8>>>(redis::cmd("RPOP").arg(self.children_key(uuid)))
                .await?
            {
                let child = wire::Job::decode(raw.as_slice())?;
                self.add(&child, true).await?;
                had_children = true;
            }
            if had_children {
                return Ok(false);
            }
            let running: i64 = self
                .q(redis::cmd("SCARD").arg(self.active_children_key(uuid)))
                .await?;
            if running > 0 {
                return Ok(false);
            }
            // Release the heirs.
            while let Some(raw) = self
                .q::<Option<Vec<u8>>>(redis::cmd("RPOP").arg(self.on_complete_key(uuid)))
                .await?
            {
                let heir = wire::Job::decode(raw.as_slice())?;
                self.add(&heir, true).await?;
            }
            let parent_closed = if job.parent_uuid.is_empty() {
                true
            } else {
                let parent = job.parent_uuid.as_str();
                self.q::<()>(
                    redis::cmd("SREM")
                        .arg(self.active_children_key(parent))
                        .arg(uuid),
                )
                .await?;
                let raw: Option<Vec<u8>> =
                    self.q(redis::cmd("GET").arg(self.job_key(parent))).await?;
                let Some(raw) = raw else {
                    return Err(ConveyorError::NoJob {
                        job: uuid.to_owned(),
                        parent: parent.to_owned(),
                    });
                };
                let parent_job = wire::Job::decode(raw.as_slice())?;
                self.close(worker, &parent_job).await?
            };
            self.q::<()>(redis::cmd("SREM").arg(self.jobs_active_key()).arg(uuid))
                .await?;
            self.q::<()>(redis::cmd("DEL").arg(self.job_key(uuid)))
                .await?;
            Ok(parent_closed)
        })
    }

    /// `PopScheduledJobs` (scheduled.go): moves the due members; how many it read.
    pub async fn promote_scheduled(&self) -> Result<usize> {
        let members: Vec<Vec<u8>> = self
            .q(redis::cmd("ZRANGEBYSCORE")
                .arg(self.scheduled_key())
                .arg("-inf")
                .arg(unix_now()))
            .await?;
        for m in &members {
            self.q::<i64>(redis::cmd("ZREM").arg(self.scheduled_key()).arg(m))
                .await?;
            let job = wire::Job::decode(m.as_slice())?;
            self.add(&job, false).await?;
        }
        Ok(members.len())
    }
}

/// The handler: called with the job between pop and close (conveyor's `callJob`).
pub type Hook = Arc<dyn Fn(wire::Job) -> BoxFuture<'static, ()> + Send + Sync>;

/// One job a worker popped.
#[derive(Debug, Clone)]
pub struct Run {
    pub job: wire::Job,
    /// The bytes BRPOP returned.
    pub bytes: Vec<u8>,
    /// Which worker ran it (read only through `Debug`, in failure messages).
    #[allow(dead_code)]
    pub worker: String,
    pub popped: Instant,
    pub popped_at: SystemTime,
    /// The handler returned (close starts).
    pub handled: Option<Instant>,
    /// CloseJob returned.
    pub closed: Option<Instant>,
}

/// What the workers did: every run in pop order, and every error.
#[derive(Debug, Default)]
pub struct Log {
    runs: Mutex<Vec<Run>>,
    errors: Mutex<Vec<String>>,
}

impl Log {
    fn error(&self, e: String) {
        self.errors.lock().unwrap().push(e);
    }
}

/// `n` conveyor workers on `queues` (each with its own connection and worker id) plus one
/// scheduled-job promoter ticking every second, until [`Workers::stop`] or drop.
pub struct Workers {
    pub log: Arc<Log>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Workers {
    pub async fn start(
        url: &str,
        prefix: &str,
        queues: &[&str],
        n: usize,
        hook: Option<Hook>,
    ) -> Workers {
        let log = Arc::new(Log::default());
        let stop = CancellationToken::new();
        let queues: Vec<String> = queues.iter().map(|q| q.to_string()).collect();
        let mut tasks = Vec::new();
        for _ in 0..n {
            let c = Conveyor::connect(url, prefix).await;
            let (log, stop, queues, hook) =
                (log.clone(), stop.clone(), queues.clone(), hook.clone());
            tasks.push(tokio::spawn(async move {
                let id = uuid::Uuid::new_v4().to_string();
                while !stop.is_cancelled() {
                    work_once(&c, &id, &queues, hook.as_ref(), &log).await;
                }
            }));
        }
        let c = Conveyor::connect(url, prefix).await;
        let (log2, stop2) = (log.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = stop2.cancelled() => return,
                    _ = tick.tick() => {}
                }
                if let Err(e) = c.promote_scheduled().await {
                    log2.error(format!("promote scheduled: {e}"));
                }
            }
        }));
        Workers { log, stop, tasks }
    }

    /// Every run so far, in pop order.
    pub fn runs(&self) -> Vec<Run> {
        self.log.runs.lock().unwrap().clone()
    }

    /// Every error so far (close, pop, promotion).
    pub fn errors(&self) -> Vec<String> {
        self.log.errors.lock().unwrap().clone()
    }

    /// Runs of `uuid`.
    pub fn runs_of(&self, uuid: &str) -> Vec<Run> {
        self.runs()
            .into_iter()
            .filter(|r| r.job.uuid == uuid)
            .collect()
    }

    /// At least `n` runs, every one of them closed (or its close failed).
    pub fn settled(&self, n: usize) -> bool {
        let runs = self.log.runs.lock().unwrap();
        runs.len() >= n && runs.iter().all(|r| r.closed.is_some())
    }

    /// Stops the workers after the job in hand (within about one BRPOP timeout).
    pub async fn stop(mut self) {
        self.stop.cancel();
        for t in self.tasks.drain(..) {
            t.await.expect("conveyor worker did not panic");
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One turn of conveyor's worker loop: Pop, the handler, CloseJob.
async fn work_once(c: &Conveyor, id: &str, queues: &[String], hook: Option<&Hook>, log: &Log) {
    let (job, bytes) = match c.pop(id, queues, POP_TIMEOUT).await {
        Ok(Some(popped)) => popped,
        Ok(None) => return,
        Err(e) => {
            log.error(format!("pop: {e}"));
            // A consumer's backoff after a failed pop (as conveyor's worker does), not a wait.
            super::hold_for(Duration::from_millis(100), "the backoff").await;
            return;
        }
    };
    let i = {
        let mut runs = log.runs.lock().unwrap();
        runs.push(Run {
            job: job.clone(),
            bytes,
            worker: id.to_owned(),
            popped: Instant::now(),
            popped_at: SystemTime::now(),
            handled: None,
            closed: None,
        });
        runs.len() - 1
    };
    if let Some(hook) = hook {
        hook(job.clone()).await;
    }
    log.runs.lock().unwrap()[i].handled = Some(Instant::now());
    let closed = c.close(id, &job).await;
    if let Err(e) = closed {
        log.error(format!("close {}: {e}", job.uuid));
    }
    log.runs.lock().unwrap()[i].closed = Some(Instant::now());
}
