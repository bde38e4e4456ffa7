//! Everything that talks to Redis: the connection, the enqueue algorithm and its layouts (wire
//! format, keys, scripts), the relay's sink, and the writability probe.
//!
//! - [`connection`]: self-reconnecting connections with bounded waits.
//! - [`enqueue`]: [`enqueue::Enqueuer`] runs a layout's script for a batch of jobs; per-job
//!   [`enqueue::Outcome`]s.
//! - [`layout`]: the layouts, one module per runner ([`layout::LayoutKind::ALL`]).
//! - [`url`]: the Redis URL forms (`redis://`, `rediss://`, `redis+sentinel://`,
//!   `redis+cluster://`) and the endpoint each names.
//! - [`redis_sink`]: [`redis_sink::RedisSink`], the relay's [`crate::sink::JobSink`] for Redis.
//! - [`redis_probe`]: [`redis_probe::RedisProbe`], the relay's [`crate::sink::SinkProbe`] for Redis.
//! - [`repair`]: the layout's housekeeping task (conveyor's late children and heirs).
//! - [`safety`]: whether Redis takes writes as the relay needs: as a master, without evicting keys,
//!   with the replicas asked for (used by the sink and the probe).

pub mod connection;
pub mod enqueue;
pub mod fed_queues;
pub mod layout;
pub mod redis_probe;
#[cfg(feature = "daemon")]
pub mod redis_side;
pub mod redis_sink;
pub mod repair;
pub mod safety;
pub mod url;
