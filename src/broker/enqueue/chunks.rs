//! The jobs of one enqueue, in chunks: each job validated (unless the relay did), marshalled in
//! the layout's wire format and checked against the size limit, then added to the call being
//! filled, which is handed out once it holds [`MAX_JOBS_PER_CALL`] jobs or the next job would
//! take it over the byte limit. Lazily: a chunk is built only once the call before it was
//! answered, so a failed call leaves the jobs behind it unmarshalled (and unacknowledged).
//!
//! Jobs with an ordering key keep their key's order (docs/guarantees.md#per-key-order): once
//! a job of a key is refused before it is sent, or answered refused by an earlier call, every
//! later job of the key is [`Error::Held`], not sent; within one call the script holds them
//! (each job's key goes with the call as a number, [`Call::order_keys`], when a key has two
//! jobs in the call).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use super::call::Call;
use super::{Checks, Enqueuer, JobResult, MAX_JOBS_PER_CALL};
use crate::error::{Error, Result};
use crate::job::{Job, Options};

/// One call's worth of jobs: the call, and the indexes (into the jobs) of those it carries.
pub(super) struct Chunk<'a> {
    pub(super) call: Call<'a>,
    pub(super) sent: Vec<usize>,
}

/// The chunks of one enqueue, in order.
pub(super) struct Chunks<'a> {
    enqueuer: &'a Enqueuer,
    jobs: &'a [Job],
    checks: Checks,
    /// The jobs' indexes in the order they go out ([`dependents_first`] for a layout that
    /// keeps flows in order).
    order: std::vec::IntoIter<usize>,
    /// A job marshalled into `buf` that did not fit the chunk handed out last: the next
    /// chunk's first.
    carried: Option<(usize, usize)>,
    buf: Vec<u8>,
    /// The key and route arguments are built in this one buffer, which the invocation copies
    /// from: no `String` of its own for each key or route.
    scratch: String,
    /// The options the layout last found fit: the jobs after it that share them (a batch's
    /// rows of one job class, [`crate::relay`]) are not checked again.
    fit_options: Option<Arc<Options>>,
    /// Ordering keys a job of which was refused, with that job's uuid: their later jobs are
    /// held.
    stopped: HashMap<&'a str, uuid::Uuid>,
    /// The ordering keys in the chunk being filled, numbered from 1 in the order they came.
    keyed: HashMap<&'a str, usize>,
    /// For each job of the chunk being filled, its key's number (0: none).
    key_numbers: Vec<usize>,
}

impl<'a> Chunks<'a> {
    pub(super) fn new(enqueuer: &'a Enqueuer, jobs: &'a [Job], checks: Checks) -> Self {
        let order = if enqueuer.layout.claim_needs().flows_in_order {
            dependents_first(jobs)
        } else {
            (0..jobs.len()).collect()
        };
        Chunks {
            enqueuer,
            jobs,
            checks,
            order: order.into_iter(),
            carried: None,
            buf: Vec::new(),
            scratch: String::new(),
            fit_options: None,
            stopped: HashMap::new(),
            keyed: HashMap::new(),
            key_numbers: Vec::new(),
        }
    }

    /// [`Error::Held`] for job `i` if its key has stopped.
    fn held(&self, i: usize) -> Option<Error> {
        let job = &self.jobs[i];
        let key = job.ordering_key.as_deref()?;
        self.stopped.get(key).map(|behind| Error::Held {
            uuid: job.uuid,
            key: key.to_owned(),
            behind: *behind,
        })
    }

    /// Takes note of a call's answers: the ordering keys of its refused jobs stop.
    pub(super) fn answered(&mut self, sent: &[usize], results: &[Option<JobResult>]) {
        for &i in sent {
            if let (Some(key), Some(Err(_))) = (self.jobs[i].ordering_key.as_deref(), &results[i]) {
                self.stopped.entry(key).or_insert(self.jobs[i].uuid);
            }
        }
    }

    /// The next chunk, or `None` when every job went out or was refused. A job refused before
    /// it is sent (invalid, unfit for the layout, too large) gets its result in `results`, and
    /// so does a job held behind a refused one of its key.
    pub(super) fn next(&mut self, results: &mut [Option<JobResult>]) -> Option<Chunk<'a>> {
        let e = self.enqueuer;
        let mut chunk = Chunk {
            call: e.new_call(),
            sent: Vec::with_capacity(self.jobs.len().min(MAX_JOBS_PER_CALL)),
        };
        let mut call_bytes = 0;
        self.keyed.clear();
        self.key_numbers.clear();
        if let Some((i, size)) = self.carried.take() {
            // Carried before the last call was answered: its key may have stopped since.
            if let Some(held) = self.held(i) {
                results[i] = Some(Err(held));
            } else {
                chunk.call.push(&self.jobs[i], &self.buf, &mut self.scratch);
                self.add(&mut chunk, i);
                call_bytes = size;
            }
        }
        while let Some(i) = self.order.next() {
            let job = &self.jobs[i];
            if let Some(held) = self.held(i) {
                results[i] = Some(Err(held));
                continue;
            }
            self.buf.clear();
            let options_fit = self
                .fit_options
                .as_ref()
                .is_some_and(|fit| Arc::ptr_eq(fit, &job.options));
            if let Err(err) = e.marshal_checked(job, &mut self.buf, self.checks, options_fit) {
                results[i] = Some(Err(err));
                if let Some(key) = job.ordering_key.as_deref() {
                    self.stopped.insert(key, job.uuid);
                }
                continue;
            }
            if !options_fit && !job.options.is_empty() {
                self.fit_options = Some(Arc::clone(&job.options));
            }
            let size = self.buf.len() + e.layout.args_overhead(&e.namespace, job, self.buf.len());
            if !chunk.sent.is_empty()
                && (chunk.sent.len() == MAX_JOBS_PER_CALL || call_bytes + size > e.max_call_bytes)
            {
                self.carried = Some((i, size));
                return Some(self.finish(chunk));
            }
            chunk.call.push(job, &self.buf, &mut self.scratch);
            self.add(&mut chunk, i);
            call_bytes += size;
        }
        (!chunk.sent.is_empty()).then(|| self.finish(chunk))
    }

    /// Job `i` joins `chunk` (its call has the job's arguments): noted with its key's number.
    fn add(&mut self, chunk: &mut Chunk<'a>, i: usize) {
        chunk.sent.push(i);
        let number = match self.jobs[i].ordering_key.as_deref() {
            None => 0,
            Some(key) => {
                let next = self.keyed.len() + 1;
                *self.keyed.entry(key).or_insert(next)
            }
        };
        self.key_numbers.push(number);
    }

    /// The chunk, its call given its jobs' key numbers when a key has two jobs in it. A call
    /// whose keys are all distinct (thousands of interleaved keys: every job of a call its own
    /// key) has no job for the script to hold, and the script reads no numbers.
    fn finish(&self, mut chunk: Chunk<'a>) -> Chunk<'a> {
        let keyed_jobs = self.key_numbers.iter().filter(|&&n| n != 0).count();
        if keyed_jobs > self.keyed.len() {
            let mut numbers = String::with_capacity(self.key_numbers.len() * 4);
            for (i, n) in self.key_numbers.iter().enumerate() {
                let sep = if i > 0 { " " } else { "" };
                let _ = write!(numbers, "{sep}{n}");
            }
            chunk.call.order_keys(numbers);
        }
        chunk
    }
}

impl Enqueuer {
    /// Validates (unless `checks` says it is) and marshals `job` into `buf`, refusing one the
    /// layout cannot express (its options first, when it has any and `options_fit` does not
    /// say they were found fit already) or over the size limit.
    pub(super) fn marshal_checked(
        &self,
        job: &Job,
        buf: &mut Vec<u8>,
        checks: Checks,
        options_fit: bool,
    ) -> Result<()> {
        if checks == Checks::Validate {
            job.validate()?;
        }
        let unfit = |reason| Error::Unfit {
            uuid: job.uuid,
            layout: self.layout.name(),
            reason,
        };
        if !job.options.is_empty() && !options_fit {
            self.layout.check_options(&job.options).map_err(unfit)?;
        }
        self.layout.encode(job, buf).map_err(unfit)?;
        if buf.len() > self.max_job_bytes {
            return Err(Error::TooLarge {
                uuid: job.uuid,
                size: buf.len(),
                max: self.max_job_bytes,
            });
        }
        Ok(())
    }

    pub(super) fn new_call(&self) -> Call<'_> {
        Call::new(
            self.layout,
            &self.script,
            &self.namespace,
            self.dedup_ttl_ms,
        )
    }
}

/// Indexes of `jobs` in an order where every job comes before the job it names as its parent
/// or predecessor, when both are among `jobs` (otherwise in the order given): should the batch
/// be split over several script calls, a child never reaches Redis after its parent, which
/// could have finished meanwhile. Chains deeper than [`MAX_FLOW_DEPTH`], and cycles, keep the
/// order reached by then.
pub(super) fn dependents_first(jobs: &[Job]) -> Vec<usize> {
    use std::collections::HashMap;
    if !jobs
        .iter()
        .any(|j| j.parent_uuid.is_some() || j.predecessor_uuid.is_some())
    {
        // Nothing names anything: the order given (the common batch pays no map).
        return (0..jobs.len()).collect();
    }
    let position: HashMap<uuid::Uuid, usize> =
        jobs.iter().enumerate().map(|(i, j)| (j.uuid, i)).collect();
    let anchors: Vec<(usize, usize)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(i, j)| {
            [j.parent_uuid, j.predecessor_uuid]
                .into_iter()
                .flatten()
                .filter_map(|a| position.get(&a).copied())
                .filter(move |&a| a != i)
                .map(move |a| (i, a))
        })
        .collect();
    // level(anchor) > level(dependent); dependents first.
    let mut level = vec![0usize; jobs.len()];
    for _ in 0..MAX_FLOW_DEPTH {
        let mut changed = false;
        for &(dependent, anchor) in &anchors {
            if level[anchor] <= level[dependent] {
                level[anchor] = level[dependent] + 1;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| level[i]);
    order
}

/// How deep a chain of parents and predecessors within one batch [`dependents_first`] orders.
const MAX_FLOW_DEPTH: usize = 64;
