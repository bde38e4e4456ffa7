//! Everything that talks to Redis: the connection, the enqueue algorithm and its layouts (wire
//! format, keys, scripts), the relay's sink, and the writability probe.
//!
//! - [`connection`]: self-reconnecting connections with bounded waits.
//! - [`enqueue`]: [`enqueue::Enqueuer`] runs a layout's script for a batch of jobs; per-job
//!   [`enqueue::Outcome`]s.
//! - [`layout`]: the layouts: `jobrelay`, `conveyor`, `sidekiq`, `celery`, `bullmq`, `rq`.
//! - [`url`]: the Redis URL forms (`redis://`, `rediss://`, `redis+sentinel://`,
//!   `redis+cluster://`) and the endpoint each names.
//! - [`redis_sink`]: [`redis_sink::RedisSink`], the claim loop's [`crate::relay::JobSink`] for Redis.
//! - [`safety`]: whether Redis takes writes as the relay needs: as a master, without evicting keys,
//!   with the replicas asked for (used by [`crate::relay::probe`] and the sink).

pub mod connection;
pub mod enqueue;
pub mod layout;
pub mod redis_sink;
pub mod safety;
pub mod url;
