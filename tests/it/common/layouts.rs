//! The Redis layouts as the layout-independent relay suites see them: how the relay is told to
//! write one, where a queue's jobs and a job's marker are, and how to read a job's uuid back
//! from what the layout wrote. A suite written against [`TestLayout`] runs once per layout
//! through [`per_layout!`].

use std::time::Duration;

use jobrelay::{Enqueuer, LayoutKind};
use uuid::Uuid;

use super::Namespace;

/// A layout under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestLayout(pub LayoutKind);

impl TestLayout {
    /// The relay's arguments that select it.
    pub fn args(self) -> [&'static str; 2] {
        ["--layout", self.0.as_str()]
    }

    fn enqueuer(self, ns: &Namespace) -> Enqueuer {
        Enqueuer::new(ns.prefix.clone(), Duration::ZERO).with_layout(self.0)
    }

    /// The key of `queue`'s list, namespace included.
    pub fn queue_key(self, ns: &Namespace, queue: &str) -> String {
        self.enqueuer(ns).queue_key(queue)
    }

    /// Whether `uuid` is marked (its dedup marker exists) under `ns`.
    pub async fn is_marked(self, ns: &Namespace, uuid: &str) -> bool {
        let uuid = Uuid::parse_str(uuid).expect("a uuid");
        let mut con = ns.con().await;
        super::marks::is_marked(&mut con, &ns.prefix, self.0, uuid).await
    }

    /// How many keys besides the markers `queues` queues of jobs make.
    pub fn keys_of_queues(self, queues: i64) -> i64 {
        match self.0 {
            LayoutKind::Jobrelay | LayoutKind::Conveyor | LayoutKind::Celery => queues,
            // And the set `queues` that names them.
            LayoutKind::Sidekiq => queues + 1,
            // The wait list, and the `id` counter, `meta` hash, `events` stream and `marker`.
            LayoutKind::Bullmq => 5 * queues,
            // And the set `rq:queues` that names them.
            LayoutKind::Rq => queues + 1,
        }
    }

    /// How many keys one job makes besides its queue's and the marker sets
    /// ([`super::marks::mark_sets`]): its marker, or in the bullmq and rq layouts (whose markers
    /// are members of sets) its job hash.
    pub fn keys_per_job(self) -> i64 {
        1
    }

    /// A job option the layout refuses: one it does not know (in the sidekiq layout, which
    /// passes unknown ones through as a client middleware would, one Sidekiq sets itself).
    pub fn refused_option(self) -> &'static str {
        match self.0 {
            LayoutKind::Sidekiq => "jid",
            _ => "no_such_option",
        }
    }

    /// The length of `queue`'s list.
    pub async fn llen(self, ns: &Namespace, queue: &str) -> usize {
        let mut con = ns.con().await;
        redis::cmd("LLEN")
            .arg(self.queue_key(ns, queue))
            .query_async(&mut con)
            .await
            .unwrap()
    }

    /// The uuid (hyphenated, lower case) of a job as the layout wrote it into a queue.
    pub fn uuid_of(self, bytes: &[u8]) -> String {
        match self.0 {
            // Both messages carry the uuid as field 1.
            LayoutKind::Jobrelay | LayoutKind::Conveyor => super::decode(bytes).uuid,
            // The job's `jid`: the uuid's 32 hex digits.
            LayoutKind::Sidekiq => {
                let job: serde_json::Value = serde_json::from_slice(bytes).expect("a Sidekiq job");
                let jid = job["jid"].as_str().expect("a jid");
                Uuid::parse_str(jid)
                    .expect("a uuid's hex digits")
                    .to_string()
            }
            // kombu's envelope: the task id is the header `id`.
            LayoutKind::Celery => {
                let msg: serde_json::Value = serde_json::from_slice(bytes).expect("a message");
                msg["headers"]["id"].as_str().expect("a task id").to_owned()
            }
            // The wait list holds job ids: the uuids.
            LayoutKind::Bullmq => String::from_utf8(bytes.to_vec()).expect("a job id"),
            // RQ's queue holds job ids: the uuid itself.
            LayoutKind::Rq => std::str::from_utf8(bytes).expect("a job id").to_owned(),
        }
    }
}

/// Defines, for a suite `async fn name(pool: PgPool, layout: TestLayout)`, a module `name` with
/// one `#[sqlx::test]` per layout (`name::jobrelay`, ...): every layout of `LayoutKind::ALL`
/// (a new layout's variant fails to compile in [`TestLayout`]'s matches until it has its arm
/// here too).
macro_rules! per_layout {
    ($suite:ident) => {
        mod $suite {
            use super::*;

            #[sqlx::test]
            async fn jobrelay(pool: PgPool) {
                super::$suite(pool, TestLayout(jobrelay::LayoutKind::Jobrelay)).await
            }

            #[sqlx::test]
            async fn conveyor(pool: PgPool) {
                super::$suite(pool, TestLayout(jobrelay::LayoutKind::Conveyor)).await
            }

            #[sqlx::test]
            async fn sidekiq(pool: PgPool) {
                super::$suite(pool, TestLayout(jobrelay::LayoutKind::Sidekiq)).await
            }

            #[sqlx::test]
            async fn celery(pool: PgPool) {
                super::$suite(pool, TestLayout(jobrelay::LayoutKind::Celery)).await
            }

            #[sqlx::test]
            async fn bullmq(pool: PgPool) {
                super::$suite(pool, TestLayout(jobrelay::LayoutKind::Bullmq)).await
            }

            #[sqlx::test]
            async fn rq(pool: PgPool) {
                super::$suite(pool, TestLayout(jobrelay::LayoutKind::Rq)).await
            }
        }
    };
}
pub(crate) use per_layout;

/// A layout whose runner has no Redis Cluster support (`celery`, `rq`) refuses a Cluster URL at
/// start: one line naming --layout, Cluster and the layout, exit 2, before anything connects.
pub async fn assert_a_cluster_url_is_refused(layout: LayoutKind) {
    let nowhere = format!("redis+cluster://127.0.0.1:{}", super::free_port());
    let (code, out, err) = super::run_relay(
        &["check"],
        &[
            ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/x"),
            ("REDIS_URL", &nowhere),
            ("JOBRELAY_NAMESPACE", "{jobs}:"),
            ("JOBRELAY_LAYOUT", layout.as_str()),
        ],
    )
    .await;
    assert_eq!(code, 2, "{out}{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains("--layout")
            && lines[0].contains("Cluster")
            && lines[0].contains(layout.as_str()),
        "{err}"
    );
}
