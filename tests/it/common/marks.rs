//! Where a job's dedup marker is, in any layout: a key of its own, or a member of the layout's
//! marker sets (`Layout::marks_in_sets`, docs/layouts.md#markers-as-sets).

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

/// Whether `uuid` is marked under `ns` in `layout` (GET or SISMEMBER: nothing that would count
/// as an EXISTS in the figures some tests rest on).
pub async fn is_marked(
    con: &mut MultiplexedConnection,
    ns: &str,
    layout: LayoutKind,
    uuid: Uuid,
) -> bool {
    let u = uuid.hyphenated().to_string();
    for key in places(con, ns, layout, uuid).await {
        let found: bool = if layout.layout().marks_in_sets() {
            redis::cmd("SISMEMBER")
                .arg(&key)
                .arg(&u)
                .query_async(con)
                .await
                .unwrap()
        } else {
            let v: Option<Vec<u8>> = redis::cmd("GET").arg(&key).query_async(con).await.unwrap();
            v.is_some()
        };
        if found {
            return true;
        }
    }
    false
}

/// Removes `uuid`'s marker under `ns` in `layout` (as if it had expired); how many places held it.
pub async fn unmark(
    con: &mut MultiplexedConnection,
    ns: &str,
    layout: LayoutKind,
    uuid: Uuid,
) -> i64 {
    let u = uuid.hyphenated().to_string();
    let mut n = 0;
    for key in places(con, ns, layout, uuid).await {
        let removed: i64 = if layout.layout().marks_in_sets() {
            redis::cmd("SREM")
                .arg(&key)
                .arg(&u)
                .query_async(con)
                .await
                .unwrap()
        } else {
            redis::cmd("DEL").arg(&key).query_async(con).await.unwrap()
        };
        n += removed;
    }
    n
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
