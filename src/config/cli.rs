//! The command line (clap). Every option is taken as text here and parsed by
//! [`super::Config::resolve`], so flag, environment and file values fail with the same messages.

use clap::{Args, Parser, Subcommand};

/// The help heading of the options every command reads: where the jobs are.
const CONNECTION: &str = "Connection options";
/// The help heading of the options only the relay (the daemon, `--sweep`, `check`) reads.
/// Headed apart so that a subcommand's help shows its own options first.
const RELAY: &str = "Relay options";

/// jobrelay: relays committed `pending_jobs` rows from Postgres to Redis: at least once, and
/// exactly once per uuid while its dedup marker lives (--dedup-ttl).
///
/// Precedence: flag > environment > --config TOML file > default. An empty environment
/// variable counts as unset. Durations use humantime syntax (500ms, 30s, 5m, 1h30m; 0).
#[derive(Debug, Parser)]
#[command(name = "jobrelay", version, about, long_about = None)]
pub struct Cli {
    /// What to do; without a subcommand, run the relay daemon (or `--sweep`).
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Options shared by the daemon and every subcommand.
    #[command(flatten)]
    pub flags: Flags,
}

/// The options of docs/cli.md, as given on the command line.
#[derive(Debug, Default, Args)]
pub struct Flags {
    /// Postgres URL [env: DATABASE_URL] (default: postgres://postgres@127.0.0.1:5432/postgres)
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "URL")]
    pub database_url: Option<String>,
    /// File holding the Postgres URL (Kubernetes Secret volume) [env: DATABASE_URL_FILE]
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "PATH")]
    pub database_url_file: Option<String>,
    /// Postgres URL for the notification listener (LISTEN needs a session of its own: give a
    /// direct URL when --database-url is PgBouncer in transaction mode)
    /// [env: JOBRELAY_LISTEN_URL] [default: --database-url]
    #[arg(long, global = true, help_heading = RELAY, value_name = "URL")]
    pub listen_url: Option<String>,
    /// File holding the listener's Postgres URL [env: JOBRELAY_LISTEN_URL_FILE]
    #[arg(long, global = true, help_heading = RELAY, value_name = "PATH")]
    pub listen_url_file: Option<String>,
    /// Most Postgres connections the relay opens: workers, probe, listener, wake-up lock;
    /// below workers+3 the wake-up lock is off, below workers+2 the listener too (poll only)
    /// [env: JOBRELAY_PG_MAX_CONNECTIONS] [default: workers+3]
    #[arg(long, global = true, help_heading = RELAY, value_name = "N")]
    pub pg_max_connections: Option<String>,
    /// Claim with named statements, planned once per connection: auto (once the listener
    /// proved its connection, as the pool's, a session of its own), true (a direct connection,
    /// a session pooler, PgBouncer 1.21+ with max_prepared_statements) or false; alone it means
    /// true [env: JOBRELAY_PREPARED_STATEMENTS] [default: auto]
    #[arg(
        long,
        global = true,
        help_heading = RELAY,
        value_name = "WHEN",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub prepared_statements: Option<String>,
    /// Redis URL, redis:// or rediss:// (TLS) [env: REDIS_URL] [default: redis://127.0.0.1:6379]
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "URL")]
    pub redis_url: Option<String>,
    /// File holding the Redis URL [env: REDIS_URL_FILE]
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "PATH")]
    pub redis_url_file: Option<String>,
    /// PEM file of the CA(s) that signed the Redis server's certificate, for rediss:// with a
    /// private CA (default: the bundled web PKI roots) [env: JOBRELAY_REDIS_CA_FILE]
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "PATH")]
    pub redis_ca_file: Option<String>,
    /// Relay even when Redis's maxmemory-policy evicts keys (queued jobs and dedup markers may
    /// vanish); alone it means true, or `=false` [env: JOBRELAY_REDIS_ALLOW_EVICTION]
    /// [default: false]
    #[arg(
        long,
        global = true,
        help_heading = RELAY,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub redis_allow_eviction: Option<String>,
    /// Replicas that must acknowledge each push (WAIT) before its rows are deleted; 0 = none
    /// [env: JOBRELAY_REDIS_WAIT_REPLICAS] [default: 0]
    #[arg(long, global = true, help_heading = RELAY, value_name = "N")]
    pub redis_wait_replicas: Option<String>,
    /// How long WAIT waits for --redis-wait-replicas; less than --push-timeout
    /// [env: JOBRELAY_REDIS_WAIT_TIMEOUT] [default: 1s]
    #[arg(long, global = true, help_heading = RELAY, value_name = "DURATION")]
    pub redis_wait_timeout: Option<String>,
    /// Outbox table, `name` or `schema.name` [env: JOBRELAY_TABLE] [default: pending_jobs]
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "TABLE")]
    pub table: Option<String>,
    /// Prefix of every Redis key (the help names each layout's default)
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "PREFIX",
          help = namespace_help())]
    pub namespace: Option<String>,
    /// Redis layout (the help lists `LayoutKind::ALL`)
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "LAYOUT",
          help = layout_help())]
    pub layout: Option<String>,
    /// Rows claimed per transaction [env: JOBRELAY_BATCH_SIZE] [default: 1000]
    #[arg(long, global = true, help_heading = RELAY, value_name = "N")]
    pub batch_size: Option<String>,
    /// Bytes claimed per transaction and sent per Redis script call (payloads, headers and
    /// options plus ~200 bytes a row; a single row may exceed it) [env: JOBRELAY_BATCH_MAX_BYTES]
    /// [default: 8MiB]
    #[arg(long, global = true, help_heading = RELAY, value_name = "BYTES")]
    pub batch_max_bytes: Option<String>,
    /// Largest job relayed (marshalled); a larger one is dead-lettered (by the claim, never
    /// fetched whole, when its payload alone is larger) [env: JOBRELAY_MAX_JOB_SIZE]
    /// [default: 8MiB]
    #[arg(long, global = true, help_heading = RELAY, value_name = "BYTES")]
    pub max_job_size: Option<String>,
    /// Concurrent claim loops [env: JOBRELAY_WORKERS] [default: 2]
    #[arg(long, global = true, help_heading = RELAY, value_name = "N")]
    pub workers: Option<String>,
    /// Batches in flight at once across every relay on the table (fleet-wide claim slots)
    /// [env: JOBRELAY_CLAIM_SLOTS] [default: 2]
    #[arg(long, global = true, help_heading = RELAY, value_name = "N")]
    pub claim_slots: Option<String>,
    /// Idle wait when no notification arrives [env: JOBRELAY_POLL_INTERVAL] [default: 1s]
    #[arg(long, global = true, help_heading = RELAY, value_name = "DURATION")]
    pub poll_interval: Option<String>,
    /// Failed attempts before a row is dead-lettered [env: JOBRELAY_MAX_ATTEMPTS] [default: 25]
    #[arg(long, global = true, help_heading = RELAY, value_name = "N")]
    pub max_attempts: Option<String>,
    /// Lifetime of a relayed uuid's dedup marker (the help names each layout's)
    #[arg(long, global = true, help_heading = RELAY, value_name = "DURATION",
          help = dedup_ttl_help())]
    pub dedup_ttl: Option<String>,
    /// Metrics and probes listener, or `off` [env: JOBRELAY_HTTP_ADDR] [default: 0.0.0.0:9898]
    #[arg(long, global = true, help_heading = RELAY, value_name = "ADDR")]
    pub http_addr: Option<String>,
    /// Time to finish the batch in hand on SIGTERM [env: JOBRELAY_SHUTDOWN_TIMEOUT] [default: 25s]
    #[arg(long, global = true, help_heading = RELAY, value_name = "DURATION")]
    pub shutdown_timeout: Option<String>,
    /// Bound on one Redis push while rows are locked [env: JOBRELAY_PUSH_TIMEOUT] [default: 5s]
    #[arg(long, global = true, help_heading = RELAY, value_name = "DURATION")]
    pub push_timeout: Option<String>,
    /// Watch the Redis side (waiting jobs, oldest job, consumers) of every queue fed this
    /// recently, or `off` [env: JOBRELAY_CONSUMER_WINDOW] [default: 5m]
    #[arg(long, global = true, help_heading = RELAY, value_name = "DURATION")]
    pub consumer_window: Option<String>,
    /// `text` or `json` [env: JOBRELAY_LOG_FORMAT] [default: text on a terminal, else json]
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// TOML file with any of these options, keys spelled like the flags with `_` [env: JOBRELAY_CONFIG]
    #[arg(long, global = true, help_heading = CONNECTION, value_name = "PATH")]
    pub config: Option<String>,
    /// Relay every claimable row older than --older-than, print a report, exit
    #[arg(long)]
    pub sweep: bool,
    /// With --sweep: only rows created at least this long ago [default: 60s]
    #[arg(long, value_name = "DURATION", requires = "sweep")]
    pub older_than: Option<String>,
}

/// Subcommands. None of them listens on a port.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the embedded migrations (and create --table if it is not pending_jobs), then exit.
    Migrate,
    /// Print the backlog: pending rows, oldest pending age, dead letters, per queue.
    Status {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Inspect, requeue or purge dead-lettered rows.
    #[command(subcommand)]
    DeadLetter(DeadLetterCommand),
    /// Validate the configuration, reach Postgres and Redis, report the schema version and
    /// warn of a queue whose jobs wait with no consumer.
    Check {
        /// Exit 1 on a warning too (a queue without consumer, a held xmin horizon).
        #[arg(long)]
        strict: bool,
    },
    /// Show jobs waiting in Redis, decoded, without moving them: a queue's, the scheduled
    /// ones, or those held for a job (--redis-url, --namespace and --layout say where).
    #[command(group(clap::ArgGroup::new("jobs").required(true).multiple(true)))]
    Peek(PeekArgs),
}

/// `jobrelay peek ...`: which jobs, how many, in which form.
#[derive(Debug, Args)]
pub struct PeekArgs {
    /// The jobs of this queue, the next to run first; with --scheduled, only this queue's
    /// scheduled jobs.
    #[arg(long, value_name = "QUEUE", group = "jobs")]
    pub queue: Option<String>,
    /// The jobs waiting for their run_at, the earliest due first.
    #[arg(long, group = "jobs")]
    pub scheduled: bool,
    /// The children held until this job's handler returns (layouts with flows).
    #[arg(long, value_name = "UUID", group = "jobs", conflicts_with_all = ["queue", "scheduled", "on_complete_of"])]
    pub children_of: Option<uuid::Uuid>,
    /// The jobs held until this job completes (its onComplete list; layouts with flows).
    #[arg(long, value_name = "UUID", group = "jobs", conflicts_with_all = ["queue", "scheduled"])]
    pub on_complete_of: Option<uuid::Uuid>,
    /// At most this many jobs.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub limit: u32,
    /// One JSON object per line instead of a block of lines per job.
    #[arg(long)]
    pub json: bool,
}

/// `jobrelay dead-letter ...`
#[derive(Debug, Subcommand)]
pub enum DeadLetterCommand {
    /// List dead-lettered rows, oldest first.
    List {
        /// Only rows of this queue.
        #[arg(long)]
        queue: Option<String>,
        /// At most this many rows.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Move rows back into the outbox table with attempts reset.
    Requeue(Selection),
    /// Delete rows for good.
    Purge(Selection),
}

/// Which dead-lettered rows a command touches: exactly one of --id, --queue, --all.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct Selection {
    /// These ids (repeat the flag or separate with commas).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub id: Vec<i64>,
    /// Every row of this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Every row.
    #[arg(long)]
    pub all: bool,
}

/// `--namespace`'s help: empty by default, or the layout's own (`Layout::default_namespace`).
fn namespace_help() -> String {
    let own: Vec<String> = crate::broker::layout::LayoutKind::ALL
        .iter()
        .map(|k| (k, k.layout().default_namespace()))
        .filter(|(_, ns)| !ns.is_empty())
        .map(|(k, ns)| format!("`{ns}` with --layout {k}"))
        .collect();
    let mut default = "empty".to_owned();
    if !own.is_empty() {
        default = format!("{default}; {}", own.join(", "));
    }
    format!(
        "Prefix of every Redis key, e.g. `app1:` [env: JOBRELAY_NAMESPACE] [default: {default}]"
    )
}

/// `--layout`'s help, listing the layouts as `LayoutKind::ALL` has them.
/// `--dedup-ttl`'s help: each layout's marker (docs/layouts/markers.md), a key of its own or
/// a member of a set that lives up to twice the TTL.
fn dedup_ttl_help() -> String {
    let (mut keys, mut sets) = (Vec::new(), Vec::new());
    for k in crate::broker::layout::LayoutKind::ALL {
        let layout = k.layout();
        let infix = layout.marker_infix();
        if layout.marks_in_sets() {
            sets.push(format!("<ns>{infix}marks:<ttl>:<interval>:<digit> ({k})"));
        } else {
            keys.push(format!("<ns>{infix}<uuid> ({k})"));
        }
    }
    format!(
        "Lifetime of a relayed uuid's dedup marker: the key {}; a member of the set {}, kept \
         at least this long and less than twice; 0 = never expires [env: JOBRELAY_DEDUP_TTL] \
         [default: 15m]",
        keys.join(", "),
        sets.join(", ")
    )
}

fn layout_help() -> String {
    let names: Vec<&str> = crate::broker::layout::LayoutKind::ALL
        .iter()
        .map(|k| k.as_str())
        .collect();
    format!(
        "Redis layout, the runner whose workers read the jobs: {} \
         [env: JOBRELAY_LAYOUT] [default: jobrelay]",
        names.join(", ")
    )
}
