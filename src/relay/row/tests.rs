//! Unit tests of the parent module.
use sqlx::{Execute as _, Type};

use super::*;
use crate::columns::{unnest, ALL};

/// A row as a claim could return it.
fn row() -> PendingRow {
    PendingRow {
        id: 7,
        uuid: Uuid::new_v4(),
        queue: "default".into(),
        job_type: "ProcessThing".into(),
        payload: b"{}".to_vec(),
        parent_uuid: None,
        predecessor_uuid: Some(Uuid::new_v4()),
        dead_parent: false,
        run_at: Some(PgTimestamp::from_raw(1_000)),
        headers: r#"{"traceparent": "00-1"}"#.into(),
        options: r#"{"retry": false}"#.into(),
        ordering_key: None,
        created_at: PgTimestamp::from_raw(0),
        attempts: 2,
    }
}

/// The type sqlx sends for an array bound where the statement casts to `sql_type[]`.
fn bound_type(sql_type: &str) -> String {
    fn of<T: Type<Postgres>>() -> String {
        format!("{:?}", T::type_info())
    }
    match sql_type {
        "bigint" => of::<Vec<i64>>(),
        "uuid" => of::<Vec<Uuid>>(),
        "text" => of::<Vec<String>>(),
        "bytea" => of::<Vec<Vec<u8>>>(),
        "boolean" => of::<Vec<bool>>(),
        "timestamptz" => of::<Vec<PgTimestamp>>(),
        "integer" => of::<Vec<i32>>(),
        "float8" => of::<Vec<f64>>(),
        other => panic!("no Rust type for {other}[]"),
    }
}

/// The hand-back binds one array per column of the statement's `unnest`, each of the type
/// that `unnest` casts its parameter to, in the same order.
#[test]
fn row_arrays_bind_the_arrays_the_hand_back_unnests_in_its_order() {
    let sql = format!("SELECT 1 FROM {}", unnest(ALL));
    let casts: Vec<String> = sql
        .split('$')
        .skip(1)
        .map(|p| {
            let ty = p.split("::").nth(1).unwrap();
            bound_type(&ty[..ty.find("[]").unwrap()])
        })
        .collect();
    assert_eq!(casts.len(), COLUMNS.len());
    let mut arrays = RowArrays::with_capacity(1);
    arrays.push(row(), 1.5, "refused".into());
    let mut query = arrays.bind(sqlx::query(&sql));
    let arguments = format!("{:?}", query.take_arguments().unwrap().expect("arguments"));
    let types = format!("types: [{}]", casts.join(", "));
    assert!(arguments.contains(&types), "{types}\n{arguments}");
}

/// A row that becomes a job and comes back (a refused job handed back) is the row as claimed:
/// its headers' text and its timestamps as they were, not as the job holds them.
#[test]
fn a_row_made_a_job_and_rejoined_is_the_row_as_claimed() {
    let claimed = PendingRow {
        // Not as a job would print them: spaces, keys out of order.
        headers: r#"{"b": "2",  "a": "1"}"#.into(),
        options: r#"{"retry":  false, "backtrace": 3}"#.into(),
        // 9999-12-31 23:59:59.999999, the last instant a job carries.
        run_at: Some(PgTimestamp::from_raw(2_921_940 * 86_400_000_000 - 1)),
        ..row()
    };
    let (meta, job) = claimed
        .clone()
        .into_job(&mut SharedOptions::default())
        .expect("a valid row");
    assert_eq!(job.headers.len(), 2);
    assert_eq!(
        serde_json::Value::Object((*job.options).clone()),
        serde_json::json!({"retry": false, "backtrace": 3})
    );
    assert_eq!((meta.id, meta.attempts), (claimed.id, claimed.attempts));
    assert_eq!(PendingRow::rejoin(meta, job), claimed);
}

/// A row that cannot become a job comes back untouched, with the first check it fails:
/// `run_at`, `created_at`, `headers`, `options`, then `queue`, `job_type` and `uuid`.
#[test]
fn a_row_that_cannot_be_a_job_comes_back_untouched() {
    let cases = [
        (
            PendingRow {
                run_at: Some(PgTimestamp::INFINITY),
                queue: "has space".into(),
                ..row()
            },
            "run_at",
        ),
        (
            PendingRow {
                created_at: PgTimestamp::NEG_INFINITY,
                ..row()
            },
            "created_at",
        ),
        (
            PendingRow {
                headers: r#"{"a": 1}"#.into(),
                queue: String::new(),
                ..row()
            },
            "headers",
        ),
        (
            PendingRow {
                options: "[1]".into(),
                queue: String::new(),
                ..row()
            },
            "options",
        ),
        (
            PendingRow {
                queue: "has space".into(),
                uuid: Uuid::nil(),
                ..row()
            },
            "queue",
        ),
        (
            PendingRow {
                job_type: String::new(),
                ..row()
            },
            "job_type",
        ),
        (
            PendingRow {
                uuid: Uuid::nil(),
                ..row()
            },
            "uuid",
        ),
    ];
    for (claimed, field) in cases {
        let (back, e) = *claimed
            .clone()
            .into_job(&mut SharedOptions::default())
            .expect_err(field);
        assert_eq!(back, claimed, "{field}");
        assert!(
            matches!(e, Error::InvalidJob { field: f, .. } if f == field),
            "{field}: {e}"
        );
    }
}

/// The jobs of consecutive rows with the same options share one parsed object; a row with
/// other options gets its own, and rows without options the shared empty one.
#[test]
fn rows_with_the_same_options_share_them() {
    let with = |options: &str| PendingRow {
        options: options.into(),
        ..row()
    };
    let mut shared = SharedOptions::default();
    let mut job = |r: PendingRow| r.into_job(&mut shared).expect("a valid row").1;
    let a = job(with(r#"{"retry": 3}"#));
    let b = job(with(r#"{"retry": 3}"#));
    let c = job(with(r#"{"retry": 4}"#));
    let d = job(with("{}"));
    let e = job(with("{}"));
    assert!(Arc::ptr_eq(&a.options, &b.options));
    assert!(!Arc::ptr_eq(&b.options, &c.options));
    assert_eq!(c.options.get("retry"), Some(&serde_json::json!(4)));
    assert!(d.options.is_empty() && Arc::ptr_eq(&d.options, &e.options));
}
