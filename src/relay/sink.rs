//! The seam between the claim loop and Redis: [`JobSink`]. The Redis implementation is
//! [`crate::broker::redis_sink::RedisSink`]; tests plug in sinks that fail on purpose.

use std::future::Future;

use crate::error::Result;
use crate::job::layout::LayoutKind;
use crate::job::Job;
use crate::job::JobResult;

/// Where claimed jobs go. The relay deletes a row only after its job's result is `Ok`.
///
/// The Redis implementation is [`crate::broker::redis_sink::RedisSink`]; tests plug in sinks that
/// fail on purpose.
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

    /// The Redis layout the jobs go out in: the claim keeps flows in order for the layouts that
    /// need it ([`super::Queries::for_layout`]).
    fn layout(&self) -> LayoutKind {
        LayoutKind::Jobrelay
    }
}
