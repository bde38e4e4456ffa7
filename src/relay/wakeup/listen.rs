//! Wakes idle workers when the insert trigger notifies.
//!
//! The listener only bumps a generation counter in a `watch` channel; a worker notes the
//! generation before it claims and, once idle, returns at once if it moved meanwhile. So a
//! notification that arrives while every worker is busy is never lost.
//!
//! LISTEN needs a session of its own: notifications reach the server connection that ran
//! LISTEN, which PgBouncer in transaction mode hands to other clients after each transaction,
//! and those clients then receive the relay's notifications (sqlx fails a query that meets
//! one). So before it listens, the listener makes sure its connection is a session: it reads
//! its server process id; the relay's pool opens a transaction, reads its own and the last
//! statement of the listener's server process (`pg_stat_activity`); the listener reads its id
//! again. Through a transaction pooler, the pool's transaction is given the server connection
//! the listener just left (PgBouncer reuses the last one freed), or another client ran a
//! statement on it meanwhile, or the listener's second read lands elsewhere; a session keeps
//! its server process to itself. Five rounds, and one sign is enough to give up: the listener
//! says so once and stops, and idle workers poll every `--poll-interval` (give
//! `--listen-url` a direct URL).
//!
//! Then it proves that notifications reach it: it listens on a check channel of its own,
//! sends itself a NOTIFY through the relay's pool, and expects it within [`CHECK_TIMEOUT`]
//! (when its session answers but the notification never comes, `--listen-url` and
//! `--database-url` name different databases: it says so once and stops). It repeats the check
//! every [`CHECK_INTERVAL`] while listening, so a session that stopped answering without being
//! closed (a primary gone silent, no RST) is noticed and replaced.
//!
//! Where it connects as the relay's pool does (no `--listen-url`), its proof of a session, or
//! of none, is the pool's too: it tells the relay's [`PreparedClaims`], which names claims once
//! proved (`--prepared-statements=auto`, [`crate::relay::prepared`]).

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{Executor as _, PgPool};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::relay::prepared::PreparedClaims;
use crate::telemetry::redact;

/// How often a listening session checks that its own NOTIFY still reaches it.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// How long a check waits for its notification (and bound on every other step).
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The notification listener of one relay.
#[derive(Debug, Clone)]
pub(crate) struct Listener {
    /// Where it connects (`--listen-url`, else `--database-url`).
    pub opts: PgConnectOptions,
    /// The relay's pool, which sends the check notifications (as producers' inserts do).
    pub notifier: PgPool,
    /// The outbox table's channel.
    pub channel: String,
    /// Bumped on every notification and after every (re)connect.
    pub wake: watch::Sender<u64>,
    /// Told whether its connection is a session of its own, where it connects as the pool
    /// does: then its proof is the pool's (`--prepared-statements=auto`).
    pub claims: Option<Arc<PreparedClaims>>,
}

/// Why a listening session ended.
enum Ended {
    Shutdown,
    /// Lost or never established; try again after a pause.
    Lost(String),
    /// Notifications do not reach a session that answers: give up (workers poll).
    Unreachable,
    /// The listener's connection is no session of its own (a transaction pooler): give up
    /// before LISTEN, which would send notifications to other clients.
    Pooled,
}

impl Listener {
    fn bump(&self) {
        self.wake.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Listens until `shutdown` (or until notifications prove unreachable), reconnecting
    /// with backoff; bumps `wake` on every notification and after every reconnect
    /// (notifications sent while disconnected are lost, so workers should look).
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        // Channel names are identifiers of at most 63 bytes: this one needs no quoting.
        let check = format!("jobrelay_check_{}", uuid::Uuid::new_v4().simple());
        let mut backoff = Backoff::transient();
        let mut failing = false;
        while !shutdown.is_cancelled() {
            match self
                .session(&check, &shutdown, &mut failing, &mut backoff)
                .await
            {
                Ended::Shutdown => return,
                Ended::Pooled => {
                    tracing::warn!(
                        channel = self.channel,
                        "no notification listener: its connection is not a session of its own \
                         (PgBouncer in transaction mode?), and LISTEN there would send \
                         notifications to other clients; idle workers poll every \
                         --poll-interval; give --listen-url a direct Postgres URL \
                         (docs/cli.md#postgres-connections)"
                    );
                    return;
                }
                Ended::Unreachable => {
                    tracing::warn!(
                        channel = self.channel,
                        "no notification listener: notifications sent through --database-url \
                         do not reach the listener's session (do --listen-url and \
                         --database-url name different databases?); idle workers poll every \
                         --poll-interval"
                    );
                    return;
                }
                Ended::Lost(why) => {
                    if !failing {
                        tracing::warn!(error = %redact::scrub(&why), channel = self.channel,
                            "notification listener lost its session; reconnecting");
                        failing = true;
                    } else {
                        tracing::debug!(error = %redact::scrub(&why),
                            "notification listener cannot listen");
                    }
                    // Whatever was committed meanwhile went unannounced.
                    self.bump();
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }

    /// One session: connect, prove that notifications arrive, LISTEN, then relay
    /// notifications and check every [`CHECK_INTERVAL`].
    async fn session(
        &self,
        check: &str,
        shutdown: &CancellationToken,
        failing: &mut bool,
        backoff: &mut Backoff,
    ) -> Ended {
        // A pool of one connection per session: a session given up on a frozen socket leaves
        // its connection to a task that sqlx spawns to UNLISTEN it, which may wait until the
        // kernel gives up; the next session does not wait for that slot.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(CHECK_TIMEOUT)
            .connect_lazy_with(self.opts.clone());
        // While Postgres refuses the relay's connections, the listener's attempt is one of the
        // relay's per backoff step (its pool alone would retry a refusal every few ms).
        let gate = crate::db::ConnectGate::of(&self.opts);
        tokio::select! {
            _ = shutdown.cancelled() => return Ended::Shutdown,
            admitted = gate.admit(&self.opts, CHECK_TIMEOUT) => {
                if let Err(e) = admitted {
                    return Ended::Lost(e.to_string());
                }
            }
        }
        let mut listener = match step(shutdown, PgListener::connect_with(&pool)).await {
            Step::Done(l) => l,
            Step::Failed(e) => {
                gate.fail_next();
                return Ended::Lost(e);
            }
            Step::Shutdown => return Ended::Shutdown,
        };
        // On a lost connection, end this session (and start a verified new one).
        listener.eager_reconnect(false);
        for _ in 0..5 {
            match self.is_session(&mut listener, check, shutdown).await {
                Step::Done(true) => {}
                Step::Done(false) => {
                    if let Some(claims) = &self.claims {
                        claims.no_sessions();
                    }
                    return Ended::Pooled;
                }
                Step::Failed(e) => return Ended::Lost(e),
                Step::Shutdown => return Ended::Shutdown,
            }
        }
        if let Some(claims) = &self.claims {
            claims.sessions_proved();
        }
        match step(shutdown, listener.listen(check)).await {
            Step::Done(()) => {}
            Step::Failed(e) => return Ended::Lost(e),
            Step::Shutdown => return Ended::Shutdown,
        }
        match self.check(&mut listener, check, shutdown).await {
            Checked::Heard => {}
            Checked::NotSent => return Ended::Lost("cannot send the check notification".into()),
            Checked::Ended(ended) => return ended,
            Checked::Silent => {
                // Silent: a dead session, or one that notifications do not reach?
                return match step(shutdown, listener.execute("SELECT 1")).await {
                    Step::Done(_) => Ended::Unreachable,
                    Step::Failed(e) => Ended::Lost(e),
                    Step::Shutdown => Ended::Shutdown,
                };
            }
        }
        match step(shutdown, listener.listen(&self.channel)).await {
            Step::Done(()) => {}
            Step::Failed(e) => return Ended::Lost(e),
            Step::Shutdown => return Ended::Shutdown,
        }
        if *failing {
            tracing::info!(
                channel = self.channel,
                "notification listener listening again"
            );
            *failing = false;
        }
        backoff.reset();
        self.bump();
        loop {
            let next_check = Instant::now() + CHECK_INTERVAL;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return Ended::Shutdown,
                    _ = tokio::time::sleep_until(next_check) => break,
                    n = listener.try_recv() => match n {
                        Ok(Some(n)) if n.channel() == check => {}
                        Ok(Some(_)) => self.bump(),
                        Ok(None) => return Ended::Lost("connection closed".into()),
                        Err(e) => return Ended::Lost(e.to_string()),
                    },
                }
            }
            match self.check(&mut listener, check, shutdown).await {
                // Postgres is down for the pool too: the workers report it; the session is
                // tested again at the next check.
                Checked::Heard | Checked::NotSent => {}
                Checked::Ended(ended) => return ended,
                Checked::Silent => {
                    return Ended::Lost(format!(
                        "the listener's own check notification did not arrive within {}",
                        humantime::format_duration(CHECK_TIMEOUT)
                    ))
                }
            }
        }
    }

    /// Whether `listener` looks like a session of its own (see the module's documentation):
    /// it keeps its server process while the relay's pool runs a transaction, which another
    /// server process serves, and nobody else ran a statement on it in between. Simple
    /// queries only.
    async fn is_session(
        &self,
        listener: &mut PgListener,
        check: &str,
        shutdown: &CancellationToken,
    ) -> Step<bool> {
        use sqlx::Row as _;
        // Its text is what pg_stat_activity shows for the listener's server process.
        let mine = format!("SELECT pg_backend_pid() /* jobrelay listener: {check} */");
        let first = match step(shutdown, backend_pid(listener, &mine)).await {
            Step::Done(p) => p,
            other => return other.map(|_| false),
        };
        let mut tx = match step(shutdown, self.notifier.begin()).await {
            Step::Done(tx) => tx,
            other => return other.map(|_| false),
        };
        let look = format!(
            "SELECT pg_backend_pid(), (SELECT query FROM pg_stat_activity WHERE pid = {first})"
        );
        let (other, last) = match step(shutdown, async {
            let row = tx.fetch_one(look.as_str()).await?;
            Ok((
                row.try_get::<i32, _>(0)?,
                row.try_get::<Option<String>, _>(1)?,
            ))
        })
        .await
        {
            Step::Done(found) => found,
            o => return o.map(|_| false),
        };
        let again = match step(shutdown, backend_pid(listener, &mine)).await {
            Step::Done(p) => p,
            o => return o.map(|_| false),
        };
        let _ = step(shutdown, tx.rollback()).await;
        // A role that may not read other sessions' statements sees this instead.
        let used_by_another =
            matches!(&last, Some(q) if *q != mine && q != "<insufficient privilege>");
        Step::Done(other != first && again == first && !used_by_another)
    }

    /// Sends a notification on `check` through the relay's pool and waits for it on
    /// `listener`, bumping `wake` for the channel's notifications meanwhile.
    async fn check(
        &self,
        listener: &mut PgListener,
        check: &str,
        shutdown: &CancellationToken,
    ) -> Checked {
        // The simple query protocol: one message, whatever pooler is in between.
        let notify = format!("NOTIFY {check}");
        match step(shutdown, self.notifier.execute(notify.as_str())).await {
            Step::Done(_) => {}
            Step::Failed(e) => {
                tracing::debug!(error = %redact::scrub(&e), "cannot send the listener's check");
                return Checked::NotSent;
            }
            Step::Shutdown => return Checked::Ended(Ended::Shutdown),
        }
        let deadline = Instant::now() + CHECK_TIMEOUT;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Checked::Ended(Ended::Shutdown),
                _ = tokio::time::sleep_until(deadline) => return Checked::Silent,
                n = listener.try_recv() => match n {
                    Ok(Some(n)) if n.channel() == check => return Checked::Heard,
                    Ok(Some(_)) => self.bump(),
                    Ok(None) => return Checked::Ended(Ended::Lost("connection closed".into())),
                    Err(e) => return Checked::Ended(Ended::Lost(e.to_string())),
                },
            }
        }
    }
}

/// What a check found.
enum Checked {
    Heard,
    /// The notification could not be sent (the pool's server is down).
    NotSent,
    /// Sent, never heard within [`CHECK_TIMEOUT`].
    Silent,
    Ended(Ended),
}

enum Step<T> {
    Done(T),
    Failed(String),
    Shutdown,
}

impl<T> Step<T> {
    /// The same step with its value, if any, replaced.
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Step<U> {
        match self {
            Step::Done(v) => Step::Done(f(v)),
            Step::Failed(e) => Step::Failed(e),
            Step::Shutdown => Step::Shutdown,
        }
    }
}

/// `fut` within [`CHECK_TIMEOUT`], unless `shutdown` fires first.
/// The server process behind `listener`, asked with `mine` (a simple query).
async fn backend_pid(listener: &mut PgListener, mine: &str) -> sqlx::Result<i32> {
    use sqlx::Row as _;
    listener.fetch_one(mine).await?.try_get::<i32, _>(0)
}

async fn step<T>(
    shutdown: &CancellationToken,
    fut: impl std::future::Future<Output = sqlx::Result<T>>,
) -> Step<T> {
    tokio::select! {
        _ = shutdown.cancelled() => Step::Shutdown,
        r = tokio::time::timeout(CHECK_TIMEOUT, fut) => match r {
            Ok(Ok(v)) => Step::Done(v),
            Ok(Err(e)) => Step::Failed(crate::error::postgres_message(&e)),
            Err(_) => Step::Failed(format!(
                "no answer within {}",
                humantime::format_duration(CHECK_TIMEOUT)
            )),
        },
    }
}
