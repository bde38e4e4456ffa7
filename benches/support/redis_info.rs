//! Redis's own CPU time, from `INFO`: all of it (`INFO cpu`) and per command (`INFO
//! commandstats`).

use std::collections::HashMap;

/// One section of Redis's `INFO`; `None` when Redis does not answer.
pub async fn info(client: &redis::Client, section: &str) -> Option<String> {
    let mut con = client.get_multiplexed_async_connection().await.ok()?;
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut con)
        .await
        .ok()
}

/// `used_cpu_user + used_cpu_sys` from Redis's `INFO cpu`.
pub async fn cpu_seconds(client: &redis::Client) -> Option<f64> {
    let info = info(client, "cpu").await?;
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
    };
    Some(field("used_cpu_user")? + field("used_cpu_sys")?)
}

/// Microseconds spent in each command so far, from Redis's `INFO commandstats`.
pub async fn command_usec(client: &redis::Client) -> Option<HashMap<String, f64>> {
    let info = info(client, "commandstats").await?;
    // cmdstat_set:calls=3,usec=12,usec_per_call=4.00,...
    Some(
        info.lines()
            .filter_map(|l| {
                let (name, fields) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let usec = fields
                    .split(',')
                    .find_map(|f| f.strip_prefix("usec="))?
                    .parse()
                    .ok()?;
                Some((name.to_owned(), usec))
            })
            .collect(),
    )
}
