//! The seam between the relay and where its jobs go: [`JobSink`] takes claimed jobs,
//! [`SinkProbe`] says whether the endpoint takes writes, and [`ClaimNeeds`] is what the claim
//! must do for the endpoint's runner. The relay knows only these; the broker implements them
//! for Redis (`RedisSink`, `RedisProbe`, each layout's needs) and the daemon's assembly
//! ([`crate::assembly`]) plugs one into the other. Tests plug in sinks that fail on purpose.

use std::future::Future;

use crate::error::Result;
use crate::job::Job;
use crate::job::JobResult;

/// Where claimed jobs go. The relay deletes a row only after its job's result is `Ok`.
pub trait JobSink: Send + Sync {
    /// Pushes `jobs`, returning one result per job, in order.
    ///
    /// `Err` means the push as a whole failed and nothing was acknowledged: the relay rolls the
    /// batch back and keeps every row, whatever part of the push may have landed. A transient
    /// error as one job's result ([`crate::Error::Unacknowledged`]) means that job was not
    /// acknowledged while others were: the relay deletes the acknowledged rows, keeps the
    /// others untouched, and backs off.
    ///
    /// The relay hands over valid jobs only: it validates each row once, as it becomes a job
    /// (the checks of [`Job::validate`]), and a row that fails them never reaches a sink. A
    /// sink need not check them again.
    fn push(&self, jobs: &[Job]) -> impl Future<Output = Result<Vec<JobResult>>> + Send;

    /// What the claim must do for the jobs' runner (keep flows in order, hold rows until
    /// due): the relay renders its statements for it ([`crate::relay::Queries::new`]). None
    /// by default.
    fn claim_needs(&self) -> ClaimNeeds {
        ClaimNeeds::default()
    }
}

/// What a runner needs of the claim, as the relay reads it: a small value, so that the claim's
/// statements depend on these facts and not on which runner it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClaimNeeds {
    /// A job must reach the runner no later than the job it names as its parent or
    /// predecessor (so that it never lands in the lists of a job that already finished): the
    /// claim then takes a row only once no pending row names it, and a batch goes out with
    /// such dependents first.
    pub flows_in_order: bool,
    /// A job whose `run_at` is in the future stays in the outbox until it is due (the runner
    /// has no scheduled set the relay could write it to): the claim then takes a row only
    /// once its `run_at` has passed.
    pub holds_until_due: bool,
}

impl ClaimNeeds {
    /// Every combination, for tests that render the statements for each.
    pub const ALL: [ClaimNeeds; 4] = [
        ClaimNeeds {
            flows_in_order: false,
            holds_until_due: false,
        },
        ClaimNeeds {
            flows_in_order: true,
            holds_until_due: false,
        },
        ClaimNeeds {
            flows_in_order: false,
            holds_until_due: true,
        },
        ClaimNeeds {
            flows_in_order: true,
            holds_until_due: true,
        },
    ];
}

/// Whether the sink's endpoint takes writes as the sink needs them, asked by the relay's probe
/// ([`crate::relay::probe`]) every round, for `/readyz` and `jobrelay check`.
pub trait SinkProbe: Send {
    /// One look: `Ok` with what the endpoint says of itself (a short phrase for `check`, e.g.
    /// `maxmemory-policy noeviction`), or why it does not take writes. Bounded in time by the
    /// implementation.
    fn writable(&mut self) -> impl Future<Output = Result<String>> + Send;
}
