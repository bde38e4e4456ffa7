//! The reference consumer of docs/consumer.md (examples/consumer/jobrelay_consumer.py), run as
//! a child process against jobs the relay wrote in the jobrelay layout: every job runs once, a
//! scheduled one not before its run_at, children after their parent's handler, heirs after
//! the whole flow; a dead consumer's popped jobs run again; children and heirs relayed after
//! their job completed are released.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use sqlx::PgPool;
use uuid::Uuid;

use crate::common::batch::{insert_job, insert_many, NewRow};
use crate::common::consumer::{ConsumerProcess, Run};
use crate::common::*;

/// Relays every pending row once (`jobrelay --sweep`) into `ns`; the sweep's report.
async fn sweep(pool: &PgPool, ns: &Namespace) -> String {
    let db = database_url_of(pool).await;
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", ns.url.as_str()),
        ("JOBRELAY_NAMESPACE", ns.prefix.as_str()),
    ];
    let (code, out, err) = run_relay(&["--sweep", "--older-than", "0s"], &env).await;
    assert_eq!(code, 0, "{out}\n{err}");
    out
}

/// A row in queue `work` with `parent` or `pred`; its uuid.
async fn row(pool: &PgPool, parent: Option<Uuid>, pred: Option<Uuid>) -> Uuid {
    let r = NewRow {
        queue: Some("work"),
        parent,
        pred,
        ..NewRow::default()
    };
    insert_job(pool, &r).await.uuid
}

/// The one run of each uuid; panics on a uuid that ran twice.
fn once_each(runs: &[Run]) -> BTreeMap<String, Run> {
    let mut by_uuid = BTreeMap::new();
    for r in runs {
        assert!(
            by_uuid.insert(r.uuid.clone(), r.clone()).is_none(),
            "{} ran twice",
            r.uuid
        );
    }
    by_uuid
}

/// The keys the consumer leaves once all is done: the relay's markers `jobs:<uuid>` and its
/// own `jobs:<uuid>:done`; no queue, scheduled job, processing list, held or active list.
async fn only_markers_left(ns: &Namespace) {
    for key in ns.keys().await {
        let parts: Vec<&str> = key.split(':').collect();
        let done = parts.len() == 3 && parts[2] == "done";
        assert!(
            parts[0] == "jobs" && (parts.len() == 2 || done),
            "left behind: {key}"
        );
    }
}

#[sqlx::test]
async fn the_reference_consumer_runs_every_job_once_in_flow_order(pool: PgPool) {
    let ns = Namespace::new();
    let mut all = insert_many(&pool, 20, "work").await;
    let due = Utc::now() + chrono::Duration::seconds(3);
    let later = NewRow {
        queue: Some("work"),
        run_at: Some(due),
        ..NewRow::default()
    };
    let later = insert_job(&pool, &later).await.uuid;
    // A parent, three children (the first with a child of its own), and an heir.
    let p = row(&pool, None, None).await;
    let c: Vec<Uuid> = [
        row(&pool, Some(p), None).await,
        row(&pool, Some(p), None).await,
        row(&pool, Some(p), None).await,
    ]
    .into();
    let g = row(&pool, Some(c[0]), None).await;
    let h = row(&pool, None, Some(p)).await;
    all.extend([later, p, c[0], c[1], c[2], g, h].map(|u| u.to_string()));
    let report = sweep(&pool, &ns).await;
    assert!(
        report.contains("claimed=27 queued=21 scheduled=1 children=4 on_complete=1"),
        "{report}"
    );

    let mut consumer =
        ConsumerProcess::start(&ns, "c1", &["work"], &["--housekeeping-every", "0.1"]);
    consumer.wait_runs(27, Duration::from_secs(60)).await;
    assert_eq!(consumer.stop().await, 0, "{}", consumer.logs());
    let runs = once_each(&consumer.runs());
    assert_eq!(
        runs.keys().cloned().collect::<Vec<_>>(),
        all.into_iter().collect::<Vec<_>>()
    );
    let run = |u: &Uuid| &runs[&u.to_string()];
    for r in runs.values() {
        assert_eq!(r.queue, "work", "{r:?}");
        let plain = r.job_type == "Bulk" && r.payload.starts_with("job-");
        assert!(
            plain || r.job_type == "SendInvoice",
            "the job as written: {r:?}"
        );
    }
    assert!(c.iter().all(|u| run(u).parent_uuid == p.to_string()));
    assert_eq!(run(&h).predecessor_uuid, p.to_string());

    let scheduled = run(&later);
    assert!(
        scheduled.started >= scheduled.run_at.unwrap(),
        "{scheduled:?}"
    );
    assert!(scheduled.started >= due.timestamp_micros() as f64 / 1e6);
    for child in &c {
        assert!(
            run(child).started >= run(&p).finished,
            "child before its parent"
        );
    }
    assert!(
        run(&g).started >= run(&c[0]).finished,
        "grandchild before its parent"
    );
    let flow_end = [p, c[0], c[1], c[2], g]
        .iter()
        .map(|u| run(u).finished)
        .fold(0.0, f64::max);
    assert!(run(&h).started >= flow_end, "heir before the flow ended");
    only_markers_left(&ns).await;
}

/// Jobs a consumer popped and never finished run again: another consumer recovers the list
/// of one whose heartbeat expired, and a consumer restarted under its id recovers its own.
#[sqlx::test]
async fn popped_jobs_of_a_dead_or_restarted_consumer_run_again(pool: PgPool) {
    let ns = Namespace::new();
    let all = insert_many(&pool, 3, "work").await;
    sweep(&pool, &ns).await;
    let mut con = ns.con().await;
    for (from, id) in [("work", "ghost"), ("work", "c1")] {
        let _: Vec<u8> = redis::cmd("LMOVE")
            .arg(ns.key(&format!("queue:{from}")))
            .arg(ns.key(&format!("processing:{id}")))
            .arg("RIGHT")
            .arg("LEFT")
            .query_async(&mut con)
            .await
            .unwrap();
        let _: () = redis::cmd("SADD")
            .arg(ns.key("consumers"))
            .arg(id)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    // c1's heartbeat still lives (it was just killed); the ghost's expired long ago.
    let _: () = redis::cmd("SET")
        .arg(ns.key("consumers:c1"))
        .arg(1)
        .arg("EX")
        .arg(60)
        .query_async(&mut con)
        .await
        .unwrap();

    let mut consumer =
        ConsumerProcess::start(&ns, "c1", &["work"], &["--housekeeping-every", "0.1"]);
    consumer.wait_runs(3, Duration::from_secs(30)).await;
    assert_eq!(consumer.stop().await, 0, "{}", consumer.logs());
    let runs = once_each(&consumer.runs());
    assert_eq!(
        runs.into_keys().collect::<std::collections::BTreeSet<_>>(),
        all
    );
    only_markers_left(&ns).await;
}

/// A child and an heir relayed after their job completed land in its lists, which no close
/// will drain again: the consumer's look for late jobs releases them.
#[sqlx::test]
async fn children_and_heirs_relayed_after_their_job_completed_still_run(pool: PgPool) {
    let ns = Namespace::new();
    let p = row(&pool, None, None).await;
    sweep(&pool, &ns).await;
    let args = ["--housekeeping-every", "0.1", "--late-every", "0.2"];
    let mut consumer = ConsumerProcess::start(&ns, "c1", &["work"], &args);
    consumer.wait_runs(1, Duration::from_secs(30)).await;
    let (c, h) = (
        row(&pool, Some(p), None).await,
        row(&pool, None, Some(p)).await,
    );
    let report = sweep(&pool, &ns).await;
    assert!(report.contains("children=1 on_complete=1"), "{report}");
    let runs = consumer.wait_runs(3, Duration::from_secs(30)).await;
    assert_eq!(consumer.stop().await, 0, "{}", consumer.logs());
    let runs = once_each(&runs);
    for u in [p, c, h] {
        assert!(runs.contains_key(&u.to_string()), "{u} did not run");
    }
    only_markers_left(&ns).await;
}

/// The Lua script docs/consumer.md shows is the one the reference consumer runs.
#[test]
fn the_guides_move_script_is_the_consumers() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(root.join("docs/consumer.md")).unwrap();
    let consumer = std::fs::read_to_string(crate::common::consumer::script()).unwrap();
    let between = |text: &str, start: &str, end: &str| -> Vec<String> {
        let from = text.find(start).unwrap_or_else(|| panic!("no {start:?}")) + start.len();
        let to = from + text[from..].find(end).unwrap();
        text[from..to]
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("--"))
            .map(str::to_owned)
            .collect()
    };
    let shown = between(&guide, "```lua\n", "```");
    assert!(shown.len() > 10, "{shown:?}");
    assert_eq!(shown, between(&consumer, "MOVE = \"\"\"\n", "\"\"\""));
}
