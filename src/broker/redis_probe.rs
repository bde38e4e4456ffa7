//! [`RedisProbe`]: whether Redis takes the relay's writes, for the relay's probe (`/readyz`,
//! `jobrelay check`): a write (`SET <ns>jobrelay:probe ... PX`), `ROLE` = master (a denied
//! `ROLE` cannot tell), a `maxmemory-policy` that does not evict (unless
//! `--redis-allow-eviction`), and with `--redis-wait-replicas` a `WAIT` for the replicas
//! ([`super::safety`]). A `PING` is not enough: a Redis at `maxmemory` (`OOM`) or a read-only
//! replica answers it while it refuses every push.

use std::time::Duration;

use crate::broker::connection::{self, RedisConnection, RedisEndpoint};
use crate::broker::safety::{self, Eviction, RedisSafety};
use crate::error::{Dependency, Error, Reason, Result};
use crate::sink::SinkProbe;

/// The Redis check, with the connection it keeps between rounds (a clone starts without one).
#[derive(Clone)]
pub struct RedisProbe {
    redis: RedisEndpoint,
    con: Option<RedisConnection>,
    probe_key: String,
    timeout: Duration,
    safety: RedisSafety,
}

impl RedisProbe {
    /// A probe of Redis through `redis`, writing its key under `namespace`, bounded by
    /// `timeout` (plus `WAIT`'s own timeout when it waits for replicas).
    pub fn new(redis: impl Into<RedisEndpoint>, namespace: &str, timeout: Duration) -> Self {
        RedisProbe {
            redis: redis.into(),
            con: None,
            probe_key: format!("{namespace}jobrelay:probe"),
            timeout,
            safety: RedisSafety::default(),
        }
    }

    /// The same probe, checking Redis against `safety` (`--redis-allow-eviction`,
    /// `--redis-wait-replicas`); the default refuses an evicting policy and waits for no
    /// replica.
    pub fn with_safety(mut self, safety: RedisSafety) -> Self {
        self.safety = safety;
        self
    }

    /// Whether Redis took the write as a master, and what it says of its `maxmemory-policy`.
    async fn eviction(&mut self) -> Result<Eviction> {
        let timeout = self.timeout;
        let timed_out = || Error::Timeout {
            dependency: Dependency::Redis,
            what: "redis probe",
            after: timeout,
        };
        // WAIT answers by its own timeout: the round (and each answer) may take that much longer.
        let bound = if self.safety.wait_replicas > 0 {
            timeout + self.safety.wait_timeout
        } else {
            timeout
        };
        // Connected lazily (and kept): the probe runs from the start, Redis up or not.
        if self.con.is_none() {
            let con = tokio::time::timeout(timeout, connection::connect(&self.redis, bound))
                .await
                .map_err(|_| timed_out())??;
            self.con = Some(con);
        }
        let con = self.con.as_mut().expect("connected above");
        let found =
            tokio::time::timeout(bound, safety::writable(con, &self.probe_key, &self.safety))
                .await
                .map_err(|_| timed_out())?;
        if matches!(&found, Err(e) if e.reason() == Reason::ReadOnly) {
            // A replica (the primary moved, or the name now points elsewhere): the next round
            // connects anew, as the workers do.
            con.reconnect();
        }
        found
    }

    /// What `jobrelay check` says of a Redis that took the write: its policy, and the
    /// replicas it waited for.
    fn describe(&self, eviction: &Eviction) -> String {
        let mut notes = vec![eviction.describe()];
        if matches!(eviction, Eviction::Evicts(_)) {
            notes[0].push_str(", accepted by --redis-allow-eviction");
        }
        if self.safety.wait_replicas > 0 {
            notes.push(format!(
                "{} replicas acknowledged within {}",
                self.safety.wait_replicas,
                humantime::format_duration(self.safety.wait_timeout)
            ));
        }
        notes.join("; ")
    }
}

impl SinkProbe for RedisProbe {
    async fn writable(&mut self) -> Result<String> {
        let eviction = self.eviction().await?;
        Ok(self.describe(&eviction))
    }
}
