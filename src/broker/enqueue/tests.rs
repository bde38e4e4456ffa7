use super::chunks::dependents_first;
use super::*;
use chrono::Utc;
use std::collections::BTreeMap;

fn job(n: u128, parent: Option<u128>, pred: Option<u128>) -> Job {
    Job {
        uuid: uuid::Uuid::from_u128(n),
        queue: "q".into(),
        job_type: "T".into(),
        payload: Vec::new(),
        parent_uuid: parent.map(uuid::Uuid::from_u128),
        predecessor_uuid: pred.map(uuid::Uuid::from_u128),
        dead_parent: false,
        run_at: None,
        created_at: Utc::now(),
        headers: BTreeMap::new(),
        options: Default::default(),
        ordering_key: None,
    }
}

#[test]
fn dependents_go_before_the_jobs_they_name() {
    // 1 is the parent of 2 and the predecessor of 3; 4 is the heir of child 2; 5 stands
    // alone; 6 names a job that is not in the batch; 7 names itself.
    let jobs = [
        job(1, None, None),
        job(2, Some(1), None),
        job(3, None, Some(1)),
        job(4, None, Some(2)),
        job(5, None, None),
        job(6, Some(99), None),
        job(7, Some(7), None),
    ];
    let order = dependents_first(&jobs);
    let pos = |n: usize| order.iter().position(|&i| i == n - 1).unwrap();
    assert!(pos(2) < pos(1) && pos(3) < pos(1), "{order:?}");
    assert!(pos(4) < pos(2), "{order:?}");
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..jobs.len()).collect::<Vec<_>>(), "a permutation");
    // Unrelated jobs keep their order.
    assert!(pos(5) < pos(6) && pos(6) < pos(7), "{order:?}");
}

/// Answers the first script call with `queued` for each of its jobs, and never the next.
struct FirstCallOnly {
    calls: usize,
}

impl ConnectionLike for FirstCallOnly {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        self.calls += 1;
        let first = self.calls == 1;
        // EVALSHA <sha> 0 <namespace> <ttl> then 4 arguments per job.
        let jobs = (cmd.args_iter().count() - 5) / 4;
        Box::pin(async move {
            if first {
                Ok(Value::Array(vec![Value::Int(1); jobs]))
            } else {
                std::future::pending().await
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a redis::Pipeline,
        _: usize,
        _: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        unreachable!("no pipelines")
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[tokio::test(start_paused = true)]
async fn calls_answered_before_the_deadline_keep_their_outcomes() {
    let jobs: Vec<Job> = (0..MAX_JOBS_PER_CALL as u128 + 10)
        .map(|n| job(n + 1, None, None))
        .collect();
    let enqueuer = Enqueuer::new("t:", Duration::from_secs(60));
    let timeout = Duration::from_secs(5);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut con = FirstCallOnly { calls: 0 };
    let results = enqueuer
        .enqueue_batch_until(&mut con, &jobs, Some((deadline, timeout)))
        .await
        .expect("the first call was answered");
    assert_eq!(con.calls, 2);
    let queued = results
        .iter()
        .filter(|r| matches!(r, Ok(Outcome::Queued)))
        .count();
    assert_eq!(queued, MAX_JOBS_PER_CALL);
    for r in &results[MAX_JOBS_PER_CALL..] {
        assert!(
            matches!(r, Err(Error::Unacknowledged { reason, .. }) if *reason == crate::error::Reason::Timeout),
            "{r:?}"
        );
    }

    // The producer's bound, `timeout` from now, is the same per-call deadline.
    let mut con = FirstCallOnly { calls: 0 };
    let results = enqueuer
        .enqueue_batch_within(&mut con, &jobs, timeout)
        .await
        .expect("the first call was answered");
    let queued = results
        .iter()
        .filter(|r| matches!(r, Ok(Outcome::Queued)))
        .count();
    assert_eq!(
        queued, MAX_JOBS_PER_CALL,
        "answered calls keep their outcomes"
    );

    // A first call unanswered by the deadline fails the whole push.
    let mut con = FirstCallOnly { calls: 1 };
    let deadline = tokio::time::Instant::now() + timeout;
    let e = enqueuer
        .enqueue_batch_until(&mut con, &jobs, Some((deadline, timeout)))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
}

#[test]
fn a_cycle_still_yields_every_job_once() {
    let jobs = [job(1, Some(2), None), job(2, Some(1), None)];
    let mut order = dependents_first(&jobs);
    order.sort_unstable();
    assert_eq!(order, [0, 1]);
}
