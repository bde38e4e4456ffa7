//! Unit tests of the parent module.
use super::*;

fn later() -> Instant {
    std::thread::sleep(Duration::from_millis(2));
    Instant::now()
}

#[test]
fn reports_about_requests_older_than_the_state_change_are_ignored() {
    let h = Health::default();
    let d = Dependency::Redis;
    let down = Reason::Unreachable;
    h.ok(d);
    assert!(h.is_up(d));
    let sent_before_outage = later();
    h.failed_at(d, later(), down, &"down");
    assert!(!h.is_up(d));
    // A push that got through just before the outage does not end it.
    h.ok_at(d, sent_before_outage);
    assert!(!h.is_up(d));
    let sent_during_outage = later();
    h.ok_at(d, later());
    assert!(h.is_up(d));
    // A push stuck during the outage that fails after the recovery does not begin another.
    h.failed_at(d, sent_during_outage, Reason::Timeout, &"timed out");
    assert!(h.is_up(d));
    h.failed_at(d, later(), down, &"down again");
    assert!(!h.is_up(d));
}

#[test]
fn a_redis_episode_a_push_began_ends_only_with_a_push() {
    let h = Health::default();
    let d = Dependency::Redis;
    let mut woken = h.recoveries();
    h.check_ok_at(d, later());
    h.failed_at(d, later(), Reason::OutOfMemory, &"OOM");
    assert!(!h.is_up(d));
    woken.borrow_and_update();
    // The probe's small write fits under maxmemory while the batches do not.
    h.check_ok_at(d, later());
    assert!(!h.is_up(d), "a check does not end it");
    assert!(woken.has_changed().unwrap(), "but wakes the workers");
    woken.borrow_and_update();
    h.check_ok_at(d, later());
    assert!(!woken.has_changed().unwrap(), "once per failed push");
    h.failed_at(d, later(), Reason::OutOfMemory, &"OOM");
    h.check_ok_at(d, later());
    assert!(
        woken.has_changed().unwrap(),
        "again after the next failed push"
    );
    h.ok_at(d, later());
    assert!(h.is_up(d), "a push ends it");

    // An episode only checks saw (Redis refused the connection): a check ends it.
    h.check_failed_at(d, later(), Reason::Refused, &"refused");
    h.check_ok_at(d, later());
    assert!(h.is_up(d));

    // No push failed for PIN_WINDOW (nothing left to push): a check ends it again.
    let failed = later();
    h.failed_at(d, failed, Reason::Cluster, &"MOVED");
    h.check_ok_at(d, later());
    assert!(!h.is_up(d));
    h.check_ok_at(d, failed + PIN_WINDOW + Duration::from_millis(1));
    assert!(h.is_up(d));

    // Postgres episodes are not pinned.
    let pg = Dependency::Postgres;
    h.ok_at(pg, later());
    h.failed_at(pg, later(), Reason::Unreachable, &"down");
    h.check_ok_at(pg, later());
    assert!(h.is_up(pg));
}

#[test]
fn readiness_names_each_reason() {
    let h = Health::for_table(TableName::parse("app.outbox").unwrap());
    h.ok(Dependency::Postgres);
    h.failed(
        Dependency::Redis,
        Reason::OutOfMemory,
        &"OOM command not allowed",
    );
    h.table_missing_at(Instant::now(), &"relation does not exist");
    let why = h.readiness().unwrap_err();
    assert_eq!(why.len(), 2, "{why:?}");
    assert!(why[0].starts_with("redis: out of memory (OOM"), "{why:?}");
    assert!(
        why[1].contains("app.outbox") && why[1].contains("jobrelay migrate"),
        "{why:?}"
    );
    // The reason follows the episode; the episode itself is not restarted.
    h.failed(Dependency::Redis, Reason::ReadOnly, &"READONLY");
    assert!(h.readiness().unwrap_err()[0].starts_with("redis: read-only replica"));
    h.ok(Dependency::Redis);
    h.table_present_at(later());
    assert_eq!(h.readiness(), Ok(()));
}

#[test]
fn a_full_disk_ends_with_a_write_not_with_an_answer() {
    let h = Health::default();
    let pg = Dependency::Postgres;
    h.ok(pg);
    h.failed_at(pg, later(), Reason::DiskFull, &"could not extend file");
    assert!(!h.is_up(pg));
    // The probe's reads, and batches that wrote nothing, say nothing about the disk.
    for _ in 0..3 {
        h.ok_at(pg, later());
        assert!(!h.is_up(pg));
        h.failed_at(pg, later(), Reason::DiskFull, &"could not extend file");
    }
    assert!(h.readiness().unwrap_err()[0].starts_with("postgres: disk full (could not"));
    h.wrote_at(pg, later());
    assert!(h.is_up(pg));

    // Nothing failed for lack of space for DISK_FULL_QUIET: the next answer ends it.
    let long_ago = Instant::now() - DISK_FULL_QUIET - Duration::from_secs(1);
    let h = Health::default();
    h.failed_at(pg, long_ago, Reason::DiskFull, &"could not extend file");
    h.ok_at(pg, later());
    assert!(h.is_up(pg));
}

#[test]
fn a_claim_timing_out_behind_a_lock_is_still_the_lock_wait() {
    let h = Health::default();
    let pg = Dependency::Postgres;
    h.ok(pg);
    h.failed_at(
        pg,
        later(),
        Reason::LockWait,
        &"pending_jobs locked by pid 42",
    );
    h.failed_at(pg, later(), Reason::Timeout, &"postgres claim timed out");
    let why = h.readiness().unwrap_err();
    assert_eq!(
        why[0],
        "postgres: lock wait (pending_jobs locked by pid 42)"
    );
    h.ok_at(pg, later());
    assert!(h.is_up(pg));
}

#[test]
fn liveness_fails_after_panics_in_a_row_and_recovers_with_a_batch() {
    let h = Health::default();
    h.beat();
    for _ in 0..PANIC_LIMIT - 1 {
        h.panicked("worker", "boom");
    }
    assert_eq!(h.liveness(), Ok(()));
    h.panicked("worker", "boom");
    let e = h.liveness().unwrap_err();
    assert!(e.contains("worker: boom"), "{e}");
    h.batch_completed();
    assert_eq!(h.liveness(), Ok(()));
}
