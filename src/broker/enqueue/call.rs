//! One atomic call to Redis for a chunk of jobs, in the form the layout chooses
//! ([`Layout::lpushes_messages`]):
//!
//! - a script call: the layout's script with every job's keys and message as its arguments
//!   (`EVALSHA`, loaded again on `NOSCRIPT`);
//! - a transaction: `MULTI`, one native `LPUSH` of the messages per queue list, the layout's
//!   script over the jobs' keys only (`EVAL`), `EXEC`. The script settles what the pushes did:
//!   it writes the markers of the new jobs and takes the messages of duplicates and refused
//!   jobs back out of the lists (docs/layouts/celery.md#how-the-celery-layout-pushes). A message
//!   then never passes through Lua, which copies and hashes every byte of a script argument.
//!
//! Either way the call is atomic: no other client sees the lists between the pushes and the
//! script, and a call that failed before `EXEC` ran (Redis unreachable, `READONLY` or `OOM`
//! when a command was queued, the connection lost) wrote nothing.

use std::collections::HashMap;

use redis::aio::ConnectionLike;
use redis::Value;

use crate::broker::layout::{job_keys, Layout};
use crate::error::{Error, Result};
use crate::job::Job;

/// One call being filled with jobs.
pub(super) struct Call<'a> {
    layout: &'a dyn Layout,
    namespace: &'a str,
    form: Form<'a>,
}

enum Form<'a> {
    Script(redis::ScriptInvocation<'a>),
    Transaction(Transaction),
}

/// The jobs of a transaction call: each one's marker and queue keys, and its message.
#[derive(Default)]
struct Transaction {
    ttl_ms: u64,
    /// Every job's marker key then queue key, back to back; `key_ends[2i]` and
    /// `key_ends[2i + 1]` end job i's.
    keys: String,
    key_ends: Vec<usize>,
    /// The messages back to back; `message_ends[i]` ends job i's.
    messages: Vec<u8>,
    message_ends: Vec<usize>,
    /// The script's last argument when jobs have ordering keys ([`Call::order_keys`]).
    order_keys: Option<String>,
}

impl<'a> Call<'a> {
    /// An empty call of `layout`'s form, whose script gets `namespace` and the marker TTL as
    /// `ARGV[1]` and `ARGV[2]`.
    pub(super) fn new(
        layout: &'a dyn Layout,
        script: &'a redis::Script,
        namespace: &'a str,
        ttl_ms: u64,
    ) -> Call<'a> {
        let form = if layout.lpushes_messages() {
            Form::Transaction(Transaction {
                ttl_ms,
                ..Transaction::default()
            })
        } else {
            let mut inv = script.prepare_invoke();
            inv.arg(namespace).arg(ttl_ms);
            if layout.marks_in_sets() {
                inv.key(absent_key(layout, namespace));
            }
            Form::Script(inv)
        };
        Call {
            layout,
            namespace,
            form,
        }
    }

    /// Adds `job`, whose wire encoding is `encoded`; `scratch` is a reusable buffer.
    pub(super) fn push(&mut self, job: &Job, encoded: &[u8], scratch: &mut String) {
        match &mut self.form {
            Form::Script(inv) => self
                .layout
                .push_args(inv, self.namespace, job, encoded, scratch),
            Form::Transaction(tx) => {
                let queue_at = job_keys(self.layout, self.namespace, job, &mut tx.keys);
                tx.key_ends.push(queue_at);
                tx.key_ends.push(tx.keys.len());
                tx.messages.extend_from_slice(encoded);
                tx.message_ends.push(tx.messages.len());
            }
        }
    }

    /// Gives the script each job's ordering key as a number within the call, `0` for none,
    /// space-separated, as its last argument: once a job of a key is refused, the script holds
    /// the key's later jobs of the call (prelude.lua, `read_order_keys`). Called once, after
    /// the last job, and only when a key has two jobs in the call.
    pub(super) fn order_keys(&mut self, keys: String) {
        match &mut self.form {
            Form::Script(inv) => {
                inv.arg(keys);
            }
            Form::Transaction(tx) => tx.order_keys = Some(keys),
        }
    }

    /// Sends the call: the script's answer, one element per job.
    pub(super) async fn send<C: ConnectionLike + Send>(&self, con: &mut C) -> Result<Vec<Value>> {
        match &self.form {
            Form::Script(inv) => Ok(inv.invoke_async(con).await?),
            Form::Transaction(tx) => tx.send(con, self.layout.script(), self.namespace).await,
        }
    }
}

/// The key a call of a layout whose markers are members of sets declares first and never
/// writes, `<ns><marker infix>marks:absent`: while a Redis Cluster migrates the namespace's slot,
/// a call naming a key that exists on neither node is refused (`TRYAGAIN`, `ASK` then
/// `TRYAGAIN`) before it touches anything, as the other layouts' calls are by their new jobs'
/// marker keys (docs/redis.md#cluster).
fn absent_key(layout: &dyn Layout, namespace: &str) -> String {
    format!("{namespace}{}marks:absent", layout.marker_infix())
}

impl Transaction {
    fn key(&self, k: usize) -> &str {
        let start = if k == 0 { 0 } else { self.key_ends[k - 1] };
        &self.keys[start..self.key_ends[k]]
    }

    fn message(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.message_ends[i - 1] };
        &self.messages[start..self.message_ends[i]]
    }

    async fn send<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        source: &str,
        namespace: &str,
    ) -> Result<Vec<Value>> {
        let jobs = self.message_ends.len();
        // One LPUSH per queue list, lists in the order their first job came, each list's
        // messages in job order: the script finds job i's message by that order.
        let mut lists: Vec<(&str, Vec<usize>)> = Vec::new();
        let mut list_of: HashMap<&str, usize> = HashMap::new();
        for i in 0..jobs {
            let queue = self.key(2 * i + 1);
            let l = *list_of.entry(queue).or_insert_with(|| {
                lists.push((queue, Vec::new()));
                lists.len() - 1
            });
            lists[l].1.push(i);
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (queue, members) in &lists {
            let lpush = pipe.cmd("LPUSH").arg(*queue);
            for &i in members {
                lpush.arg(self.message(i));
            }
        }
        // EVAL, not EVALSHA: a script missing from Redis' cache (a restart, a failover) would
        // fail inside EXEC after the pushes ran, leaving messages without their markers.
        let eval = pipe.cmd("EVAL").arg(source).arg(2 * jobs);
        for k in 0..2 * jobs {
            eval.arg(self.key(k));
        }
        eval.arg(namespace).arg(self.ttl_ms);
        if let Some(keys) = &self.order_keys {
            eval.arg(keys);
        }
        // EXEC's answer comes after MULTI's OK and each command's QUEUED.
        let mut reply = con.req_packed_commands(&pipe, pipe.len() + 1, 1).await?;
        let exec = match reply.pop() {
            Some(Value::Array(results)) => results,
            other => return Err(protocol(format!("EXEC answered {other:?}"))),
        };
        // The LPUSHes answer lengths, or WRONGTYPE for a list key holding another type (the
        // script refuses those jobs); the script answers last.
        match exec.into_iter().last() {
            Some(Value::Array(answer)) => Ok(answer),
            Some(Value::ServerError(e)) => Err(redis::RedisError::from(e).into()),
            other => Err(protocol(format!("the settling script answered {other:?}"))),
        }
    }
}

fn protocol(detail: String) -> Error {
    Error::Contract {
        dependency: Some(crate::error::Dependency::Redis),
        what: "unexpected reply to the enqueue transaction",
        detail,
    }
}
