//! The job on the wire: `proto/jobrelay/v1/job.proto`, compiled by `build.rs` with protox (no
//! `protoc` needed). Every value jobrelay writes to Redis as "the marshalled job" is a
//! [`v1::Job`] in protobuf wire format.

/// Package `jobrelay.v1`.
pub mod v1 {
    #![allow(missing_docs, clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/jobrelay.v1.rs"));
}

/// Package `wire`: conveyor's job envelope (`proto/conveyor/wire.proto`), the wire format of
/// the `conveyor` layout.
pub mod wire {
    #![allow(missing_docs, clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/wire.rs"));
}
