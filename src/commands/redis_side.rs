//! The queues' Redis side for `status` and `check` (docs/redis-side.md): the queues the
//! outbox names and those the runner registered, each with its waiting jobs, oldest job and
//! consumers, and for a queue without consumer the namespaces where its consumers are seen.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use jobrelay::admin::queues::{self, RedisSide, Starving, MAX_QUEUES};
use jobrelay::config::Config;

/// What `status` and `check` show of the Redis side.
pub(super) struct Look {
    /// The queues read (at most [`MAX_QUEUES`]).
    pub side: RedisSide,
    /// Queues left out beyond [`MAX_QUEUES`].
    pub left_out: usize,
    /// For each queue without consumer, the namespaces where its consumers are seen.
    pub elsewhere: BTreeMap<String, Vec<String>>,
}

impl Look {
    /// The line of each queue whose jobs wait with no consumer, naming where its consumers
    /// are seen.
    pub(super) fn starving(&self) -> impl Iterator<Item = Starving<'_>> {
        self.side
            .queues
            .iter()
            .filter(|q| q.starving())
            .map(|q| Starving {
                side: q,
                layout: self.side.layout,
                namespace: &self.side.namespace,
                elsewhere: &self.elsewhere[&q.queue],
            })
    }
}

/// Reads the Redis side of `known` (the outbox's queues) and of the runner's registered
/// queues, each step bounded by `--push-timeout`.
pub(super) async fn look(config: &Config, known: Vec<String>) -> Result<Look> {
    let bound = config.push_timeout;
    let timed_out = || {
        anyhow::anyhow!(
            "timeout: no answer within {}",
            humantime::format_duration(bound)
        )
    };
    let client = config.redis_client()?;
    let mut con = jobrelay::broker::connection::connect(&client, bound)
        .await
        .with_context(|| format!("connecting to redis at {}", config.redis_url))?;
    let (layout, ns) = (config.layout, config.namespace.as_str());
    let window = config
        .consumer_window
        .unwrap_or(jobrelay::defaults::DEFAULT_CONSUMER_WINDOW);
    let all = tokio::time::timeout(
        bound,
        queues::queues_to_look_at(&mut con, layout, ns, known, window),
    )
    .await
    .map_err(|_| timed_out())??;
    let left_out = all.len().saturating_sub(MAX_QUEUES);
    let side = tokio::time::timeout(bound, queues::look(&mut con, layout, ns, &all))
        .await
        .map_err(|_| timed_out())??;
    let mut elsewhere = BTreeMap::new();
    for q in side.queues.iter().filter(|q| q.starving()) {
        let found = tokio::time::timeout(bound, queues::elsewhere(&mut con, layout, ns, &q.queue))
            .await
            .map_err(|_| timed_out())??;
        elsewhere.insert(q.queue.clone(), found);
    }
    Ok(Look {
        side,
        left_out,
        elsewhere,
    })
}
