//! Dedup markers as members of sets (the bullmq and rq layouts; docs/layouts/markers.md#markers-as-sets),
//! the prelude's functions driven alone on the shared Redis with a clock of the test's choosing:
//! a marker is found for at least one TTL and less than two; a call unlinks the sets of the
//! interval before the previous one; each set expires on its own one interval after it is last
//! read; without a TTL a marker stays; a set key of another type refuses its shard's jobs only.

use crate::common::*;
use uuid::Uuid;

/// The prelude, then a driver: ARGV = prefix, TTL (ms), now (ms), `mark` or `check`, uuids.
/// `mark` checks the uuids and writes their marks (as a call that accepted them); `check` answers
/// per uuid 1 (marked), 0 (not) or the refusal.
const DRIVER: &str = concat!(
    include_str!("../../src/broker/layout/prelude.lua"),
    r#"
open_marks(ARGV[1], ARGV[2], tonumber(ARGV[3]))
local uuids = {}
for i = 5, #ARGV do uuids[#uuids + 1] = ARGV[i] end
if ARGV[4] == 'mark' then
  marked(uuids)
  local accepted = {}
  for _, u in ipairs(uuids) do accepted[u] = true end
  write_marks(accepted)
  return #uuids
end
local found, out = marked(uuids), {}
for i, u in ipairs(uuids) do
  local f = found[u]
  out[i] = (f == true and 1) or f or 0
end
return out
"#
);

const TTL: i64 = 60_000;

/// The namespace, and the start (ms) of an interval 10 TTLs ahead of Redis's clock: the sets'
/// expiry times are then in the future, as in a real call.
async fn setup() -> (Namespace, i64) {
    let ns = Namespace::new();
    let mut con = ns.con().await;
    let (secs, _): (i64, i64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    (ns, (secs * 1000 / TTL + 10) * TTL)
}

async fn call(ns: &Namespace, ttl: i64, now: i64, op: &str, uuids: &[Uuid]) -> redis::Value {
    let mut con = ns.con().await;
    let script = redis::Script::new(DRIVER);
    let mut inv = script.prepare_invoke();
    inv.arg(ns.key("m:")).arg(ttl).arg(now).arg(op);
    for u in uuids {
        inv.arg(u.hyphenated().to_string());
    }
    inv.invoke_async(&mut con).await.unwrap()
}

async fn check(ns: &Namespace, ttl: i64, now: i64, uuids: &[Uuid]) -> Vec<i64> {
    redis::from_redis_value(&call(ns, ttl, now, "check", uuids).await).unwrap()
}

/// Found from its write until the end of the next interval: at least one TTL, less than two.
#[tokio::test]
async fn a_marker_is_found_for_one_ttl_and_less_than_two() {
    let (ns, start) = setup().await;
    let (u, other) = (Uuid::new_v4(), Uuid::new_v4());
    let written = start + TTL / 2;
    call(&ns, TTL, written, "mark", &[u]).await;
    assert_eq!(check(&ns, TTL, written, &[u, other]).await, vec![1, 0]);
    // One TTL after the write, and the last millisecond of the next interval.
    assert_eq!(check(&ns, TTL, written + TTL, &[u]).await, vec![1]);
    assert_eq!(check(&ns, TTL, start + 2 * TTL - 1, &[u]).await, vec![1]);
    assert_eq!(check(&ns, TTL, start + 2 * TTL, &[u]).await, vec![0]);
    let shard = &u.to_string()[..1];
    let set = ns.key(&format!("m:{TTL}:{}:{shard}", start / TTL));
    let mut con = ns.con().await;
    let expire_at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&set)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        expire_at,
        start + 3 * TTL,
        "{set}: one interval after it is last read"
    );
}

/// A call in the interval after next unlinks the sets of the interval it no longer reads.
#[tokio::test]
async fn a_call_two_intervals_on_unlinks_the_stale_sets() {
    let (ns, start) = setup().await;
    let old: Vec<Uuid> = (0..64).map(|_| Uuid::new_v4()).collect();
    call(&ns, TTL, start, "mark", &old).await;
    let iv = start / TTL;
    let keys_of = |keys: &[String], iv: i64| {
        keys.iter()
            .filter(|k| k.starts_with(&format!("m:{TTL}:{iv}:")))
            .count()
    };
    let keys = ns.keys().await;
    assert!(keys_of(&keys, iv) > 8, "{keys:?}");
    // The next interval reads them still: nothing unlinked.
    call(&ns, TTL, start + TTL, "mark", &[Uuid::new_v4()]).await;
    assert_eq!(keys_of(&ns.keys().await, iv), keys_of(&keys, iv));
    let new = Uuid::new_v4();
    call(&ns, TTL, start + 2 * TTL, "mark", &[new]).await;
    let keys = ns.keys().await;
    assert_eq!(keys_of(&keys, iv), 0, "{keys:?}");
    assert_eq!(keys_of(&keys, iv + 1), 1, "{keys:?}");
    assert_eq!(keys_of(&keys, iv + 2), 1, "{keys:?}");
}

/// TTL 0: one set per shard, no expiry, a marker found at any time.
#[tokio::test]
async fn without_a_ttl_a_marker_stays() {
    let (ns, start) = setup().await;
    let u = Uuid::new_v4();
    call(&ns, 0, start, "mark", &[u]).await;
    assert_eq!(check(&ns, 0, start + 1000 * TTL, &[u]).await, vec![1]);
    let set = ns.key(&format!("m:{}", &u.to_string()[..1]));
    let mut con = ns.con().await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&set)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(pttl, -1, "{set}");
}

/// A string where a shard's set belongs refuses that shard's uuids, naming the key; the others
/// are checked as ever.
#[tokio::test]
async fn a_set_key_of_another_type_refuses_its_shards_jobs_only() {
    let (ns, start) = setup().await;
    let (a, b) = loop {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        if a.to_string()[..1] != b.to_string()[..1] {
            break (a, b);
        }
    };
    let bad = ns.key(&format!(
        "m:{TTL}:{}:{}",
        start / TTL - 1,
        &a.to_string()[..1]
    ));
    let mut con = ns.con().await;
    let _: () = redis::cmd("SET")
        .arg(&bad)
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    let answer = call(&ns, TTL, start, "check", &[a, b]).await;
    let answer: Vec<redis::Value> = redis::from_redis_value(&answer).unwrap();
    let refusal: String = redis::from_redis_value(&answer[0]).unwrap();
    assert_eq!(
        refusal,
        format!("WRONGTYPE key {bad} holds a string, not a set")
    );
    assert_eq!(redis::from_redis_value::<i64>(&answer[1]).unwrap(), 0);
}
