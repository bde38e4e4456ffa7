//! The benchmark programs (`benches/`, `cargo bench --bench <name>`) run with tiny sizes so
//! that they cannot rot. Not timed tests: they check that every stage ran, delivered everything
//! exactly once, and reported its figures (not whether they meet the targets), and that what
//! they created is gone.
//!
//! - `relay`: drain, stages, naive comparison, latency and the notify trigger's cost;
//! - `fleet`: both configurations and the idle-fleet stage; the relays are this build's debug
//!   binary, handed over as `JOBRELAY_BIN` like any other setting;
//! - `horizon`: both phases and the simulated hour;
//! - `producer_insert`: the producer's insert rates;
//! - `wait`: pushes with and without `WAIT 1`, on a private primary and replica;
//! - `sessions`: the drain, stream and fleet phases, on a private Postgres and Redis.

mod fleet;
mod horizon;
mod producer_insert;
mod relay;
mod sessions;
mod wait;

/// Whether the database `db` exists on the server of `database_url`.
async fn database_exists(database_url: &str, db: &str) -> bool {
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(database_url)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(db)
        .fetch_one(&mut admin)
        .await
        .unwrap()
}

/// The server the benchmarks create their databases next to: `DATABASE_URL`, or the local one.
fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into())
}
