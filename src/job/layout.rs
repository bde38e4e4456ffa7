//! A layout's name (`--layout`) and why a job does not fit one: the facts about layouts that
//! the rest of the crate names (errors, settings, the relay's claim) without the layouts
//! themselves.

use std::fmt;
use std::str::FromStr;

/// Which layout, as named by `--layout` / `JOBRELAY_LAYOUT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayoutKind {
    /// jobrelay's own layout (the default).
    #[default]
    Jobrelay,
    /// The layout of the Go job runner conveyor.
    Conveyor,
    /// The layout of the Ruby job runner Sidekiq (6.x, 7.x).
    Sidekiq,
    /// The layout of Celery 5 on its Redis broker (kombu's Redis transport).
    Celery,
    /// The layout of the Node.js job runner BullMQ (6.x, 5.56 on).
    Bullmq,
    /// The layout of the Python job runner RQ 2.x (JSON serializer).
    Rq,
}

impl LayoutKind {
    /// Every layout, in the order `--help` lists them.
    pub const ALL: [LayoutKind; 6] = [
        LayoutKind::Jobrelay,
        LayoutKind::Conveyor,
        LayoutKind::Sidekiq,
        LayoutKind::Celery,
        LayoutKind::Bullmq,
        LayoutKind::Rq,
    ];

    /// The name `--layout` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            LayoutKind::Jobrelay => "jobrelay",
            LayoutKind::Conveyor => "conveyor",
            LayoutKind::Sidekiq => "sidekiq",
            LayoutKind::Celery => "celery",
            LayoutKind::Bullmq => "bullmq",
            LayoutKind::Rq => "rq",
        }
    }
}

impl fmt::Display for LayoutKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LayoutKind {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        LayoutKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = LayoutKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown layout {s:?}; one of {}", names.join(", "))
            })
    }
}

/// Why a job cannot be written in a layout (its payload is not what the runner's jobs carry, it
/// names a flow the runner has none of, ...): a permanent failure, the row is dead-lettered
/// with this reason ([`crate::Error::Unfit`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unfit(pub String);

impl Unfit {
    /// A protobuf encoder's error (which a growable buffer never meets).
    pub(crate) fn marshal(e: prost::EncodeError) -> Unfit {
        Unfit(format!("cannot marshal to protobuf: {e}"))
    }
}
