//! Unit tests of the parent module.
use super::*;

fn server_error(line: &str) -> redis::RedisError {
    let reply = format!("-{line}\r\n");
    match redis::parse_redis_value(reply.as_bytes()) {
        Ok(redis::Value::ServerError(e)) => e.into(),
        other => panic!("{line:?} parsed as {other:?}"),
    }
}

#[test]
fn redis_answers_are_named_and_classified() {
    for (line, reason) in [
        (
            "READONLY You can't write against a read only replica.",
            Reason::ReadOnly,
        ),
        ("LOADING Redis is loading the dataset in memory", Reason::Loading),
        (
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            Reason::ReadOnly,
        ),
        (
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
            Reason::Unavailable,
        ),
        (
            "OOM command not allowed when used memory > 'maxmemory'.",
            Reason::OutOfMemory,
        ),
        (
            "NOREPLICAS Not enough good replicas to write.",
            Reason::ReplicasBehind,
        ),
        ("BUSY Redis is busy running a script.", Reason::Unavailable),
        ("NOAUTH Authentication required.", Reason::Authentication),
        (
            "WRONGPASS invalid username-password pair or user is disabled.",
            Reason::Authentication,
        ),
        (
            "NOPERM this user has no permissions to run the 'evalsha' command",
            Reason::PermissionDenied,
        ),
        (
            "TRYAGAIN Multiple keys request during rehashing of slot",
            Reason::Cluster,
        ),
        ("CLUSTERDOWN The cluster is down", Reason::Cluster),
        ("MOVED 3999 127.0.0.1:6381", Reason::Cluster),
        ("ASK 3999 127.0.0.1:6381", Reason::Cluster),
        (
            "CROSSSLOT Keys in request don't hash to the same slot",
            Reason::Cluster,
        ),
        (
            "ERR Script attempted to access a non local key in a cluster node script: 2d1f, on @user_script:12.",
            Reason::Cluster,
        ),
        (
            "ERR This instance has cluster support disabled",
            Reason::Cluster,
        ),
        // Redis 7.0's answer when a command inside the script is denied by the ACL.
        (
            "ERR The user executing the script can't run this command or subcommand script: 4174, on @user_script:1.",
            Reason::PermissionDenied,
        ),
        (
            "NOPERM this user has no permissions to access one of the keys used as arguments",
            Reason::PermissionDenied,
        ),
        // A sentinel's port; a proxy without scripts.
        (
            "ERR unknown command 'EVALSHA', with args beginning with: ",
            Reason::UnknownCommand,
        ),
        (
            "ERR Unknown Redis command called from script script: 6e04, on @user_script:1.",
            Reason::UnknownCommand,
        ),
        ("NOSCRIPT No matching script. Please use EVAL.", Reason::ScriptMissing),
        (
            "OOM command not allowed when used memory > 'maxmemory'. script: 96de, on @user_script:1.",
            Reason::OutOfMemory,
        ),
        (
            "READONLY You can't write against a read only replica. script: 96de, on @user_script:1.",
            Reason::ReadOnly,
        ),
        (
            "NOREPLICAS Not enough good replicas to write. script: 0a9f, on @user_script:1.",
            Reason::ReplicasBehind,
        ),
        (
            "ERR AUTH <password> called without any password configured for the default user.",
            Reason::Authentication,
        ),
        ("ERR max number of clients reached", Reason::Unavailable),
    ] {
        let e = Error::Redis(server_error(line));
        assert_eq!(e.reason(), reason, "{line}");
        assert_eq!(e.class(), ErrorClass::Transient, "{line}");
    }
}

/// Redis's answers about the request itself name no dependency state.
#[test]
fn redis_answers_about_the_request_are_other() {
    for line in [
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        "ERR Error running script (call to f_x): @user_script:1: user_script:1: bad argument",
        "ERR Protocol error: invalid bulk length",
    ] {
        let e = Error::Redis(server_error(line));
        assert_eq!(e.reason(), Reason::Other, "{line}");
    }
}

#[test]
fn broken_connections_are_told_from_timeouts() {
    use std::io::{Error as Io, ErrorKind};
    for kind in [
        ErrorKind::BrokenPipe,
        ErrorKind::ConnectionReset,
        ErrorKind::UnexpectedEof,
        ErrorKind::NotConnected,
    ] {
        let e = redis::RedisError::from(Io::from(kind));
        assert_eq!(redis_reason(&e), Reason::Unreachable, "{kind:?}");
    }
    let refused = redis::RedisError::from(Io::from(ErrorKind::ConnectionRefused));
    assert_eq!(redis_reason(&refused), Reason::Refused);
    let auth = redis::RedisError::from((
        redis::ErrorKind::AuthenticationFailed,
        "Password authentication failed",
    ));
    assert_eq!(redis_reason(&auth), Reason::Authentication);
    let no_primary = redis::RedisError::from((
        redis::ErrorKind::MasterNameNotFoundBySentinel,
        "Master with given name not found in sentinel",
    ));
    assert_eq!(redis_reason(&no_primary), Reason::Unreachable);
    let timeout = redis::RedisError::from(Io::from(ErrorKind::TimedOut));
    assert_eq!(redis_reason(&timeout), Reason::Timeout);
    // A timeout names its dependency as a fact, whatever the words of `what`.
    for dependency in [Dependency::Redis, Dependency::Postgres] {
        let t = Error::Timeout {
            dependency,
            what: "push",
            after: Duration::from_secs(1),
        };
        assert_eq!(
            (t.reason(), t.dependency()),
            (Reason::Timeout, Some(dependency))
        );
    }
}

#[test]
fn an_evicting_policy_is_redis_misconfigured_and_replicas_behind_an_outage() {
    let e = Error::EvictionPolicy {
        policy: "allkeys-lru".into(),
    };
    assert_eq!(
        (e.class(), e.reason(), e.dependency()),
        (
            ErrorClass::Config,
            Reason::EvictionPolicy,
            Some(Dependency::Redis)
        )
    );
    assert!(e.class().keeps_rows());
    let line = e.to_string();
    assert!(
        line.contains("allkeys-lru") && line.contains("noeviction") && !line.contains('\n'),
        "{line}"
    );
    let e = Error::ReplicasBehind {
        wanted: 2,
        acknowledged: 1,
        within: Duration::from_secs(1),
    };
    assert_eq!(
        (e.class(), e.reason(), e.dependency()),
        (
            ErrorClass::Transient,
            Reason::ReplicasBehind,
            Some(Dependency::Redis)
        )
    );
    assert_eq!(e.reason().as_str(), "replicas behind");
}

#[test]
fn jobs_at_fault_are_not_outages() {
    let e = Error::TooLarge {
        uuid: uuid::Uuid::nil(),
        size: 10,
        max: 5,
    };
    assert_eq!(e.class(), ErrorClass::Permanent);
    assert_eq!(e.dependency(), None);
    assert_eq!(e.reason(), Reason::Other);
}

#[test]
fn reason_all_lists_every_reason_once() {
    // A new variant fails to compile here until it is given a place in `Reason::ALL`.
    let place = |r: Reason| match r {
        Reason::Unreachable => 0,
        Reason::Refused => 1,
        Reason::Timeout => 2,
        Reason::OutOfMemory => 3,
        Reason::DiskFull => 4,
        Reason::LockWait => 5,
        Reason::ReadOnly => 6,
        Reason::Authentication => 7,
        Reason::PermissionDenied => 8,
        Reason::TableMissing => 9,
        Reason::Loading => 10,
        Reason::TooManyConnections => 11,
        Reason::Cluster => 12,
        Reason::UnknownCommand => 13,
        Reason::ScriptMissing => 14,
        Reason::ReplicasBehind => 15,
        Reason::EvictionPolicy => 16,
        Reason::Unavailable => 17,
        Reason::Other => 18,
    };
    for (i, r) in Reason::ALL.into_iter().enumerate() {
        assert_eq!(place(r), i, "{r}");
    }
    let names: std::collections::HashSet<_> = Reason::ALL.map(Reason::as_str).into();
    assert_eq!(names.len(), Reason::ALL.len());
}

/// A broken contract is the batch's failure, not an outage's, and names whose answer broke it.
#[test]
fn a_broken_contract_is_transient_and_names_its_dependency() {
    for dependency in [None, Some(Dependency::Redis)] {
        let e = Error::Contract {
            dependency,
            what: "enqueue script answered the wrong number of results",
            detail: "2 results for 3 jobs".into(),
        };
        assert_eq!(e.class(), ErrorClass::Transient);
        assert_eq!(e.reason(), Reason::Other);
        assert_eq!(e.dependency(), dependency);
        assert_eq!(
            e.to_string(),
            "enqueue script answered the wrong number of results: 2 results for 3 jobs"
        );
    }
}

/// What only an operator's change fixes is a configuration error of its own class, labelled
/// `config`; its rows are kept as an outage's are.
#[test]
fn configuration_errors_are_a_class_of_their_own() {
    use sqlx::migrate::MigrateError;
    let not_an_outbox = Error::NotAnOutbox(UnfitOutbox {
        outbox: "orders".into(),
        table: "orders".into(),
        problems: vec!["missing columns uuid uuid".into()],
    });
    let history = Error::Migrate(MigrateError::VersionMissing(99));
    for e in [&not_an_outbox, &history] {
        assert_eq!(e.class(), ErrorClass::Config, "{e}");
    }
    // Postgres failing the migration's statements is an outage, not a configuration.
    let failed = Error::Migrate(MigrateError::Execute(sqlx::Error::PoolTimedOut));
    assert_eq!(failed.class(), ErrorClass::Transient);
    assert_eq!(ErrorClass::Config.as_str(), "config");
    let labels: std::collections::HashSet<_> = ErrorClass::ALL.map(ErrorClass::as_str).into();
    assert_eq!(labels.len(), ErrorClass::ALL.len());
    let kept: Vec<_> = ErrorClass::ALL
        .into_iter()
        .filter(|c| c.keeps_rows())
        .collect();
    assert_eq!(kept, [ErrorClass::Transient, ErrorClass::Config]);
}

#[test]
fn classes_and_reasons_index_their_place_in_all() {
    for (i, c) in ErrorClass::ALL.iter().enumerate() {
        assert_eq!(c.index(), i, "{c:?}");
    }
    for (i, r) in Reason::ALL.iter().enumerate() {
        assert_eq!(r.index(), i, "{r:?}");
    }
}

/// Issue 34's wordings: a line that names the dependency and the reason says the dependency
/// once; a connection closed before the server answered is said in words (sqlx read no byte
/// and reports the zero: `unexpected response from SSLRequest: 0x00`); a connection attempt the
/// backoff put off keeps the last attempt's reason and says when the next one is due.
#[test]
fn postgres_errors_say_the_dependency_once_and_in_words() {
    use super::{postgres_message, without_dependency};
    let closed = sqlx::Error::Protocol(
        "unexpected response from SSLRequest: 0x00 (sqlx_postgres::connection::tls:95)".into(),
    );
    let e = Error::Database(closed);
    assert_eq!(e.reason(), Reason::Unreachable);
    assert_eq!(
        e.to_string(),
        "postgres: the connection was closed before the server answered (a proxy with no \
         server behind it, or a server going down)"
    );
    let other = sqlx::Error::Protocol("unexpected response from SSLRequest: 0x45".into());
    assert!(postgres_message(&other).contains("not Postgres's"));
    assert_eq!(
        without_dependency("postgres: postgres probe timed out after 5s"),
        "probe timed out after 5s"
    );
    assert_eq!(without_dependency("redis: OOM"), "OOM");
    let put_off = Error::ConnectBackoff {
        reason: Reason::TooManyConnections,
        message: "sorry, too many clients already".into(),
        retry_in: Duration::from_micros(1_234_567),
    };
    assert_eq!(put_off.reason(), Reason::TooManyConnections);
    assert_eq!(put_off.class(), ErrorClass::Transient);
    assert_eq!(put_off.dependency(), Some(Dependency::Postgres));
    assert_eq!(
        put_off.to_string(),
        "postgres: sorry, too many clients already (next connection attempt in 1s 234ms)"
    );
}
