//! jobrelay's own layout (docs/layouts/jobrelay.md, docs/layouts/README.md): `jobrelay.v1.Job`, keys `queue:<queue>`,
//! `scheduled`, `jobs:<parent>:children`, `jobs:<predecessor>:onComplete`,
//! `jobs:<parent>:active`, and the marker `jobs:<uuid>` holding the job.

#[cfg(feature = "daemon")]
mod consumers;
#[cfg(feature = "daemon")]
mod peek;

use prost::Message;

use super::{push_keys, write_flow_route, Layout, LayoutKind, Payload, Unfit};
use crate::job::Job;

/// The layout.
pub(super) static JOBRELAY: Jobrelay = Jobrelay;

/// See the module.
#[derive(Debug)]
pub(super) struct Jobrelay;

/// What one job adds to a script call besides its marshalled bytes, the namespace (twice) and
/// its queue name, all counted separately: an upper bound, so that a call never carries more
/// than its byte limit. The marker key `jobs:<uuid>` (41 bytes), the queue key's `queue:` (6),
/// the longest route `1|<uuid>|<uuid>|<score>` (76 plus a score of at most 24 characters), and
/// the framing of the four bulk strings, `$<len>\r\n...\r\n` (5 each plus the digits of their
/// lengths: at most 3, 3, 3 and 10): 186.
const ARGS_OVERHEAD: usize = 192;

impl Layout for Jobrelay {
    fn kind(&self) -> LayoutKind {
        LayoutKind::Jobrelay
    }

    fn name(&self) -> &'static str {
        "jobrelay"
    }

    fn payload(&self) -> Payload {
        Payload::Opaque
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
        concat!(include_str!("prelude.lua"), include_str!("jobrelay.lua"))
    }

    fn encode(&self, job: &Job, buf: &mut Vec<u8>) -> std::result::Result<(), Unfit> {
        job.to_proto().encode(buf).map_err(Unfit::marshal)
    }

    /// Two keys, the marker key and the queue key, and two arguments: the route and the
    /// marshalled job. The route is empty for the common case (nothing but the queue), which
    /// the script takes without parsing; see jobrelay.lua.
    fn push_args(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
        namespace: &str,
        job: &Job,
        encoded: &[u8],
        key: &mut String,
    ) {
        push_keys(self, inv, namespace, job, key);
        write_flow_route(job, key);
        inv.arg(&*key).arg(encoded);
    }

    fn args_overhead(&self, namespace: &str, job: &Job, _encoded_len: usize) -> usize {
        2 * namespace.len() + job.queue.len() + ARGS_OVERHEAD
    }

    fn marker_infix(&self) -> &'static str {
        "jobs:"
    }
}
