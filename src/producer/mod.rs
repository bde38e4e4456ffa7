//! The producer side (issue 4): placeholder until written.
