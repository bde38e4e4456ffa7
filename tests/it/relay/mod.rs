//! The claim loop: what a batch claims and how it settles, concurrent workers and processes, the
//! one-shot sweep, byte and size limits, rows the relay must survive, and worker supervision.

mod claim;
mod hostile_rows;
mod limits;
mod options;
mod plans;
mod prepared;
mod settle;
mod supervision;
mod sweep;
mod workers;
