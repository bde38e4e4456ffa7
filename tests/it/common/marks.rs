//! Where a job's dedup marker is, in any layout: a key of its own, or a member of the layout's
//! marker sets (`Layout::marks_in_sets`, docs/layouts/markers.md#markers-as-sets).

use jobrelay::LayoutKind;
use redis::aio::MultiplexedConnection;
use uuid::Uuid;

/// The prefix of `layout`'s marker sets under the namespace `ns`: `<ns><infix>marks:`.
fn sets_prefix(ns: &str, layout: LayoutKind) -> String {
    format!("{ns}{}marks:", layout.layout().marker_infix())
}

/// The keys of `layout`'s marker sets under `ns` (none for a layout with a key per marker).
pub async fn mark_sets(
    con: &mut MultiplexedConnection,
    ns: &str,
    layout: LayoutKind,
) -> Vec<String> {
    if !layout.layout().marks_in_sets() {
        return Vec::new();
    }
    super::scan(con, &format!("{}*", sets_prefix(ns, layout))).await
}

/// The keys that may hold `uuid`'s marker: its key, or the sets of its shard (its first digit).
async fn places(
    con: &mut MultiplexedConnection,
    ns: &str,
    layout: LayoutKind,
    uuid: Uuid,
) -> Vec<String> {
    if !layout.layout().marks_in_sets() {
        return vec![layout.layout().marker_key(ns, uuid)];
    }
    let u = uuid.hyphenated().to_string();
    let shard = &u[..1];
    let mut sets = mark_sets(con, ns, layout).await;
    sets.retain(|k| k.ends_with(&format!(":{shard}")));
    sets
}

/// Runs on each place of `uuid`'s marker `set_cmd` (a set) or `key_cmd` (a key) with its
/// uuid or alone, and adds up the integer answers.
async fn on_places(
    con: &mut MultiplexedConnection,
    ns: &str,
    layout: LayoutKind,
    uuid: Uuid,
    set_cmd: &str,
    key_cmd: &str,
) -> i64 {
    let in_sets = layout.layout().marks_in_sets();
    let mut n = 0;
    for key in places(con, ns, layout, uuid).await {
        let mut cmd = redis::cmd(if in_sets { set_cmd } else { key_cmd });
        cmd.arg(&key);
        if in_sets {
            cmd.arg(uuid.hyphenated().to_string());
        }
        let answer: i64 = cmd.query_async(con).await.unwrap();
        n += answer;
    }
    n
}

/// Whether `uuid` is marked under `ns` in `layout` (SISMEMBER, or STRLEN: a marker is never
/// empty; nothing that would count as an EXISTS in the figures some tests rest on).
pub async fn is_marked(
    con: &mut MultiplexedConnection,
    ns: &str,
    layout: LayoutKind,
    uuid: Uuid,
) -> bool {
    on_places(con, ns, layout, uuid, "SISMEMBER", "STRLEN").await > 0
}

/// Removes `uuid`'s marker under `ns` in `layout` (as if it had expired); how many places held
/// it.
pub async fn unmark(
    con: &mut MultiplexedConnection,
    ns: &str,
    layout: LayoutKind,
    uuid: Uuid,
) -> i64 {
    on_places(con, ns, layout, uuid, "SREM", "DEL").await
}

/// After calls of an enqueuer with `ttl`: every one of `uuids` is marked, and `layout`'s marker
/// sets under `ns` are `<ns><infix>marks:<ttl>:<interval>:<digit>` of one interval (or of two in a
/// row, should the calls have straddled their border), each expiring three intervals after its
/// own began. Their keys, sorted.
pub async fn assert_marks(
    con: &mut MultiplexedConnection,
    ns: &str,
    layout: LayoutKind,
    uuids: &[Uuid],
    ttl: std::time::Duration,
) -> Vec<String> {
    for u in uuids {
        assert!(is_marked(con, ns, layout, *u).await, "{u} not marked");
    }
    let ttl = ttl.as_millis() as i64;
    let prefix = format!("{}{ttl}:", sets_prefix(ns, layout));
    let mut sets = mark_sets(con, ns, layout).await;
    sets.sort();
    let mut intervals = Vec::new();
    for set in &sets {
        let (iv, digit) = set[prefix.len()..]
            .split_once(':')
            .expect("<interval>:<digit>");
        assert!(
            digit.len() == 1 && digit.chars().all(|c| c.is_ascii_hexdigit()),
            "{set}"
        );
        let iv: i64 = iv.parse().expect("an interval");
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(set)
            .query_async(con)
            .await
            .unwrap();
        assert_eq!(at, (iv + 3) * ttl, "{set}");
        intervals.push(iv);
    }
    intervals.sort();
    intervals.dedup();
    assert!(
        intervals.len() <= 2 && intervals.windows(2).all(|w| w[1] == w[0] + 1),
        "{sets:?}"
    );
    sets
}
