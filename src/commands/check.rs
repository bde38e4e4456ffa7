//! `jobrelay check`: the configuration, then the same probe as the daemon's `/readyz`.

use std::process::ExitCode;

use anyhow::Result;
use jobrelay::admin::held_keys::{self, HELD_KEYS_NAMED};
use jobrelay::admin::status;
use jobrelay::broker::redis_probe::RedisProbe;
use jobrelay::config::{Config, STATEMENT_TIMEOUT};
use jobrelay::telemetry::redact;
use jobrelay::{db, relay};

/// Validates the configuration, reaches Postgres and Redis, reports the schema version, warns
/// of ordering keys held by a dead-lettered row (docs/runbook.md#jobrelayorderingkeyheld) and
/// of each queue whose jobs wait with no consumer (docs/redis-side.md); exit 1 when something
/// is not ready, naming why, or, with `strict`, on a warning.
pub(super) async fn run(config: &Config, strict: bool) -> Result<ExitCode> {
    println!("config: ok ({})", describe(config));
    let mut ok = true;
    let mut warned = false;
    let pool = db::lazy_pool(config.pg_options()?, 1);
    // The same checks as the daemon's /readyz.
    let redis = RedisProbe::new(
        config.redis_client()?,
        &config.namespace,
        config.push_timeout,
    )
    .with_safety(config.redis_safety());
    // The probe first, bounded by --push-timeout as the daemon's is: a server that does not
    // answer is reported after that long, as its line says (the schema's version, asked
    // first, waited 15 s more for it: issue 34, `timed out after 5s` after 20 s).
    let mut probe =
        relay::probe::Probe::new(pool.clone(), &config.table, config.push_timeout, redis);
    let found = probe.run_once().await;
    let version = match &found.postgres {
        Ok(_) => tokio::time::timeout(STATEMENT_TIMEOUT, db::schema_version(&pool))
            .await
            .map(|v| v.map_err(|e| e.to_string())),
        // Not asked: the probe's error is the line.
        Err(_) => Ok(Ok(None)),
    };
    match (&found.postgres, version) {
        (Ok(present), Ok(Ok(version))) => {
            let latest = db::latest_known_version();
            let schema = match version {
                Some(v) if v < latest => {
                    format!("schema version {v} (behind this binary: run `jobrelay migrate`)")
                }
                Some(v) => format!("schema version {v}"),
                None => "no schema: run `jobrelay migrate`".to_owned(),
            };
            if version.is_none() || !present {
                ok = false;
            }
            if *present {
                match probe.room_for_rows().await {
                    Err(e) => {
                        ok = false;
                        println!("postgres: {}", line(&e));
                    }
                    Ok(_) => println!("postgres: ok, {schema}"),
                }
                if let Ok(Some(h)) = probe.horizon().await {
                    if h.seconds.unwrap_or(0.0) >= relay::probe::HORIZON_WARN_AFTER.as_secs_f64() {
                        warned = true;
                        println!(
                            "postgres: warning: a {} (pid {}) open for {:.0}s holds the xmin horizon ({})",
                            h.kind,
                            h.pid.map_or("none".to_owned(), |p| p.to_string()),
                            h.seconds.unwrap_or(0.0),
                            h.detail
                        );
                    }
                }
                warned |= held(&pool, config).await;
            } else {
                println!(
                    "postgres: reachable, {schema}; table missing: {} does not exist (run `jobrelay migrate`)",
                    config.table
                );
            }
        }
        (Err(e), _) => {
            ok = false;
            println!("postgres: {}", line(e));
        }
        (Ok(_), Ok(Err(e))) => {
            ok = false;
            println!(
                "postgres: {}",
                jobrelay::error::without_dependency(&redact::scrub(&e))
            );
        }
        (Ok(_), Err(_)) => {
            ok = false;
            println!(
                "postgres: timeout: no answer within {}",
                humantime::format_duration(STATEMENT_TIMEOUT)
            );
        }
    }
    match &found.endpoint {
        Ok(said) => println!("redis: ok ({said})"),
        Err(e) => {
            ok = false;
            println!("redis: {}", line(e));
        }
    }
    if found.endpoint.is_ok() {
        warned |= consumers(config, &pool, found.postgres.as_ref().is_ok_and(|p| *p)).await;
    }
    if strict && warned {
        ok = false;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Prints a warning when ordering keys are held by a dead-lettered row (naming the first, its
/// dead head and the fix), or when they cannot be read; whether it did.
async fn held(pool: &sqlx::PgPool, config: &Config) -> bool {
    let read = held_keys::held_keys(pool, &config.table, HELD_KEYS_NAMED);
    match tokio::time::timeout(STATEMENT_TIMEOUT, read).await {
        Ok(Ok(held)) => match held.warning() {
            Some(w) => {
                println!("postgres: warning: {w}");
                true
            }
            None => false,
        },
        Ok(Err(e)) => {
            println!(
                "postgres: warning: cannot read the held ordering keys: {}",
                line(&e)
            );
            true
        }
        Err(_) => {
            println!(
                "postgres: warning: cannot read the held ordering keys: timeout: no answer within {}",
                humantime::format_duration(STATEMENT_TIMEOUT)
            );
            true
        }
    }
}

/// Prints a warning for each queue whose jobs wait with no consumer recorded (the outbox's
/// queues, when the table is there, and the runner's registered ones); whether it did.
async fn consumers(config: &Config, pool: &sqlx::PgPool, table_present: bool) -> bool {
    let known = if table_present {
        tokio::time::timeout(STATEMENT_TIMEOUT, status::status(pool, &config.table))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|s| s.queues.into_keys().collect())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let look = match super::redis_side::look(config, known).await {
        Ok(look) => look,
        Err(e) => {
            println!(
                "redis: warning: cannot read the queues' Redis side: {}",
                redact::scrub(&format!("{e:#}"))
            );
            return true;
        }
    };
    let mut warned = false;
    for line in look.starving() {
        warned = true;
        println!("redis: warning: {line}");
    }
    warned
}

/// `<reason>: <error>`, the error without the dependency's name that the line begins with
/// (`postgres: too many connections: sorry, too many clients already`).
fn line(e: &jobrelay::Error) -> String {
    format!(
        "{}: {}",
        e.reason(),
        jobrelay::error::without_dependency(&redact::scrub(&e.to_string()))
    )
}

fn describe(c: &Config) -> String {
    format!(
        "database {}, redis {}, table {}, namespace {:?}, layout {}, batch size {}, workers {}",
        c.database_url, c.redis_url, c.table, c.namespace, c.layout, c.batch_size, c.workers
    )
}
