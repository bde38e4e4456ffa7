//! Building a job: its fields, their defaults, and validation at the moment it is built.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::job::{Job, Options};

/// Builds a [`Job`], refusing invalid input when [`JobBuilder::build`] is called.
///
/// Only the queue and the job type are required. Defaults: a fresh random (version 4) uuid, an
/// empty payload, no parent, no predecessor, `dead_parent = false`, no `run_at` (run as soon as
/// possible), no headers.
///
/// Why version 4 and not the time-ordered version 7: rows produced in plain SQL get
/// `gen_random_uuid()` (v4), so every job's uuid looks the same whichever way it was produced;
/// the uuid is an identity and a dedup key (`jobs:<uuid>`), while order comes from the row's
/// `id` and `created_at`, and no index on `uuid` would profit from v7's locality; and a v4 uuid
/// reveals nothing (v7 carries its creation time into keys that consumers may expose).
///
/// With the `otel` feature, a `traceparent` (and `tracestate`) header is added from the current
/// OpenTelemetry context (see [`JobBuilder::build`]).
///
/// Every setter takes and returns the builder, so a job is one expression. Errors found by a
/// setter (for example a payload that cannot be serialised to JSON) are kept and reported by
/// [`JobBuilder::build`], together with the checks that need the whole job.
///
/// ```
/// use jobrelay::producer::JobBuilder;
///
/// let job = JobBuilder::new("default", "ProcessThing")
///     .json(&serde_json::json!({ "id": 1 }))
///     .delay(std::time::Duration::from_secs(30))
///     .header("tenant", "acme")
///     .build()?;
/// assert_eq!(job.payload, br#"{"id":1}"#);
/// assert!(job.run_at.is_some());
/// # Ok::<(), jobrelay::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called or it is added to `PendingJobs`"]
pub struct JobBuilder {
    queue: String,
    job_type: String,
    uuid: Option<Uuid>,
    payload: Vec<u8>,
    parent_uuid: Option<Uuid>,
    predecessor_uuid: Option<Uuid>,
    dead_parent: bool,
    run_at: Option<When>,
    headers: BTreeMap<String, String>,
    options: Options,
    ordering_key: Option<String>,
    /// The first error a setter met (field, reason); reported by `build` so that setters stay
    /// chainable.
    error: Option<(&'static str, String)>,
    /// Trace headers taken from an explicit context (`trace_context`), which win over the
    /// current context at `build`.
    #[cfg(feature = "otel")]
    trace: Option<Option<super::trace::TraceHeaders>>,
}

/// When to run: a fixed instant, or a delay counted from the moment the job is built.
#[derive(Debug, Clone, Copy)]
enum When {
    At(DateTime<Utc>),
    After(Duration),
}

impl JobBuilder {
    /// A job for `queue` (1..=128 characters of `[A-Za-z0-9_.:-]`) to be handled by
    /// `job_type` (1..=256 characters, no NUL). Both are checked by [`JobBuilder::build`].
    pub fn new(queue: impl Into<String>, job_type: impl Into<String>) -> Self {
        JobBuilder {
            queue: queue.into(),
            job_type: job_type.into(),
            uuid: None,
            payload: Vec::new(),
            parent_uuid: None,
            predecessor_uuid: None,
            dead_parent: false,
            run_at: None,
            headers: BTreeMap::new(),
            options: Options::new(),
            ordering_key: None,
            error: None,
            #[cfg(feature = "otel")]
            trace: None,
        }
    }

    /// Uses `uuid` as the job's identity instead of a generated one: useful to make a
    /// producer's retries idempotent, since Redis keeps one job per uuid (the dedup marker
    /// `jobs:<uuid>`). The nil uuid is refused.
    pub fn uuid(mut self, uuid: Uuid) -> Self {
        self.uuid = Some(uuid);
        self
    }

    /// The job's arguments as raw bytes, opaque to jobrelay. Default: empty.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = payload.into();
        self
    }

    /// The job's arguments as the JSON serialisation (UTF-8 bytes) of `value`. A value that
    /// cannot be serialised (e.g. a map with non-string keys) makes [`JobBuilder::build`] fail
    /// with [`Error::InvalidJob`] naming `payload`.
    pub fn json<T: serde::Serialize + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(bytes) => self.payload = bytes,
            Err(e) => self.fail("payload", format!("cannot serialise to JSON: {e}")),
        }
        self
    }

    /// Sidekiq's `args`, for a relay in the sidekiq layout (docs/layouts/sidekiq.md): the
    /// payload as the JSON serialisation of `args`, which must be a JSON array, as every
    /// Sidekiq job's `args` is: a slice, a `Vec`, a tuple (`&(42, "x")` gives `[42,"x"]`),
    /// `json!([...])`. Anything else, or an array that nests deeper than Sidekiq parses, makes
    /// [`JobBuilder::build`] fail with [`Error::InvalidJob`] naming `payload`; so does a value
    /// that cannot be serialised.
    ///
    /// ```
    /// use jobrelay::producer::JobBuilder;
    ///
    /// let job = JobBuilder::new("mailers", "WelcomeMailer")
    ///     .sidekiq_args(&(42, "welcome", serde_json::json!({ "locale": "de" })))
    ///     .build()?;
    /// assert_eq!(job.payload, br#"[42,"welcome",{"locale":"de"}]"#);
    ///
    /// let e = JobBuilder::new("mailers", "WelcomeMailer")
    ///     .sidekiq_args(&serde_json::json!({ "user": 42 }))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(e.to_string().contains("JSON array"), "{e}");
    /// # Ok::<(), jobrelay::Error>(())
    /// ```
    pub fn sidekiq_args<T: serde::Serialize + ?Sized>(mut self, args: &T) -> Self {
        match serde_json::to_vec(args) {
            Ok(bytes) => {
                let checked = crate::broker::layout::sidekiq_args_of(&bytes).map(|_| ());
                match checked {
                    Ok(()) => self.payload = bytes,
                    Err(reason) => self.fail("payload", reason.0),
                }
            }
            Err(e) => self.fail("payload", format!("cannot serialise to JSON: {e}")),
        }
        self
    }

    /// The arguments of a Celery task (`--layout celery`) or an RQ job (`--layout rq`): the payload
    /// `{"args": [...], "kwargs": {...}}`, the positional arguments `args` (which must serialise
    /// to a JSON array: a `Vec`, slice, array or tuple) and the keyword arguments `kwargs` (a JSON
    /// object: a map with string keys or a struct). The worker calls the task as
    /// `task(*args, **kwargs)`. Anything else makes [`JobBuilder::build`] fail with
    /// [`Error::InvalidJob`] naming `payload`. Replaces an earlier payload.
    ///
    /// ```
    /// use jobrelay::producer::JobBuilder;
    ///
    /// let job = JobBuilder::new("emails", "app.tasks.send_welcome")
    ///     .args_kwargs(&(42, "de"), &serde_json::json!({ "urgent": true }))
    ///     .build()?;
    /// assert_eq!(job.payload, br#"{"args":[42,"de"],"kwargs":{"urgent":true}}"#);
    /// # Ok::<(), jobrelay::Error>(())
    /// ```
    pub fn args_kwargs<A, K>(mut self, args: &A, kwargs: &K) -> Self
    where
        A: serde::Serialize + ?Sized,
        K: serde::Serialize + ?Sized,
    {
        let (args, kwargs) = match (serde_json::to_value(args), serde_json::to_value(kwargs)) {
            (Ok(a), Ok(k)) => (a, k),
            (Err(e), _) | (_, Err(e)) => {
                self.fail("payload", format!("cannot serialise to JSON: {e}"));
                return self;
            }
        };
        if !args.is_array() {
            self.fail(
                "payload",
                format!("celery's args must be a JSON array, not {args}"),
            );
        } else if !kwargs.is_object() {
            self.fail(
                "payload",
                format!("celery's kwargs must be a JSON object, not {kwargs}"),
            );
        } else {
            #[derive(serde::Serialize)]
            struct ArgsKwargs {
                args: serde_json::Value,
                kwargs: serde_json::Value,
            }
            match serde_json::to_vec(&ArgsKwargs { args, kwargs }) {
                Ok(bytes) => self.payload = bytes,
                Err(e) => self.fail("payload", format!("cannot serialise to JSON: {e}")),
            }
        }
        self
    }

    /// Runs the job no earlier than `at` (kept to the microsecond, Postgres's precision). A
    /// time that has already passed means "now". Must lie within 0001..=9999 (the range of a
    /// protobuf `Timestamp`). Replaces an earlier [`JobBuilder::delay`].
    pub fn run_at(mut self, at: DateTime<Utc>) -> Self {
        self.run_at = Some(When::At(at));
        self
    }

    /// Runs the job no earlier than `delay` after [`JobBuilder::build`] is called, by the
    /// producer's clock (Redis compares `run_at` with its own clock when the job is pushed).
    /// A zero delay means no `run_at`. Replaces an earlier [`JobBuilder::run_at`].
    pub fn delay(mut self, delay: Duration) -> Self {
        self.run_at = Some(When::After(delay));
        self
    }

    /// Makes this job a child of `parent`. While the parent is alive the job waits in
    /// `jobs:<parent>:children`; see [`JobBuilder::dead_parent`]. The nil uuid and the job's
    /// own uuid are refused.
    pub fn parent(mut self, parent: Uuid) -> Self {
        self.parent_uuid = Some(parent);
        self
    }

    /// Runs this job only after `predecessor` completes (it waits in
    /// `jobs:<predecessor>:onComplete`). The nil uuid and the job's own uuid are refused.
    pub fn predecessor(mut self, predecessor: Uuid) -> Self {
        self.predecessor_uuid = Some(predecessor);
        self
    }

    /// The enqueue algorithm's `deadParent` input (docs/layouts/algorithm.md#the-enqueue-algorithm): the parent has already
    /// finished, so the job is not held for it (nor for its predecessor) but registered in
    /// `jobs:<parent>:active` and queued. Default: `false`.
    pub fn dead_parent(mut self, dead: bool) -> Self {
        self.dead_parent = dead;
        self
    }

    /// Adds one header (string-to-string metadata), replacing an earlier value of `name`. A
    /// header set here wins over the trace headers added by the `otel` feature.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Adds several headers; see [`JobBuilder::header`].
    pub fn headers<K, V>(mut self, headers: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        self.headers
            .extend(headers.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Sets one of the runner's own job options, replacing an earlier value of `name`: a name
    /// and a JSON value as the runner's client takes them, e.g. `.option("retry", false)` for
    /// Sidekiq or `.option("attempts", 3)` for BullMQ (the row's `options`, docs/schema.md).
    /// The layout carries it into the runner's own field; a name it does not know, or a value
    /// of the wrong type, is a permanent failure when the job is relayed
    /// (docs/layouts/README.md#job-options).
    pub fn option(mut self, name: impl Into<String>, value: impl Into<serde_json::Value>) -> Self {
        self.options.insert(name.into(), value.into());
        self
    }

    /// Names the job's ordering key (the row's `ordering_key`, 1..=256 characters): the jobs
    /// of one key enter the runner's storage in the order their rows were written, and none
    /// overtakes an earlier one of its key that is still waiting, backing off or dead-lettered
    /// (docs/guarantees.md#per-key-order). Writing a keyed row takes a lock on its key until
    /// the transaction ends: two transactions writing the same key run one after the other.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Takes `traceparent` (and `tracestate`) from `context` rather than from the current
    /// OpenTelemetry context. With `tracing-opentelemetry`, pass
    /// `tracing::Span::current().context()`. A context without a valid span adds nothing.
    #[cfg(feature = "otel")]
    pub fn trace_context(mut self, context: &opentelemetry::Context) -> Self {
        self.trace = Some(super::trace::headers_of(context));
        self
    }

    /// Validates the job and returns it, with a uuid generated when none was given.
    ///
    /// Refused with [`Error::InvalidJob`] naming the field: `queue`, `job_type`, `uuid`,
    /// `payload`, `parent_uuid`, `predecessor_uuid`, `run_at`, `headers`, `options` or `ordering_key`. These are the
    /// checks of the table's CHECK constraints and of the enqueue algorithm, plus what Postgres
    /// would refuse later (a NUL character in a text or JSON value), so that a job that builds
    /// also inserts and relays.
    ///
    /// `created_at` is set to now; [`super::PendingJobs::create_pending`] replaces it with the
    /// row's `created_at` so that the fast path and the relay push identical bytes.
    ///
    /// With the `otel` feature, when the current OpenTelemetry context (or the one given to
    /// `trace_context`) holds a valid span and no `traceparent` header was set, the W3C
    /// `traceparent` header (and `tracestate`, when not empty) is added. The current context is
    /// thread-local: in async code, the caller's span must be attached around this call (e.g.
    /// with `opentelemetry::trace::FutureExt::with_context`).
    pub fn build(mut self) -> Result<Job> {
        if let Some((field, reason)) = self.error.take() {
            return Err(Error::invalid(field, reason));
        }
        #[cfg(feature = "otel")]
        {
            let trace = match self.trace.take() {
                Some(explicit) => explicit,
                None => super::trace::current(),
            };
            if let Some(trace) = trace {
                if !self.headers.contains_key("traceparent") {
                    self.headers.insert("traceparent".into(), trace.traceparent);
                    if let Some(state) = trace.tracestate {
                        self.headers.entry("tracestate".into()).or_insert(state);
                    }
                }
            }
        }
        let now = Utc::now().trunc_subsecs(6);
        let run_at = match self.run_at {
            None => None,
            Some(When::At(t)) => Some(t.trunc_subsecs(6)),
            Some(When::After(d)) if d.is_zero() => None,
            Some(When::After(d)) => Some(
                chrono::TimeDelta::from_std(d)
                    .ok()
                    .and_then(|d| now.checked_add_signed(d))
                    .ok_or_else(|| Error::invalid("run_at", format!("delay {d:?} is too long")))?,
            ),
        };
        let job = Job {
            uuid: self.uuid.unwrap_or_else(Uuid::new_v4),
            queue: self.queue,
            job_type: self.job_type,
            payload: self.payload,
            parent_uuid: self.parent_uuid,
            predecessor_uuid: self.predecessor_uuid,
            dead_parent: self.dead_parent,
            run_at,
            created_at: now,
            headers: self.headers,
            options: if self.options.is_empty() {
                crate::job::no_options()
            } else {
                std::sync::Arc::new(self.options)
            },
            ordering_key: self.ordering_key,
        };
        check(&job)?;
        Ok(job)
    }

    fn fail(&mut self, field: &'static str, reason: String) {
        self.error.get_or_insert((field, reason));
    }
}

/// Anything [`super::PendingJobs::add`] accepts: a [`JobBuilder`] (built on the way in) or a
/// [`Job`] (checked on the way in, as [`JobBuilder::build`] checks).
pub trait IntoJob {
    /// The validated job, or why it is refused.
    fn into_job(self) -> Result<Job>;
}

impl IntoJob for JobBuilder {
    fn into_job(self) -> Result<Job> {
        self.build()
    }
}

impl IntoJob for Job {
    /// Checks the job; `run_at` and `created_at` are kept to the microsecond.
    fn into_job(mut self) -> Result<Job> {
        self.run_at = self.run_at.map(|t| t.trunc_subsecs(6));
        self.created_at = self.created_at.trunc_subsecs(6);
        check(&self)?;
        Ok(self)
    }
}

/// The producer's checks: [`Job::validate`] plus what Postgres or a consumer would refuse.
pub(crate) fn check(job: &Job) -> Result<()> {
    // Queue, job type, uuid and the timestamps' range as docs/schema.md, 3 and 5.1 say; then what
    // Postgres refuses.
    job.validate()?;
    if job.job_type.contains('\0') {
        return Err(Error::invalid(
            "job_type",
            "must not contain a NUL character",
        ));
    }
    if job
        .ordering_key
        .as_deref()
        .is_some_and(|k| k.contains('\0'))
    {
        return Err(Error::invalid(
            "ordering_key",
            "must not contain a NUL character",
        ));
    }
    for (field, other) in [
        ("parent_uuid", job.parent_uuid),
        ("predecessor_uuid", job.predecessor_uuid),
    ] {
        match other {
            Some(u) if u.is_nil() => {
                return Err(Error::invalid(field, "must not be the nil uuid"));
            }
            Some(u) if u == job.uuid => {
                return Err(Error::invalid(
                    field,
                    format!("must differ from the job's own uuid {u}"),
                ));
            }
            _ => {}
        }
    }
    for (name, value) in &job.headers {
        if name.is_empty() {
            return Err(Error::invalid("headers", "a header name must not be empty"));
        }
        if name.contains('\0') || value.contains('\0') {
            return Err(Error::invalid(
                "headers",
                format!("header {name:?} contains a NUL character, which jsonb cannot store"),
            ));
        }
    }
    if let Some(name) = job
        .options
        .iter()
        .find(|(name, value)| name.is_empty() || name.contains('\0') || holds_nul(value))
        .map(|(name, _)| name)
    {
        return Err(Error::invalid(
            "options",
            if name.is_empty() {
                "an option name must not be empty".to_owned()
            } else {
                format!("option {name:?} contains a NUL character, which jsonb cannot store")
            },
        ));
    }
    Ok(())
}

/// Whether a string anywhere in `value` (a key or a value) holds a NUL character.
fn holds_nul(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn args_kwargs_makes_celerys_payload() {
        #[derive(serde::Serialize)]
        struct Options {
            lang: &'static str,
        }
        let job = JobBuilder::new("emails", "app.tasks.send_welcome")
            .args_kwargs(&[1.5, 2.0], &Options { lang: "de" })
            .build()
            .unwrap();
        let payload: serde_json::Value = serde_json::from_slice(&job.payload).unwrap();
        assert_eq!(
            payload,
            serde_json::json!({"args": [1.5, 2.0], "kwargs": {"lang": "de"}})
        );
        // No arguments at all: empty args and kwargs.
        let none: [u8; 0] = [];
        let job = JobBuilder::new("q", "t")
            .args_kwargs(&none, &BTreeMap::<String, i32>::new())
            .build()
            .unwrap();
        assert_eq!(job.payload, br#"{"args":[],"kwargs":{}}"#);

        for (builder, why) in [
            (
                JobBuilder::new("q", "t").args_kwargs(&42, &BTreeMap::<String, i32>::new()),
                "args must be a JSON array, not 42",
            ),
            (
                // `()` is JSON null.
                JobBuilder::new("q", "t").args_kwargs(&(), &BTreeMap::<String, i32>::new()),
                "args must be a JSON array, not null",
            ),
            (
                JobBuilder::new("q", "t").args_kwargs(&[1], &["x"]),
                "kwargs must be a JSON object, not [\"x\"]",
            ),
            (
                JobBuilder::new("q", "t").args_kwargs(&[1], &BTreeMap::from([((1, 2), 3)])),
                "cannot serialise to JSON",
            ),
        ] {
            match builder.build() {
                Err(Error::InvalidJob { field, reason }) => {
                    assert_eq!(field, "payload");
                    assert!(reason.contains(why), "{reason}");
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
