//! The layout of [conveyor](https://github.com/jpoz/conveyor), a Go job runner with chained
//! jobs (docs/layouts/conveyor.md).
//!
//! - Wire format: conveyor's `wire.Job` (`proto/conveyor/wire.proto`), fields 1-7, encoded
//!   canonically (fields in number order, defaults left out), byte for byte what Go's
//!   `proto.Marshal` writes for the same message: conveyor finds jobs by their bytes.
//! - Keys (`--namespace` is a raw prefix: `conv:` is conveyor's namespace `conv`):
//!   `<ns>queue:<queue>`, `<ns>scheduled` (score: whole epoch seconds),
//!   `<ns>job:<parent>:children`, `<ns>job:<parent>:active`, `<ns>job:<pred>:onComplete`,
//!   in the branch order of conveyor's `AddJob`. The relay never writes `<ns>job:<uuid>`,
//!   the record conveyor keeps of a running job.
//! - The dedup marker: `<ns>jobrelay:job:<uuid>`, a key conveyor never touches. It holds where
//!   the job went and its bytes, so that a later child can tell whether its parent is still
//!   waiting somewhere or has finished (conveyor.lua).
//! - Late children: a child or heir whose parent or predecessor jobrelay relayed and which has
//!   finished since goes out as a job of its own, `parent_uuid` and `predecessor_uuid` cleared
//!   ([`crate::Outcome::Late`]): in its parent's lists nobody would ever run it, and conveyor's
//!   close of a child fails when its parent's record is gone.

#[cfg(feature = "daemon")]
mod consumers;
#[cfg(feature = "daemon")]
mod peek;

use std::fmt::Write as _;

use prost::Message;
use uuid::Uuid;

use super::{push_keys, write_flow_route, ClaimNeeds, Layout, LayoutKind, Payload, Unfit};
use crate::job::{timestamp, Job};
use crate::proto::wire;

/// The layout.
pub(super) static CONVEYOR: Conveyor = Conveyor;

/// See the module.
#[derive(Debug)]
pub(super) struct Conveyor;

/// The marker key's infix: `<ns>jobrelay:job:<uuid>`.
const MARKER_INFIX: &str = "jobrelay:job:";

/// What one job adds to a script call besides its encoding (and, for a child or an heir, its
/// encoding without parent and predecessor), the namespace (twice) and its queue name: the
/// marker key's infix and uuid (49), `queue:` (6), the longest route `1|<uuid>|<uuid>|<exact
/// score>|<whole score>` (76 plus at most 24 and 21), the framing of five bulk strings (5 each
/// plus the digits of their lengths, at most 10 each): 251.
const ARGS_OVERHEAD: usize = 256;

impl Conveyor {
    fn message(job: &Job, anchored: bool) -> wire::Job {
        let s = |u: Option<Uuid>| u.map(|u| u.hyphenated().to_string()).unwrap_or_default();
        wire::Job {
            uuid: job.uuid.hyphenated().to_string(),
            r#type: job.job_type.clone(),
            queue: job.queue.clone(),
            payload: job.payload.clone(),
            run_at: job.run_at.map(timestamp),
            parent_uuid: if anchored {
                s(job.parent_uuid)
            } else {
                String::new()
            },
            predecessor_uuid: if anchored {
                s(job.predecessor_uuid)
            } else {
                String::new()
            },
            ..wire::Job::default()
        }
    }
}

impl Layout for Conveyor {
    fn kind(&self) -> LayoutKind {
        LayoutKind::Conveyor
    }

    fn name(&self) -> &'static str {
        "conveyor"
    }

    fn claim_needs(&self) -> ClaimNeeds {
        ClaimNeeds {
            flows_in_order: true,
            holds_until_due: false,
        }
    }

    fn payload(&self) -> Payload {
        Payload::Opaque
    }

    fn check_namespace(&self, namespace: &str) -> std::result::Result<(), String> {
        // Conveyor joins its namespace to every key with ':' and never has an empty one
        // (its default is "conv"): another prefix cannot reach a conveyor worker.
        if namespace.ends_with(':') {
            return Ok(());
        }
        Err(format!(
            "{namespace:?} cannot match a conveyor worker: with --layout conveyor, give \
             conveyor's namespace followed by ':' (conveyor's default namespace is \
             \"conv\": --namespace conv:)"
        ))
    }

    #[cfg(feature = "daemon")]
    fn peek(&self) -> &dyn super::peek::Peek {
        self
    }

    #[cfg(feature = "daemon")]
    fn consumers(&self) -> &dyn super::consumers::Consumers {
        self
    }

    fn script(&self) -> &'static str {
        concat!(include_str!("prelude.lua"), include_str!("conveyor.lua"))
    }

    fn encode(&self, job: &Job, buf: &mut Vec<u8>) -> std::result::Result<(), Unfit> {
        Conveyor::message(job, true)
            .encode(buf)
            .map_err(Unfit::marshal)
    }

    /// Two keys, the marker key and the queue key, and three arguments: the route, the job's
    /// bytes, and for a child or an heir its bytes as a job of its own (parent and predecessor
    /// cleared), used if it turns out late; `""` otherwise. The route is empty for a job with no parent, no
    /// predecessor and no `run_at`; otherwise `<dead_parent 1/0>|<parent>|<predecessor>|<run_at
    /// exact seconds>|<run_at whole seconds>` (conveyor scores whole seconds, and compares the
    /// exact instant with now).
    fn push_args(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
        namespace: &str,
        job: &Job,
        encoded: &[u8],
        key: &mut String,
    ) {
        push_keys(self, inv, namespace, job, key);
        let anchored = job.parent_uuid.is_some() || job.predecessor_uuid.is_some();
        if write_flow_route(job, key) {
            // And the run_at's whole seconds (conveyor's own score).
            let _ = write!(
                key,
                "|{}",
                job.run_at
                    .map(|t| t.timestamp().to_string())
                    .unwrap_or_default()
            );
        }
        inv.arg(&*key).arg(encoded);
        if anchored {
            let alone = Conveyor::message(job, false).encode_to_vec();
            inv.arg(alone);
        } else {
            inv.arg("");
        }
    }

    fn args_overhead(&self, namespace: &str, job: &Job, encoded_len: usize) -> usize {
        let alone = if job.parent_uuid.is_some() || job.predecessor_uuid.is_some() {
            encoded_len
        } else {
            0
        };
        2 * namespace.len() + job.queue.len() + ARGS_OVERHEAD + alone
    }

    fn marker_infix(&self) -> &'static str {
        MARKER_INFIX
    }

    /// Sets free the children and heirs that a close of their parent (predecessor) stranded
    /// by racing their push: see conveyor_repair.lua.
    fn repair_script(&self) -> Option<&'static str> {
        Some(concat!(
            include_str!("prelude.lua"),
            include_str!("conveyor_repair.lua")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_job;
    use super::*;
    use chrono::DateTime;
    use std::collections::BTreeMap;

    fn job() -> Job {
        Job {
            headers: BTreeMap::from([("traceparent".to_owned(), "00-ab".to_owned())]),
            ..test_job(
                "billing.ChargeCard",
                "billing.ChargeCard",
                &[0x08, 0x96, 0x01],
            )
        }
    }

    /// The bytes Go's `proto.Marshal` writes for the same `wire.Job`, spelled out from the
    /// protobuf encoding rules it follows: fields in number order, each `tag, length, bytes`
    /// (tag = number << 3 | 2 for strings, bytes and messages), fields at their default left
    /// out, a set Timestamp written even when empty, inside it seconds (1) and nanos (2) as
    /// varints when not 0. Headers and `created_at` have no field in `wire.Job`.
    #[test]
    fn encodes_what_go_writes() {
        let uuid = b"6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7";
        let name = b"billing.ChargeCard";
        let mut want = vec![0x0a, 36];
        want.extend_from_slice(uuid);
        want.extend_from_slice(&[0x12, 18]);
        want.extend_from_slice(name);
        want.extend_from_slice(&[0x1a, 18]);
        want.extend_from_slice(name);
        want.extend_from_slice(&[0x22, 3, 0x08, 0x96, 0x01]);
        let mut got = Vec::new();
        CONVEYOR.encode(&job(), &mut got).unwrap();
        assert_eq!(got, want, "plain job");

        // run_at 2023-11-14T22:13:20.5Z: seconds 1700000000 = varint 80 e2 cf aa 06,
        // nanos 500000000 = varint 80 ca b5 ee 01; then parent (6) and predecessor (7).
        let mut j = job();
        j.run_at = Some(DateTime::from_timestamp(1_700_000_000, 500_000_000).unwrap());
        j.parent_uuid = Some(j.uuid);
        j.predecessor_uuid = Some(j.uuid);
        let mut want_more = want.clone();
        want_more.extend_from_slice(&[0x2a, 12, 0x08, 0x80, 0xe2, 0xcf, 0xaa, 0x06]);
        want_more.extend_from_slice(&[0x10, 0x80, 0xca, 0xb5, 0xee, 0x01]);
        want_more.extend_from_slice(&[0x32, 36]);
        want_more.extend_from_slice(uuid);
        want_more.extend_from_slice(&[0x3a, 36]);
        want_more.extend_from_slice(uuid);
        got.clear();
        CONVEYOR.encode(&j, &mut got).unwrap();
        assert_eq!(got, want_more, "job with run_at, parent and predecessor");

        // The epoch itself: a set Timestamp with both fields 0 is `2a 00`.
        j.run_at = Some(DateTime::from_timestamp(0, 0).unwrap());
        j.parent_uuid = None;
        j.predecessor_uuid = None;
        let mut want_epoch = want.clone();
        want_epoch.extend_from_slice(&[0x2a, 0]);
        got.clear();
        CONVEYOR.encode(&j, &mut got).unwrap();
        assert_eq!(got, want_epoch, "run_at at the epoch");
    }

    #[test]
    fn keys() {
        let u = job().uuid;
        assert_eq!(
            CONVEYOR.marker_key("conv:", u),
            "conv:jobrelay:job:6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7"
        );
        assert_eq!(CONVEYOR.queue_key("conv:", "a.B"), "conv:queue:a.B");
    }
}
