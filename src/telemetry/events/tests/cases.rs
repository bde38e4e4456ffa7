//! The cases of `every_event_writes_its_log_lines_and_its_metrics`: each event and what it must write.

use super::*;

pub(super) fn horizon() -> Horizon {
    Horizon {
        kind: "transaction".to_owned(),
        pid: Some(4242),
        seconds: Some(61.0),
        xids: 12,
        detail: "idle in transaction".to_owned(),
        horizon: Some("731".to_owned()),
    }
}

/// A push lost as a whole: its jobs counted as transient, or as config when a configuration
/// error refused it.
pub(super) fn push_failed_cases() -> Vec<Case> {
    vec![
        case(
            "PushFailed",
            || {
                PushFailed {
                    jobs: 3,
                    error: &Error::NotWritable {
                        dependency: Dependency::Redis,
                        reason: Reason::OutOfMemory,
                        detail: "OOM".into(),
                    },
                }
                .emit()
            },
            &[],
            &[(
                "jobrelay_job_failures_total{kind=\"transient\",reason=\"out of memory\"}",
                3.0,
            )],
        ),
        case(
            "PushFailed",
            || {
                PushFailed {
                    jobs: 2,
                    error: &Error::EvictionPolicy {
                        policy: "allkeys-lru".into(),
                    },
                }
                .emit()
            },
            &[],
            &[(
                "jobrelay_job_failures_total{kind=\"config\",reason=\"eviction policy\"}",
                2.0,
            )],
        ),
        // A whole push lost to an error about a job still keeps every row: transient.
        case(
            "PushFailed",
            || {
                PushFailed {
                    jobs: 1,
                    error: &Error::Refused {
                        uuid: Uuid::nil(),
                        message: "WRONGTYPE".into(),
                    },
                }
                .emit()
            },
            &[],
            &[(
                "jobrelay_job_failures_total{kind=\"transient\",reason=\"error\"}",
                1.0,
            )],
        ),
    ]
}

/// The events of a batch.
pub(super) fn batch_cases() -> Vec<Case> {
    vec![
        case(
            "JobAnswered",
            || JobAnswered { lag_seconds: 0.5 }.emit(),
            &[],
            &[
                ("jobrelay_relay_lag_seconds_count", 1.0),
                ("jobrelay_relay_lag_seconds_sum", 0.5),
            ],
        ),
        case(
            "LateJob",
            || {
                LateJob {
                    uuid: Uuid::nil(),
                    id: 7,
                    parent: Some(Uuid::nil()),
                    predecessor: None,
                }
                .emit()
            },
            &[("WARN", "late job: its parent or predecessor had already finished; relayed as a job of its own")],
            &[("jobrelay_jobs_relayed_total{outcome=\"late\"}", 1.0)],
        ),
        case(
            "LateJobsRepaired",
            || LateJobsRepaired { jobs: 4 }.emit(),
            &[("WARN", "late jobs: their parent or predecessor closed while they were pushed; relayed as jobs of their own")],
            &[("jobrelay_jobs_relayed_total{outcome=\"late\"}", 4.0)],
        ),
        case("LateJobsRepaired, none", || LateJobsRepaired { jobs: 0 }.emit(), &[], &[]),
        case(
            "RowsDeadLettered",
            || {
                RowsDeadLettered {
                    rows: 2,
                    first: &[
                        DeadRow {
                            uuid: Uuid::nil(),
                            id: 7,
                            error: "refused 25 times",
                        },
                        DeadRow {
                            uuid: Uuid::max(),
                            id: 8,
                            error: "too large",
                        },
                    ],
                }
                .emit()
            },
            &[("WARN", "rows moved to the dead-letter table")],
            &[("jobrelay_jobs_dead_lettered_total", 2.0)],
        ),
        case(
            "OversizeRowsDeadLettered",
            || {
                OversizeRowsDeadLettered {
                    rows: 1,
                    first_id: 9,
                    first_uuid: Uuid::nil(),
                    max_job_bytes: 10,
                }
                .emit()
            },
            &[("WARN", "rows over --max-job-size moved to the dead-letter table")],
            &[("jobrelay_jobs_dead_lettered_total", 1.0)],
        ),
        case(
            "BatchCommitted",
            || {
                BatchCommitted {
                    report: &Report::default(),
                    duration: Duration::from_millis(3),
                }
                .emit()
            },
            &[("DEBUG", "batch committed")],
            &[
                ("jobrelay_batch_duration_seconds_count", 1.0),
                ("jobrelay_batch_duration_seconds_sum", 0.003),
            ],
        ),
        case(
            "BatchSettledApart",
            || {
                BatchSettledApart {
                    acknowledged: 3,
                    deleted: 3,
                    not_handed_back: 1,
                    error: &"disk full",
                    duration: Duration::from_millis(3),
                }
                .emit()
            },
            &[("DEBUG", "hand-back failed: the acknowledged rows deleted on their own, the rest left pending as they were")],
            &[
                ("jobrelay_batch_duration_seconds_count", 1.0),
                ("jobrelay_batch_duration_seconds_sum", 0.003),
            ],
        ),
    ]
}

/// The episodes of the dependencies, the table and the tasks.
pub(super) fn dependency_cases() -> Vec<Case> {
    vec![
        case(
            "DependencyConnected",
            || {
                DependencyConnected {
                    dependency: Dependency::Redis,
                }
                .emit()
            },
            &[("INFO", "redis connected")],
            &[("jobrelay_up{dependency=\"redis\"}", 1.0)],
        ),
        case(
            "DependencyDown",
            || {
                DependencyDown {
                    dependency: Dependency::Redis,
                    reason: Reason::OutOfMemory,
                    error: &"OOM command not allowed",
                    was_up: true,
                }
                .emit()
            },
            &[("WARN", "redis unavailable; retrying with backoff")],
            &[("jobrelay_up{dependency=\"redis\"}", 0.0)],
        ),
        case(
            "DependencyDown, never up",
            || {
                DependencyDown {
                    dependency: Dependency::Postgres,
                    reason: Reason::Refused,
                    error: &"connection refused",
                    was_up: false,
                }
                .emit()
            },
            &[("WARN", "postgres not reachable yet; retrying with backoff")],
            &[("jobrelay_up{dependency=\"postgres\"}", 0.0)],
        ),
        case(
            "DependencyRecovered",
            || {
                DependencyRecovered {
                    dependency: Dependency::Postgres,
                    reason: Reason::Timeout,
                    outage: Duration::from_secs(3),
                    failed_tries: 4,
                }
                .emit()
            },
            &[("INFO", "postgres recovered")],
            &[("jobrelay_up{dependency=\"postgres\"}", 1.0)],
        ),
        case(
            "OutboxTableMissing",
            || {
                OutboxTableMissing {
                    table: &TableName::default(),
                    error: &"relation does not exist",
                }
                .emit()
            },
            &[("ERROR", "outbox table pending_jobs does not exist: run `jobrelay migrate` (checking again quietly)")],
            &[],
        ),
        case(
            "OutboxTablePresent",
            || {
                OutboxTablePresent {
                    table: &TableName::default(),
                    outage: Duration::from_secs(1),
                }
                .emit()
            },
            &[("INFO", "outbox table pending_jobs present")],
            &[],
        ),
        case(
            "BatchesFailing",
            || BatchesFailing { error: &"syntax error" }.emit(),
            &[("WARN", "relay batches failing; retrying with backoff")],
            &[],
        ),
        case(
            "BatchesSucceedAgain",
            || BatchesSucceedAgain.emit(),
            &[("INFO", "relay batches succeed again")],
            &[],
        ),
        case(
            "TaskPanicked",
            || {
                TaskPanicked {
                    task: "worker",
                    message: "boom",
                    panics_in_a_row: 1,
                }
                .emit()
            },
            &[("ERROR", "relay task panicked; its batch rolled back, restarting it")],
            &[("jobrelay_task_panics_total{task=\"worker\"}", 1.0)],
        ),
    ]
}

/// The probe's samples.
pub(super) fn backlog_cases() -> Vec<Case> {
    vec![
        case(
            "BacklogSampled",
            || {
                BacklogSampled {
                    pending: 5,
                    oldest_age_seconds: 3600.0,
                    oldest_claimable_age_seconds: 2.0,
                    dead: 1,
                }
                .emit()
            },
            &[],
            &[
                ("jobrelay_pending_jobs", 5.0),
                ("jobrelay_oldest_pending_age_seconds", 3600.0),
                ("jobrelay_oldest_claimable_age_seconds", 2.0),
                ("jobrelay_dead_jobs", 1.0),
            ],
        ),
        case(
            "XminHorizonSampled",
            || {
                XminHorizonSampled {
                    age_seconds: 61.0,
                    xids: 12,
                }
                .emit()
            },
            &[],
            &[
                ("jobrelay_xmin_horizon_age_seconds", 61.0),
                ("jobrelay_xmin_horizon_age_xids", 12.0),
            ],
        ),
        case(
            "XminHorizonHeld",
            || {
                XminHorizonHeld {
                    horizon: &horizon(),
                    seconds: 61.0,
                }
                .emit()
            },
            &[("WARN", "a transaction (pid 4242) open for 61s holds the xmin horizon: no row deleted since can be vacuumed, and claims slow down as dead rows pile up; end it (pg_terminate_backend) if it should not be running")],
            &[],
        ),
        case(
            "XminHorizonMovedOn",
            || XminHorizonMovedOn { was: &horizon() }.emit(),
            &[("INFO", "the xmin horizon moved on")],
            &[],
        ),
        case(
            "HeldKeysSampled",
            || {
                HeldKeysSampled {
                    keys: 2,
                    oldest_age_seconds: 95.0,
                }
                .emit()
            },
            &[],
            &[
                ("jobrelay_held_keys", 2.0),
                ("jobrelay_held_key_oldest_age_seconds", 95.0),
            ],
        ),
        case(
            "OrderingKeyHeld",
            || OrderingKeyHeld { held: &held_keys() }.emit(),
            &[("WARN", "2 ordering keys held by a dead-lettered row (3 rows waiting, oldest for 95s): key \"order-42\", 2 rows behind dead row 1041 (00000000-0000-0000-0000-000000000007): redis refused job: WRONGTYPE; mend dead row 1041 and run `jobrelay dead-letter requeue --id 1041`, or drop it: `jobrelay dead-letter purge --id 1041` (and 1 more, listed by jobrelay status)")],
            &[],
        ),
        case(
            "OrderingKeysReleased",
            || OrderingKeysReleased.emit(),
            &[("INFO", "no ordering key is held by a dead-lettered row any more")],
            &[],
        ),
    ]
}

/// Two held keys, the first named.
fn held_keys() -> crate::admin::held_keys::HeldKeys {
    crate::admin::held_keys::HeldKeys {
        keys: 2,
        rows: 3,
        oldest_age_seconds: Some(95.0),
        first: vec![crate::admin::held_keys::HeldKey {
            ordering_key: "order-42".to_owned(),
            dead_id: 1041,
            dead_uuid: Uuid::from_u128(7),
            last_error: Some("redis refused job: WRONGTYPE".to_owned()),
            waiting: 2,
            age_seconds: 95.0,
        }],
    }
}
