//! Operator commands: `status` and `dead-letter`.

pub mod dead_letter;
pub mod status;
