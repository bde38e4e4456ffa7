//! Why a job does not fit a layout: the reason a row is dead-lettered when its job cannot be
//! written in the relay's layout.

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
